"""A training workload's iteration replayed on a fabric that is up: the workers run the
iteration's program (orchestrator/workload/iteration.py), computing where the GPUs would
(sleeping the emulated compute time) and moving and verifying the real bytes of every
tensor-, expert-, pipeline- and data-parallel transfer on the emulated links.

What it reports, per timed iteration: the iteration time, emulated and at real speed (x
the emulation scale: compute is stretched by 1/scale exactly as the links are slowed, so
the ratio of compute to communication is the real one); tokens per second and model
FLOPs utilization at real speed (orchestrator/workload/costs.py defines the model FLOPs);
#wrong over every sub-collective; each rank's time in compute alone (the floor no
iteration can beat: a check on the replay itself); and the iteration's timeline, per rank
and slot (orchestrator/workload/timeline.py), with the exposed communication per kind on
the rank that ends last, the forecast's definition (orchestrator/forecast/program.py).

``astral run`` replays an experiment's ``workload:`` once per policy (Runner); the
:func:`replay` function does it on a testbed directly (tests, benchmarks/workloads.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import fmean
from typing import Any

from orchestrator.collectives.plans import Layout
from orchestrator.collectives.program import Compute, GroupCollective, PointToPoint, Program
from orchestrator.forecast.program import ProgramForecast
from orchestrator.results.store import PLOTS, read_workload
from orchestrator.testbed.testbed import Testbed
from orchestrator.worker.outcome import CollectiveResult, IterationResult, RunResult
from orchestrator.worker.spec import CollectiveTest, LaunchOptions
from orchestrator.workload import costs
from orchestrator.workload.iteration import iteration_program
from orchestrator.workload.spec import WorkloadSpec
from orchestrator.workload.timeline import (
    KINDS,
    SlotSpan,
    Timeline,
    exposure,
    kind_of,
    last_rank,
    measured_timeline,
)
from topologies.errors import ExperimentError


@dataclass(frozen=True)
class ReplayResult:
    """A replay's timed iterations (see the module docstring)."""

    spec: WorkloadSpec
    program: Program
    scale: float
    iterations: tuple[IterationResult, ...]
    layout: Layout | None = None  # the ranks' servers (needed for the timeline)

    @classmethod
    def of(
        cls,
        spec: WorkloadSpec,
        program: Program,
        scale: float,
        layout: Layout,
        test: CollectiveResult,
    ) -> ReplayResult:
        return cls(spec, program, scale, tuple(test.timed()), layout)

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
        return model_flops_utilization(self.spec, self.real_s)

    @property
    def wrong(self) -> int:
        return sum(max(r.wrong, 0) for it in self.iterations for r in it.ranks.values())

    def compute_s(self, rank: int) -> float:
        """Emulated seconds rank ``rank`` computes in one iteration (its floor)."""
        return self.program.compute_of(rank)

    @property
    def floor_s(self) -> float:
        return max(self.compute_s(rank) for rank in range(self.spec.gpus))

    def timeline(self, iteration: IterationResult) -> Timeline:
        """One timed iteration's slots per rank, seconds from its first step."""
        if self.layout is None:
            raise ValueError("a replay without its layout has no timeline")
        phases = {
            rank: [(p.phase, p.step, p.start, p.end) for p in r.phases]
            for rank, r in iteration.ranks.items()
        }
        return measured_timeline(self.program, self.layout, phases)

    def exposed(self) -> dict[str, float]:
        """Emulated seconds of exposed communication per kind on the rank that ends last,
        the mean over the timed iterations."""
        per_iteration = []
        for iteration in self.iterations:
            timeline = self.timeline(iteration)
            per_iteration.append(exposure(timeline[last_rank(timeline)]))
        return {k: fmean(e.get(k, 0.0) for e in per_iteration) for k in KINDS}


def model_flops_utilization(spec: WorkloadSpec, real_s: float) -> float:
    """Model FLOPs per iteration / (GPUs x peak FLOP/s x real iteration time)."""
    peak = spec.gpus * spec.gpu.peak_flops
    return costs.model_flops_per_iteration(spec) / (peak * real_s)


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
    options = replay_options(LaunchOptions(), program, warmup, iterations, testbed.nic_ports)
    with testbed.launch(None, options, [BALANCED_OVER]) as launcher:
        result: RunResult = launcher.run([CollectiveTest.of_program(program)])
        layout = launcher.layout
    result.raise_for_failure()
    (test,) = result.tests
    return ReplayResult.of(spec, program, testbed.scale, layout, test)


#: the collective a replay's connections are balanced over NIC ports for: a program's
#: pairs are many collectives', all-to-all's are every pair
BALANCED_OVER = ("all-to-all", "direct")


