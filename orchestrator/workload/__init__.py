"""Training workloads: one LLM training iteration described as data, and what it costs.

``spec.py`` reads and validates the description a user writes (``workloads/*.yaml``: the
model, its tensor/pipeline/data/expert-parallel layout, the batch, the GPU) into a typed
:class:`~orchestrator.workload.spec.WorkloadSpec`; ``costs.py`` derives the per-iteration
quantities from it (FLOPs and compute seconds per GPU, bytes of each communication kind,
parameters per pipeline stage), each formula with its source. Pure: no emulation, no files
but the one read; later layers compile a spec into the workers' programs and a forecast.
"""

# costs registers the limits a parsed workload must meet (spec.LIMITS): importing it here
# makes them part of every parse, whichever module of the package is imported first.
from orchestrator.workload import costs as _costs  # noqa: F401
