"""What one training iteration of a :class:`~orchestrator.workload.spec.WorkloadSpec` costs:
FLOPs and compute seconds per GPU, bytes of each communication kind, parameters held.

Notation: b micro-batch (sequences), s sequence length, h hidden size, f FFN width, f_e an
expert's FFN width, V vocabulary, E routed experts, k experts per token (top-k), m weight
matrices per MLP (2 for GPT's GeLU MLP, 3 for a gated SwiGLU one). A multiply-add is 2 FLOPs.

FLOPs, one layer's forward pass on one micro-batch (Narayanan et al., "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", SC'21, Sec. 5.1 and App. A):

- attention: the Q, K, V and output projections 4 x 2bsh^2 = 8bsh^2, the scores QK^T and
  their product with V 2 x 2bs^2h = 4bs^2h (Megatron counts the full s x s matrix, causal
  masking or not, and so do we);
- MLP: m x 2bshf (4bshf for m = 2: with f = 4h, the paper's 16bsh^2);
- MoE MLP: each token passes k routed experts and the shared ones, (k + shared) x m x 2bsh
  f_e, plus the router's 2bshE (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, Sec. 2.1.2);
  routing is taken as balanced, so an expert-parallel rank computes for as many tokens as it
  sends (what the auxiliary-loss-free balancing aims at, Sec. 2.1.2);
- the output layer (logits) 2bshV, on the last pipeline stage;
- everything divided by tp: tensor parallelism splits every matrix product evenly
  (Shoeybi et al. 2019, Megatron-LM, Sec. 3).

The backward pass costs twice the forward (a gradient for the inputs and one for the
weights); full activation recomputation adds one more forward (Narayanan et al. Sec. 3.5;
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022,
Sec. 4). With f = 4h, recomputation and the logits, an iteration's FLOPs over all GPUs are
the paper's 96Bslh^2 (1 + s/6h + V/16lh) exactly (the tests check it).

Bytes (dtype_bytes per element):

- tensor parallel: each layer all-reduces its b x s x h output twice in the forward pass
  (after attention, after the MLP) and twice in the backward pass (Shoeybi et al. Sec. 3,
  the f and g operators). With sequence parallelism the pair becomes a reduce-scatter and an
  all-gather of the same buffer, which move the same bytes (Korthikanti et al. Sec. 4.2.2);
- expert parallel: each MoE layer's dispatch and combine are all-to-alls whose send buffer
  holds each token once per routed expert, b x s x k x h, split over the tp ranks (each
  sends its share of the sequence, as Megatron-Core's token dispatcher does with sequence
  parallelism), twice forward and twice backward;
- pipeline parallel: a stage sends the b x s x h activation to the next stage per
  micro-batch, and its gradient back; each tp rank sends 1/tp of it (the scatter/gather
  optimisation, Narayanan et al. Sec. 4.1);
- data parallel: once per iteration, each GPU all-reduces the gradients of the parameters
  it holds: the non-expert ones over the dp ranks of its stage, the expert ones over the
  dp / ep ranks that hold the same experts (expert data parallelism), each in buckets of
  ``bucket_bytes`` (PyTorch DDP's ``bucket_cap_mb``), one all-reduce a bucket.

Parameters (weights only: biases, layer norms and position embeddings are under 0.1 % of
any model here): attention 4h^2, an MLP m x hf, an MoE layer 4h^2 + hE (router) + (shared +
E / ep) x m x hf_e, the input embedding Vh on the first stage and an untied output layer Vh
on the last; all divided by tp. GPT-3 175B (96 layers, h 12288, f 49152, V 50257) comes to
175.2e9 by this count. DeepSeek-V3 (SwiGLU, m = 3) comes to 672.1e9 total (+0.2 % of the
report's 671B) and 38.7e9 activated (+4.5 % of its 37B): its attention is MLA (multi-head
latent attention: low-rank compressed queries and keys/values), 187.1M weights a layer
against MHA's 4h^2 = 205.5M, and counting it as MHA accounts for 0.2 and 3.0 points of
those; the rest of the activated gap (1.5 %) is the report's rounding and whatever it leaves
out of "activated" (the tests hold both figures).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from orchestrator.workload.spec import (
    DEFAULT_BUCKET,
    LIMITS,
    ModelSpec,
    WorkloadSpec,
    _WorkloadReader,
)
from topologies.errors import WorkloadError

#: At most this many buckets in one stage's gradient exchange. Each bucket is an
#: all-reduce of its own in the iteration's program (and in the forecast), so the program
#: grows with their number: ``bucket: 1`` on a few MB of gradients made millions of them,
#: and validating the experiment ran out of memory. Real jobs use tens to a few hundred
#: (PyTorch DDP's 25 MiB default: 214 a stage for GPT-3 175B on a pod, tp 8 x pp 8).
MAX_BUCKETS = 1024
#: At most this many micro-batch passes through a layer (micro-batches per data-parallel
#: rank x layers) in one iteration: each is a few slots of the program, whose building,
#: checking and forecast grow with them (1,024 micro-batches of gpt3-like's 8 layers:
#: 2.7 s and 230 MB to forecast; GPT-3 175B on a pod, 16 x 96 = 1,536).
MAX_LAYER_PASSES = 16384
#: Longest compute step (half a layer's pass on one micro-batch) a replay may sleep, in
#: emulated seconds. The presets' longest is 1.2 s (deepseek-like at 0.6e-4); a step of
#: minutes means an iteration of hours (or a FLOP/s figure off by a unit), as a "real-world
#: latency" above 1 ms does for the links (topologies/spec.py).
MAX_STEP_SECONDS = 60.0

# --- FLOPs -------------------------------------------------------------------------------


def _attention_flops(model: ModelSpec, b: int) -> float:
    s, h = model.seq_len, model.hidden
    return 8.0 * b * s * h * h + 4.0 * b * s * s * h


def _mlp_flops(model: ModelSpec, layer: int, b: int) -> float:
    tokens, h = b * model.seq_len, model.hidden
    per_matrix = 2.0 * tokens * h  # FLOPs per output column of one h x width product
    if not model.is_moe_layer(layer):
        return model.mlp_matrices * per_matrix * model.ffn_hidden
    experts = model.top_k + model.shared_experts
    router = per_matrix * model.experts
    return experts * model.mlp_matrices * per_matrix * model.expert_ffn_hidden + router


def _layer_flops(model: ModelSpec, layer: int, b: int) -> float:
    """One layer's forward over ``b`` sequences, unsplit."""
    return _attention_flops(model, b) + _mlp_flops(model, layer, b)