def replay_options(
    base: LaunchOptions, program: Program, warmup: int, iterations: int, channels: int
) -> LaunchOptions:
    """``base`` for a replay: exactly ``iterations`` timed ones (an iteration is long; no
    batch lengthening), each from a barrier (the forecast's iteration starts every rank
    together; back to back, a rank that ends early would start the next one early and
    its wait would land in that one's timeline), and a step deadline that a step's
    compute cannot reach (a slot computing for minutes is not hung)."""
    longest = max(
        (
            seconds
            for slot in program.slots
            for op in slot.ops
            if isinstance(op, Compute)
            for _, seconds in op.seconds
        ),
        default=0.0,
    )
    return replace(
        base,
        warmup=warmup,
        iterations=iterations,
        max_iterations=iterations,
        timed_batch=1,
        channels=channels,
        step_deadline=base.step_deadline + longest,
    )


# --- what a run prints and keeps ----------------------------------------------------------------


def timeline_record(timeline: Timeline) -> dict[str, list[list[Any]]]:
    """A timeline as JSON: rank -> [[slot, start, end, compute, kind], ...] (emulated s)."""
    return {
        str(rank): [
            [s.slot, round(s.start, 6), round(s.end, 6), round(s.compute, 6), s.kind] for s in spans
        ]
        for rank, spans in sorted(timeline.items())
    }


def slot_ops(program: Program) -> list[list[list[Any]]]:
    """Each slot's data-moving ops as ``[kind, [ranks]]`` (what ``astral diagnose`` needs
    to tell which connections a slot that ran behind its forecast was waiting on)."""
    return [
        [
            [kind_of(op.name), list(op.group)]
            for op in (o.collective() if isinstance(o, PointToPoint) else o for o in slot.ops)
            if isinstance(op, GroupCollective)
        ]
        for slot in program.slots
    ]


def replay_record(result: ReplayResult, forecast: ProgramForecast | None) -> dict[str, Any]:
    """One policy's replay for ``workload.json``: its figures (emulated seconds, and at
    real speed), the last timed iteration's timeline, and the forecast's beside them."""
    last = result.iterations[-1]
    record: dict[str, Any] = {
        "iterations": len(result.iterations),
        "iteration_s": result.iteration_s,
        "real_ms": result.real_s * 1e3,
        "floor_s": result.floor_s,
        "tokens_per_s": result.tokens_per_s,
        "mfu": result.mfu,
        "wrong": result.wrong,
        "exposed_s": result.exposed(),
        "timeline": timeline_record(result.timeline(last)),
        # epoch seconds of the timeline's zero (its first step's start): where the
        # diagnosis finds a slot's window among the connections' samples
        "timeline_origin": min(p.start for r in last.ranks.values() for p in r.phases),
    }
    if forecast is not None:
        real_s = forecast.seconds * result.scale
        record["forecast"] = {
            "iteration_s": forecast.seconds,
            "real_ms": real_s * 1e3,
            "tokens_per_s": result.spec.batch.global_batch * result.spec.model.seq_len / real_s,
            "mfu": model_flops_utilization(result.spec, real_s),
            "exposed_s": {k: forecast.exposed[forecast.last_rank].get(k, 0.0) for k in KINDS},
            "error": (forecast.seconds - result.iteration_s) / result.iteration_s,
            "timeline": timeline_record(forecast.timeline),
        }
    return record


def replay_table(workload: str, records: Mapping[str, Mapping[str, Any]], scale: float) -> str:
    """The replays side by side, one row per policy (each a :func:`replay_record`):
    iteration time at real speed (and emulated), the forecast and its error, tokens/s and
    MFU at real speed, and the exposed communication per kind on the last rank, replayed
    and forecast (ms at real speed), #wrong."""
    head = (
        f"{'policy':<14}{'iteration ms':>13}{'(emulated s)':>13}{'forecast ms':>12}"
        f"{'error':>8}{'tokens/s':>11}{'MFU':>7}"
        + "".join(f"{k + ' ms':>13}" for k in KINDS)
        + f"{'#wrong':>7}"
    )
    lines = [
        f"# workload {workload!r}: one training iteration replayed per policy; real speed = "
        f"emulated x scale ({scale:g}); exposed communication (not hidden by compute) per "
        "kind on the rank that ends last, replayed/forecast",
        "# " + head,
    ]
    to_ms = scale * 1e3
    for policy, record in records.items():
        forecast = record.get("forecast")
        predicted, error = "-", "-"
        if forecast is not None:
            predicted = f"{forecast['real_ms']:.3f}"
            error = f"{forecast['error']:+.1%}"
        exposed = record["exposed_s"]
        planned = forecast["exposed_s"] if forecast is not None else {}
        cells = "".join(
            f"{exposed[k] * to_ms:>7.3f}/"
            + (f"{planned[k] * to_ms:<5.3f}" if k in planned else f"{'-':<5}")
            for k in KINDS
        )
        lines.append(
            f"  {policy:<14}{record['real_ms']:>13.3f}{record['iteration_s']:>13.2f}"
            f"{predicted:>12}{error:>8}{record['tokens_per_s']:>11.0f}{record['mfu']:>7.1%}"
            f"{cells}{record['wrong']:>7}"
        )
    return "\n".join(lines)


