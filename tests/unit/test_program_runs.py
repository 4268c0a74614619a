"""Programs run by real worker processes over TCP on 127.0.0.x (no root): each worker
composes its own plan and expected result from the program in the schedule, verifies every
sub-collective, and spends the program's compute time alongside its transfers."""

from __future__ import annotations

import pytest

from orchestrator.collectives.plans import Layout
from orchestrator.collectives.program import (
    PROGRAM,
    Compute,
    PointToPoint,
    Program,
    Slot,
    compose_all,
)
from orchestrator.worker.launcher import Launcher
from orchestrator.worker.outcome import RunResult, phase_spans
from orchestrator.worker.spec import CollectiveTest, loopback_workers
from tests.helpers import fast_options
from tests.programs import iteration
from topologies.errors import ExperimentError


def run(program: Program, **options: object) -> RunResult:
    with Launcher(loopback_workers(8, 2), options=fast_options(**options)) as launcher:
        return launcher.run([CollectiveTest.of_program(program)])


def test_a_program_verifies_and_moves_the_bytes_of_its_plans() -> None:
    program = iteration(count=5000, forward=0.05, backward=0.05)
    result = run(program, channels=2)
    assert result.failure is None, str(result.failure)
    (test,) = result.tests
    assert test.test.collective == PROGRAM and test.count == program.elements()
    assert test.wrong == 0 and len(test.iterations) == 3
    plans = compose_all(program, Layout.regular(8, 2))  # as loopback_workers(8, 2) places them
    for i in test.iterations:
        for rank, r in i.ranks.items():
            assert r.sent == test.expected_sent[rank] == sum(plans[rank].bytes_sent().values())
    assert result.rows() == []  # a program has no nccl-tests row


def test_a_corrupted_region_of_a_program_is_counted() -> None:
    result = run(iteration(count=1000, forward=0, backward=0), worker_args=("--corrupt-rank", "1"))
    assert result.failure is None, str(result.failure)
    assert result.tests[0].wrong


def test_compute_time_is_spent_and_shows_in_the_phases() -> None:
    result = run(iteration(count=100, forward=0.2, backward=0.3), iterations=1)
    assert result.failure is None, str(result.failure)
    for i in result.tests[0].iterations:
        for r in i.ranks.values():
            assert r.time_us >= 0.5e6  # 0.2 s then 0.3 s, whatever the transfers
            spans = {p.phase: p.end - p.start for p in phase_spans(r.phases)}
            forward = [s for name, s in spans.items() if name.endswith("+ forward")]
            backward = [s for name, s in spans.items() if name.endswith("+ backward")]
            assert sum(forward) >= 0.2 - 1e-3 and sum(backward) >= 0.3 - 1e-3, spans


def test_a_rank_that_only_computes_takes_its_time_and_no_connection() -> None:
    program = Program("lonely", (Slot((Compute.on([2], 0.2), PointToPoint(0, 1, 64))),))
    result = run(program, warmup=0, iterations=1)
    assert result.failure is None, str(result.failure)
    (iteration_,) = result.tests[0].iterations
    assert iteration_.ranks[2].time_us >= 0.2e6
    assert {(c.src, c.dst) for c in result.connections} == {(0, 1)}


def test_a_program_the_layout_cannot_run_is_an_experiment_error() -> None:
    bad = Program("bad", (Slot((PointToPoint(0, 9, 64),)),))
    with (
        Launcher(loopback_workers(2), options=fast_options()) as launcher,
        pytest.raises(ExperimentError, match="not in a layout of 2 ranks"),
    ):
        launcher.run([CollectiveTest.of_program(bad)])


def test_a_program_test_needs_a_program() -> None:
    with pytest.raises(ValueError, match="needs a program"):
        CollectiveTest(PROGRAM, "x", 64)
    with pytest.raises(ValueError, match="needs a program"):
        CollectiveTest("all-reduce", "ring", 64, iteration())