def forward_flops(spec: WorkloadSpec, layer: int) -> float:
    """FLOPs of one GPU for layer ``layer``'s forward pass on one micro-batch."""
    return _layer_flops(spec.model, layer, spec.batch.micro_batch) / spec.parallel.tp


def backward_flops(spec: WorkloadSpec, layer: int) -> float:
    """Twice the forward; three times with full recomputation (its forward comes again)."""
    return forward_flops(spec, layer) * (3 if spec.recompute else 2)


def logits_flops(spec: WorkloadSpec) -> float:
    """The output layer's forward on one micro-batch, per GPU of the last stage."""
    model = spec.model
    return (
        2.0
        * spec.batch.micro_batch
        * model.seq_len
        * model.hidden
        * model.vocab
        / (spec.parallel.tp)
    )


def stage_flops(spec: WorkloadSpec, stage: int) -> float:
    """FLOPs one GPU of pipeline stage ``stage`` computes in an iteration: every
    micro-batch's forward and backward through its layers, and the logits' (forward and
    twice for the backward, never recomputed) on the last stage."""
    layers = sum(forward_flops(spec, i) + backward_flops(spec, i) for i in spec.layers_of(stage))
    if stage == spec.parallel.pp - 1:
        layers += 3 * logits_flops(spec)
    return spec.micro_batches * layers


def compute_seconds(spec: WorkloadSpec, flops: float) -> float:
    """Real seconds a GPU takes for ``flops`` of matrix work at the spec's efficiency."""
    return flops / (spec.gpu.peak_flops * spec.gpu.efficiency)