def timeline_of(record: Mapping[str, list[list[Any]]]) -> Timeline:
    """A timeline read back from its :func:`timeline_record`."""
    return {
        int(rank): [
            SlotSpan(int(a), float(b), float(c), float(d), str(e)) for a, b, c, d, e in rows
        ]
        for rank, rows in record.items()
    }


def workload_report(bundle: Path, *, plots: bool = True) -> tuple[list[str], list[Path]]:
    """A workload bundle's table and (``plots``) Gantts again, from its workload.json:
    ``astral report`` on a replay. Nothing when the bundle replayed no workload."""
    from orchestrator.run.replay_plot import workload_gantt

    document = read_workload(bundle)
    if document is None:
        return [], []
    name, scale, records = document["workload"], document["scale"], document["policies"]
    lines = replay_table(name, records, scale).splitlines()
    files = []
    if plots:
        for policy, record in records.items():
            forecast = record.get("forecast")
            files.append(
                workload_gantt(
                    bundle / PLOTS / f"workload-{policy}.png",
                    name,
                    policy,
                    scale,
                    timeline_of(record["timeline"]),
                    timeline_of(forecast["timeline"]) if forecast else None,
                )
            )
    return lines, files


def compare_workloads(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    a_policy: str | None = None,
    b_policy: str | None = None,
) -> tuple[str, int]:
    """Two bundles' replays side by side (``astral compare`` on workload bundles): per
    policy both hold (or the one named on each side), the iteration time at real speed,
    B/A, tokens/s and MFU, and the exposed communication per kind (ms at real speed).
    Returns the text and the number of policy pairs set side by side.

    Iteration time is the figure compared, at real speed: two bundles at different
    emulation scales still compare; a comparison of two different workloads says so in
    its header rather than refusing (a what-if on the model is a question users ask)."""
    a_records, b_records = a["policies"], b["policies"]
    pairs: list[tuple[str, str]]
    if a_policy or b_policy:
        pairs = [(a_policy or b_policy or "", b_policy or a_policy or "")]
    else:
        pairs = [(p, p) for p in a_records if p in b_records]
    pairs = [(pa, pb) for pa, pb in pairs if pa in a_records and pb in b_records]
    same = a["workload"] == b["workload"]
    lines = [
        f"# workload {a['workload']!r} (A) vs {b['workload']!r} (B)"
        + ("" if same else ": two different workloads")
        + "; one iteration, ms at real speed; B/A < 1: B is faster; exposed communication "
        "per kind on the rank that ends last, A -> B",
        "# "
        + f"{'policy A -> B':<26}{'A ms':>10}{'B ms':>10}{'B/A':>8}{'tokens/s B/A':>14}"
        + f"{'MFU A -> B':>16}"
        + "".join(f"{k + ' ms':>16}" for k in KINDS)
        + f"{'#wrong':>8}",
    ]
    to_ms_a, to_ms_b = a["scale"] * 1e3, b["scale"] * 1e3
    for pa, pb in pairs:
        ra, rb = a_records[pa], b_records[pb]
        exposed = "".join(
            f"{ra['exposed_s'].get(k, 0.0) * to_ms_a:>7.3f}->"
            f"{rb['exposed_s'].get(k, 0.0) * to_ms_b:<7.3f}"
            for k in KINDS
        )
        lines.append(
            f"  {pa + ' -> ' + pb:<26}{ra['real_ms']:>10.3f}{rb['real_ms']:>10.3f}"
            f"{rb['real_ms'] / ra['real_ms']:>8.3f}"
            f"{rb['tokens_per_s'] / ra['tokens_per_s']:>14.3f}"
            f"{ra['mfu']:>8.1%} -> {rb['mfu']:<5.1%}{exposed}"
            f"{ra['wrong'] + rb['wrong']:>8}"
        )
    return "\n".join(lines) + "\n", len(pairs)
