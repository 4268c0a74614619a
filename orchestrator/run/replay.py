"""A training workload's iteration replayed on a fabric that is up: the workers run the
iteration's program (orchestrator/workload/iteration.py), computing where the GPUs would
(sleeping the emulated compute time) and moving and verifying the real bytes of every
tensor-, expert-, pipeline- and data-parallel transfer on the emulated links.

What it reports, per timed iteration: the iteration time, emulated and at real speed (x
the emulation scale: compute is stretched by 1/scale exactly as the links are slowed, so
the ratio of compute to communication is the real one); tokens per second and model
FLOPs utilization at real speed (orchestrator/workload/costs.py defines the model FLOPs);
#wrong over every sub-collective; and each rank's time in compute alone (the floor no
iteration can beat: a check on the replay itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from orchestrator.collectives.program import Compute, Program
from orchestrator.testbed.testbed import Testbed
from orchestrator.worker.outcome import IterationResult, RunResult
from orchestrator.worker.spec import CollectiveTest, LaunchOptions
from orchestrator.workload import costs
from orchestrator.workload.iteration import iteration_program
from orchestrator.workload.spec import WorkloadSpec
from topologies.errors import ExperimentError


@dataclass(frozen=True)
class ReplayResult:
    """A replay's timed iterations (see the module docstring)."""

    spec: WorkloadSpec
    program: Program
    scale: float
    iterations: tuple[IterationResult, ...]

    @property
    def iteration_s(self) -> float:
        """Emulated seconds per iteration: the last rank's end, mean over timed ones."""
        return fmean(max(r.time_us for r in it.ranks.values()) / 1e6 for it in self.iterations)

    @property
    def real_s(self) -> float:
        return self.iteration_s * self.scale

    @property
    def tokens_per_s(self) -> float:
        """Tokens one iteration trains, per second of real time."""
        spec = self.spec
        return spec.batch.global_batch * spec.model.seq_len / self.real_s

    @property
    def mfu(self) -> float:
        """Model FLOPs per iteration / (GPUs x peak FLOP/s x real iteration time)."""
        spec = self.spec
        peak = spec.gpus * spec.gpu.peak_flops
        return costs.model_flops_per_iteration(spec) / (peak * self.real_s)

    @property
    def wrong(self) -> int:
        return sum(max(r.wrong, 0) for it in self.iterations for r in it.ranks.values())

    def compute_s(self, rank: int) -> float:
        """Emulated seconds rank ``rank`` computes in one iteration (its floor)."""
        return sum(
            op.of(rank) for slot in self.program.slots for op in slot.ops if isinstance(op, Compute)
        )


def replay(
    testbed: Testbed, spec: WorkloadSpec, *, warmup: int = 1, iterations: int = 1
) -> ReplayResult:
    """Run ``iterations`` timed iterations (after ``warmup``) of ``spec`` on every GPU of
    ``testbed``'s fabric in rank order. The workload must use exactly the fabric's GPUs."""
    gpus = testbed.workers(None)
    if len(gpus) != spec.gpus:
        raise ExperimentError(
            None,
            "parallel",
            f"a layout of the fabric's {len(gpus)} GPUs (tp x pp x dp)",
            f"{spec.gpus} GPUs",
        )
    program = iteration_program(spec, testbed.scale)
    options = LaunchOptions(
        warmup=warmup,
        iterations=iterations,
        max_iterations=iterations,
        channels=testbed.nic_ports,
    )
    with testbed.launch(None, options, [("all-to-all", "direct")]) as launcher:
        result: RunResult = launcher.run([CollectiveTest.of_program(program)])
    result.raise_for_failure()
    (test,) = result.tests
    return ReplayResult(spec, program, testbed.scale, tuple(test.timed()))