def longest_step_seconds(spec: WorkloadSpec) -> float:
    """Real seconds of the iteration's longest compute step: the program splits each
    layer's pass on one micro-batch in two halves (iteration.py), and the longest is a
    backward's, the last stage's last layer with the logits' backward if it holds them."""
    longest = 0.0
    for stage in range(spec.parallel.pp):
        for layer in spec.layers_of(stage):
            flops = backward_flops(spec, layer)
            if stage == spec.parallel.pp - 1 and layer == spec.model.layers - 1:
                flops += 2.0 * logits_flops(spec)
            longest = max(longest, flops / 2)
    return compute_seconds(spec, longest)


def compute_problem(spec: WorkloadSpec, scale: float) -> str:
    """Why the iteration's compute cannot be replayed at emulation ``scale`` ("" if it
    can): its longest step lasts more than :data:`MAX_STEP_SECONDS` emulated."""
    emulated = longest_step_seconds(spec) / scale
    if emulated <= MAX_STEP_SECONDS:
        return ""
    return (
        f"the longest compute step, half a layer's backward on one micro-batch, would take "
        f"{emulated:.3g} s emulated at scale {scale:g}, above the {MAX_STEP_SECONDS:g} s a "
        f"replay allows: gpu.peak_flops ({spec.gpu.peak_flops:.3g} FLOP/s) x gpu.efficiency "
        f"({spec.gpu.efficiency:g}) is too slow for this model, or the scale too small"
    )


