"""Programs on a real emulated astral-small (orchestrator/collectives/program.py): the shape
of a training iteration (tensor-parallel all-reduces in every server while computing,
data-parallel all-reduces on both rails while computing, an all-to-all beside a pipeline
send) verifies on all 8 ranks, a corrupted region is caught, every rank's timeline shows
its compute and its transfers, and a step lasts the longer of its compute and its
transfers, not their sum.

One fabric for the module (the ``astral_fabric`` fixture); each test is one launch of the
workers through the testbed, as ``FabricHandle.run`` launches them, with every fabric pair's
source port balanced over the NIC ports (those of an all-to-all: the program's pairs are
among them).
"""

from __future__ import annotations

from statistics import fmean

import pytest

from orchestrator.collectives.program import Compute, PointToPoint, Program, Slot
from orchestrator.pytest_plugin import FabricFactory, FabricHandle
from orchestrator.worker.outcome import CollectiveResult, RunResult, phase_spans
from orchestrator.worker.spec import CollectiveTest, LaunchOptions
from tests.programs import iteration

pytestmark = pytest.mark.integration

ELEMENTS = 16 << 10  # 64 KiB per all-reduce and point-to-point transfer
FORWARD, BACKWARD = 0.2, 0.3  # seconds of compute in slots 1 and 2
SRC, DST = 0, 2  # GPU 0 of servers p0s0 and p0s1: the fabric between them


@pytest.fixture(scope="module")
def fabric(astral_fabric: FabricFactory) -> FabricHandle:
    return astral_fabric("astral-small", policy="ecmp")


def run(fabric: FabricHandle, programs: list[Program], *worker_args: str) -> RunResult:
    """One warm-up and two timed runs of each program, on every GPU in rank order."""
    testbed = fabric.testbed
    options = LaunchOptions(
        warmup=1,
        iterations=2,
        max_iterations=2,
        channels=testbed.nic_ports,
        worker_args=worker_args,
    )
    with testbed.launch(None, options, [("all-to-all", "direct")]) as launcher:
        result = launcher.run([CollectiveTest.of_program(p) for p in programs])
    result.raise_for_failure()
    return result


def receiver_seconds(test: CollectiveResult) -> float:
    """The destination's time per timed operation (its step ends when the bytes are in)."""
    return fmean(i.ranks[DST].time_us for i in test.timed()) / 1e6


def test_a_training_iteration_verifies_and_shows_compute_and_transfers(
    fabric: FabricHandle,
) -> None:
    result = run(fabric, [iteration(ELEMENTS, FORWARD, BACKWARD)])
    (test,) = result.tests
    assert test.wrong == 0 and len(test.iterations) == 3
    for i in test.iterations:
        for rank, r in i.ranks.items():
            assert r.sent == test.expected_sent[rank], rank
            assert r.time_us >= (FORWARD + BACKWARD) * 1e6, rank
            spans = {p.phase: p.end - p.start for p in phase_spans(r.phases)}
            phases = " | ".join(spans)
            assert "tp reduce-scatter + forward" in spans, phases
            assert "dp all-gather + backward" in spans, phases
            computed = sum(s for name, s in spans.items() if name.endswith("forward"))
            assert computed >= FORWARD - 1e-3, phases
    last = test.iterations[-1].ranks
    assert "ep all-to-all" in {p.phase for p in last[0].phases}
    assert "pp send" in {p.phase for p in last[1].phases}  # rank 1 sends to rank 7
    # the fabric carried the data-parallel rings and the all-to-all: same-rail pairs only
    fabric_pairs = {(c.src, c.dst) for c in result.connections if c.link == "fabric"}
    assert fabric_pairs and all(src % 2 == dst % 2 for src, dst in fabric_pairs)


def test_a_corrupted_region_of_the_program_is_counted(fabric: FabricHandle) -> None:
    result = run(fabric, [iteration(ELEMENTS, 0.0, 0.0)], "--corrupt-rank", "1")
    wrong = result.tests[0].wrong
    assert wrong is not None and wrong > 0


def test_a_step_lasts_the_longer_of_its_compute_and_its_transfers(
    fabric: FabricHandle,
) -> None:
    """Over the fabric, a transfer of about half a second alone, compute of 0.5 s beside a
    tiny transfer, then compute of 0.6 x the transfer's time beside the same transfer."""
    big = int(0.5 * fabric.rail_bandwidth() * 1e9) // 4  # half a second at the NICs' rate

    def one(label: str, count: int, seconds: float) -> Program:
        ops = (PointToPoint(SRC, DST, count), Compute.on((SRC, DST), seconds))
        return Program(label, (Slot(ops if seconds else ops[:1]),))

    alone, computing = run(fabric, [one("alone", big, 0.0), one("computing", 64, 0.5)]).tests
    transfer = receiver_seconds(alone)
    assert transfer > 0.2, "too fast a transfer to tell a sum from a maximum"
    assert 0.5 <= receiver_seconds(computing) < 0.8
    compute = 0.6 * transfer
    (both,) = run(fabric, [one("both", big, compute)]).tests
    overlapped = receiver_seconds(both)
    assert both.wrong == 0
    assert compute <= overlapped < transfer + 0.5 * compute, (transfer, compute, overlapped)