def model_flops_per_iteration(spec: WorkloadSpec) -> float:
    """The model FLOPs of one iteration, over all GPUs, for model FLOPs utilization (MFU):
    forward and backward of every layer and the logits for the global batch, *without*
    recomputation (what the model needs, not what the GPUs did: Chowdhery et al., "PaLM",
    2022, App. B; Korthikanti et al. 2022, Sec. 6). For a dense model it is 6 x tokens x
    the weights a token passes through (the input embedding is a look-up and not counted)
    plus the attention scores' 12 x layers x s x h per token; MFU is this over the
    iteration's seconds and the GPUs' peak."""
    model = spec.model
    b = spec.batch.micro_batch
    forward = sum(_layer_flops(model, i, b) for i in range(model.layers))
    forward += 2.0 * b * model.seq_len * model.hidden * model.vocab
    return 3 * forward * (spec.batch.global_batch // b)


# --- bytes -------------------------------------------------------------------------------


def _activation_elements(spec: WorkloadSpec) -> int:
    return spec.batch.micro_batch * spec.model.seq_len * spec.model.hidden


def tp_allreduce_bytes(spec: WorkloadSpec) -> int:
    """One tensor-parallel all-reduce: a layer's b x s x h output (4 a layer, fwd + bwd)."""
    return _activation_elements(spec) * spec.dtype_bytes


def ep_alltoall_bytes(spec: WorkloadSpec) -> int:
    """One GPU's send buffer of one expert-parallel dispatch (or combine): every token once
    per routed expert, its share of them (1/tp)."""
    elements = _activation_elements(spec) * spec.model.top_k
    return elements * spec.dtype_bytes // spec.parallel.tp


def pp_bytes(spec: WorkloadSpec) -> int:
    """One GPU's send of one micro-batch across one stage boundary, in one direction."""
    return _activation_elements(spec) * spec.dtype_bytes // spec.parallel.tp


def bucket_sizes(total: int, bucket: int) -> list[int]:
    """``total`` bytes of gradients in buckets of at most ``bucket`` (the last one holding
    the rest), as the iteration all-reduces them."""
    full, rest = divmod(total, bucket)
    return [bucket] * full + ([rest] if rest > 0 else [])


def bucket_count(total: int, bucket: int) -> int:
    """How many buckets :func:`bucket_sizes` makes, without making them."""
    return -(-total // bucket)


# --- parameters ---------------------------------------------------------------------------


class Parameters(NamedTuple):
    """Parameters of one GPU: those every dp rank of its stage holds alike (``dense``:
    attention, dense MLPs, router, shared experts, embeddings), and its routed experts'."""

    dense: int
    expert: int

    @property
    def total(self) -> int:
        return self.dense + self.expert


def _layer_parameters(model: ModelSpec, layer: int, ep: int) -> Parameters:
    """One layer's weights on one expert-parallel rank, unsplit by tp."""
    h = model.hidden
    attention = 4 * h * h
    if not model.is_moe_layer(layer):
        return Parameters(attention + model.mlp_matrices * h * model.ffn_hidden, 0)
    expert = model.mlp_matrices * h * model.expert_ffn_hidden
    dense = attention + h * model.experts + model.shared_experts * expert
    return Parameters(dense, model.experts // ep * expert)


def _stage_parameters(spec: WorkloadSpec, stage: int) -> Parameters:
    model, tp = spec.model, spec.parallel.tp
    dense = expert = 0
    for layer in spec.layers_of(stage):
        held = _layer_parameters(model, layer, spec.parallel.ep)
        dense += held.dense
        expert += held.expert
    embeddings = (stage == 0) + (stage == spec.parallel.pp - 1)
    dense += embeddings * model.vocab * model.hidden
    return Parameters(dense // tp, expert // tp)


def stage_parameters(spec: WorkloadSpec, stage: int) -> int:
    """Parameters one GPU of pipeline stage ``stage`` holds."""
    return _stage_parameters(spec, stage).total


def dp_gradient_bytes(spec: WorkloadSpec, stage: int) -> Parameters:
    """Bytes one GPU of ``stage`` all-reduces per iteration: ``dense``, its non-expert
    gradients, over the dp group; ``expert``, its experts', over the dp / ep ranks holding
    the same experts. Either is 0 when its group is one rank (nothing to reduce)."""
    held = _stage_parameters(spec, stage)
    dp, ep = spec.parallel.dp, spec.parallel.ep
    return Parameters(
        held.dense * spec.dtype_bytes if dp > 1 else 0,
        held.expert * spec.dtype_bytes if dp // ep > 1 else 0,
    )


@dataclass(frozen=True)
class ModelParameters:
    """A whole model's parameters (unsplit): all of them, and those one token uses."""

    total: int
    activated: int


def model_parameters(model: ModelSpec) -> ModelParameters:
    """All weights, and the activated ones: what one token passes through (its k routed
    experts of each MoE layer, the embedding and output layers included, as DeepSeek-V3's
    "37B activated" counts)."""
    total = activated = 2 * model.vocab * model.hidden
    for layer in range(model.layers):
        held = _layer_parameters(model, layer, 1)
        total += held.total
        activated += held.dense
        if model.is_moe_layer(layer):
            activated += model.top_k * held.expert // model.experts
    return ModelParameters(total, activated)


# --- an iteration's communication ----------------------------------------------------------


@dataclass(frozen=True)
class Communication:
    """``count`` operations of ``kind`` (``bytes_each``: one GPU's buffer) among ``group``
    ranks, in one iteration of one GPU of a stage; ``last_bytes``, when not 0, the last
    one's buffer, smaller than the others (the gradient exchange's last bucket)."""

    kind: str  # tp-allreduce, ep-alltoall, pp-send-forward, pp-send-backward, dp-..., edp-...
    group: int
    count: int
    bytes_each: int
    last_bytes: int = 0

    @property
    def total(self) -> int:
        if self.last_bytes:
            return (self.count - 1) * self.bytes_each + self.last_bytes
        return self.count * self.bytes_each

    @classmethod
    def buckets(cls, kind: str, group: int, total: int, bucket: int) -> Communication:
        """A gradient exchange of ``total`` bytes in buckets of ``bucket``."""
        sizes = bucket_sizes(total, bucket)
        last = sizes[-1] if len(sizes) > 1 and sizes[-1] != sizes[0] else 0
        return cls(kind, group, len(sizes), sizes[0], last)


def stage_communication(spec: WorkloadSpec, stage: int) -> list[Communication]:
    """Every communication kind a GPU of ``stage`` takes part in during one iteration;
    kinds whose group is one rank (nothing moves) are left out."""
    p, mbs = spec.parallel, spec.micro_batches
    layers = spec.layers_of(stage)
    moe_layers = sum(spec.model.is_moe_layer(i) for i in layers)
    out = []
    if p.tp > 1:
        out.append(
            Communication("tp-allreduce", p.tp, 4 * len(layers) * mbs, tp_allreduce_bytes(spec))
        )
    if p.ep > 1 and moe_layers:
        out.append(
            Communication("ep-alltoall", p.ep, 4 * moe_layers * mbs, ep_alltoall_bytes(spec))
        )
    if stage < p.pp - 1:
        out.append(Communication("pp-send-forward", 2, mbs, pp_bytes(spec)))
    if stage > 0:
        out.append(Communication("pp-send-backward", 2, mbs, pp_bytes(spec)))
    gradients = dp_gradient_bytes(spec, stage)
    if gradients.dense:
        out.append(Communication.buckets("dp-allreduce", p.dp, gradients.dense, spec.bucket_bytes))
    if gradients.expert:
        out.append(
            Communication.buckets(
                "edp-allreduce", p.dp // p.ep, gradients.expert, spec.bucket_bytes
            )
        )
    return out


# --- the limits a workload must meet (registered in spec.LIMITS) ---------------------------


def _check_size(
    read: _WorkloadReader, spec: WorkloadSpec, doc: Mapping[str, Any], scale: float | None
) -> None:
    """At most ``MAX_LAYER_PASSES`` micro-batch passes through a layer: the program
    has a few slots for each, so its cost to build, check and forecast grows with them."""
    passes = spec.micro_batches * spec.model.layers
    if passes > MAX_LAYER_PASSES:
        most = MAX_LAYER_PASSES // spec.model.layers * spec.batch.micro_batch
        read.fail(
            "batch.global_batch",
            f"at most {most * spec.parallel.dp} sequences here",
            spec.batch.global_batch,
            detail=f"{spec.micro_batches} micro-batches a data-parallel rank x "
            f"{spec.model.layers} layers = {passes} layer passes, above the "
            f"{MAX_LAYER_PASSES} an iteration's program allows",
        )


def _check_buckets(
    read: _WorkloadReader, spec: WorkloadSpec, doc: Mapping[str, Any], scale: float | None
) -> None:
    """At most ``MAX_BUCKETS`` buckets in any stage's gradient exchange: each is an
    all-reduce of its own in the program, whose size (and the cost of validating,
    compiling and forecasting it) grows with their number."""
    raw = doc.get("bucket", DEFAULT_BUCKET)
    stage = max(range(spec.parallel.pp), key=lambda s: sum(dp_gradient_bytes(spec, s)))
    worst = sum(dp_gradient_bytes(spec, stage))
    if bucket_count(worst, spec.bucket_bytes) > MAX_BUCKETS:
        least = bucket_count(worst, MAX_BUCKETS)
        read.fail(
            "bucket",
            f"a bucket of at least {least} B ({least / 2**10:.1f} KiB)",
            raw,
            detail=f"stage {stage}'s {worst} B of gradients in at most {MAX_BUCKETS} "
            "buckets: each bucket is an all-reduce of its own in the iteration's program",
        )


def check_compute(spec: WorkloadSpec, scale: float, source: str) -> None:
    """WorkloadError naming ``gpu`` if a compute step of the iteration at emulation
    ``scale`` is longer than a replay allows (``MAX_STEP_SECONDS``)."""
    problem = compute_problem(spec, scale)
    if problem:
        raise WorkloadError(
            source,
            "gpu",
            f"compute steps of at most {MAX_STEP_SECONDS:g} s emulated",
            detail=problem,
        )


def _check_compute(
    read: _WorkloadReader, spec: WorkloadSpec, doc: Mapping[str, Any], scale: float | None
) -> None:
    if scale is not None:
        check_compute(spec, scale, read.source)


LIMITS.extend((_check_size, _check_buckets, _check_compute))
