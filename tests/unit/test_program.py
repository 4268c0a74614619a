"""Programs (orchestrator/collectives/program.py) composed into every rank's plan and run in
memory: each sub-collective, point-to-point transfer and compute lands where the program
says, every pair of ranks agrees step by step on the bytes between them, and a program that
cannot run is refused with a sentence naming its slot and op."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.collectives.plans import Layout, Plan, PlanError, PlanStep, default_registry
from orchestrator.collectives.program import (
    PROGRAM,
    Compute,
    GroupCollective,
    PointToPoint,
    Program,
    ProgramError,
    Slot,
    compose,
    compose_all,
    expected,
)
from tests.programs import iteration
from tests.unit.simulation import simulate

LAYOUT = Layout.regular(8, 2)  # 4 servers of 2 GPUs: rail 0 = even ranks, rail 1 = odd


def run(program: Program, layout: Layout = LAYOUT, corrupt: int = -1) -> list[int]:
    """#wrong per rank after running every rank's composed plan in memory."""
    plans = compose_all(program, layout)
    results = [expected(program, layout, rank) for rank in range(layout.size)]
    return simulate(plans, test=2, iteration=1, corrupt=corrupt, results=results)


def assert_pairs_agree(plans: list[Plan]) -> None:
    """Every rank has the same steps, and in each, the bytes a sends to b are the bytes b
    receives from a (the executor cuts a step's bytes per peer into channels by that total)."""
    assert len({len(p.steps) for p in plans}) == 1
    for k in range(len(plans[0].steps)):
        sent: dict[tuple[int, int], int] = {}
        received: dict[tuple[int, int], int] = {}
        for plan in plans:
            for t in plan.steps[k].sends:
                key = (plan.rank, t.peer)
                sent[key] = sent.get(key, 0) + t.region.nbytes
            for t in plan.steps[k].recvs:
                key = (t.peer, plan.rank)
                received[key] = received.get(key, 0) + t.region.nbytes
        assert sent == received, f"step {k}"


def test_a_step_computes_alongside_its_transfers() -> None:
    assert PlanStep("x").compute == 0.0
    assert PlanStep("x").is_empty()
    assert not PlanStep("x", compute=0.5).is_empty()  # a step that only computes is kept
    with pytest.raises(PlanError, match="compute must be >= 0"):
        PlanStep("x", compute=-1.0)
    with pytest.raises(PlanError, match="compute must be >= 0"):
        PlanStep("x", compute=float("nan"))


def test_a_training_iteration_verifies_on_every_rank() -> None:
    assert run(iteration()) == [0] * 8
    assert run(iteration(count=1003)) == [0] * 8  # chunks of unequal sizes


def test_a_corrupted_region_is_counted() -> None:
    assert sum(run(iteration(), corrupt=1)) > 0


def test_every_pair_agrees_on_the_bytes_of_every_step() -> None:
    plans = compose_all(iteration(), LAYOUT)
    assert_pairs_agree(plans)
    # slot 1: a ring of 2 (2 steps); slot 2: rings of 4 (6 steps); slot 3: 1 step
    assert len(plans[0].steps) == 2 + 6 + 1


def test_each_rank_plan_is_the_same_from_compose_and_compose_all() -> None:
    program = iteration()
    assert [compose(program, LAYOUT, r) for r in range(8)] == compose_all(program, LAYOUT)


def test_compute_is_spread_over_the_slot_and_named_in_its_phases() -> None:
    plan = compose(iteration(), LAYOUT, 3)
    assert [s.compute for s in plan.steps[:2]] == [pytest.approx(0.1)] * 2
    assert [s.compute for s in plan.steps[2:8]] == [pytest.approx(0.05)] * 6
    assert plan.steps[8].compute == 0.0
    assert plan.steps[0].phase == "tp reduce-scatter + forward"
    assert plan.steps[2].phase == "dp reduce-scatter + backward"
    assert plan.steps[8].phase == "ep idle"  # rank 3 takes no part in slot 3
    assert compose(iteration(), LAYOUT, 1).steps[8].phase == "pp send"


def test_ops_have_their_own_buffers_and_peers_in_global_ranks() -> None:
    plan = compose(iteration(), LAYOUT, 2)
    assert plan.collective == PROGRAM and plan.algorithm == "iteration"
    assert dict(plan.buffers) == {
        "op1.data": 1000,  # tp on (2, 3)
        "op5.data": 1000,  # dp on rail 0
        "op8.send": 4000,
        "op8.recv": 4000,
    }
    assert {t.peer for t in plan.steps[0].sends} == {3}
    assert {t.peer for t in plan.steps[2].sends} == {4}  # ring 0, 2, 4, 6
    assert {t.peer for t in plan.steps[8].sends} == {0, 4, 6}
    assert plan.count == iteration().elements() == 4 * 1000 + 2 * 1000 + 4000 + 1000


def test_the_expected_result_names_global_ranks_and_separate_pattern_places() -> None:
    result = expected(iteration(), LAYOUT, 7)
    # tp on (6, 7), dp on rail 1, and p2p's destination (its own values until they arrive)
    assert result.inputs == ("op3.data", "op6.data", "op9.data")
    checks = {e.buffer: e for e in result.expected}
    assert checks["op3.data"].sources == (6, 7)
    assert checks["op6.data"].sources == (1, 3, 5, 7)
    assert checks["op9.data"].sources == (1,)  # the point-to-point transfer from rank 1
    assert [result.start(b) for b in result.inputs] == [3000, 5000, 10000]
    assert checks["op9.data"].start == 10000


@pytest.mark.parametrize("name", default_registry().names())
def test_every_algorithm_runs_on_a_sub_group(name: str) -> None:
    """On servers 0 and 2 only (ranks 0, 1, 4, 5): a 2 x 2 sub-layout, concurrent with a
    ring on the other servers' rail 1 that shares no rank with it."""
    collective, algorithm = name.split("/")
    program = Program(
        "one",
        (
            Slot(
                (
                    GroupCollective(collective, algorithm, (0, 1, 4, 5), 400),
                    GroupCollective("all-reduce", "ring", (3, 7), 100),
                )
            ),
        ),
    )
    assert run(program) == [0] * 8
    assert_pairs_agree(compose_all(program, LAYOUT))


def test_two_ops_between_the_same_pair_in_one_slot_keep_their_order() -> None:
    program = Program(
        "shared",
        (
            Slot(
                (
                    PointToPoint(0, 1, 300),
                    GroupCollective("all-reduce", "ring", (1, 0), 500),
                    PointToPoint(1, 0, 200),
                    GroupCollective("all-gather", "ring", (0, 1, 2, 3), 400),
                )
            ),
            Slot((PointToPoint(3, 0, 100), Compute(((0, 0.1), (2, 0.2))))),
        ),
    )
    assert run(program, Layout.regular(4, 2)) == [0] * 4
    assert_pairs_agree(compose_all(program, Layout.regular(4, 2)))


def test_a_program_travels_as_json_and_back() -> None:
    program = iteration()
    assert Program.from_message(json.loads(json.dumps(program.to_message()))) == program
    with pytest.raises(ProgramError, match="malformed program"):
        Program.from_message({"name": "x", "slots": [{"ops": [{"kind": "sleep"}]}]})


def one(*ops: object) -> Program:
    return Program("bad", (Slot(tuple(ops)),))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "program, message",
    [
        (Program("bad", ()), "has no slots"),
        (Program("bad", (Slot(()),)), "slot 0 has no ops"),
        (one(GroupCollective("all-reduce", "ring", (0, 8), 10)), r"rank\(s\) \[8\] not in"),
        (one(GroupCollective("all-reduce", "ring", (0, 1, 0), 10)), "listed twice"),
        (one(GroupCollective("all-reduce", "ring", (), 10)), "an empty group"),
        (one(GroupCollective("all-reduce", "ring", (0, 1), 0)), "count must be > 0"),
        (one(PointToPoint(2, 2, 10)), r"op 0 \(p2p\).*listed twice"),
        (one(Compute(((0, -1.0),))), "compute seconds must be >= 0"),
        (one(Compute.on([9], 1.0)), "not in a layout"),
        (one(GroupCollective("all-reduce", "fastest", (0, 1), 10)), "unknown collective alg"),
        (one(GroupCollective("gossip", "ring", (0, 1), 10)), "unknown collective alg"),
        (one(GroupCollective("all-to-all", "direct", (0, 1, 2), 10)), "not a multiple of"),
        # servers 0 (rails 0, 1) and 1 (rail 0 only): no grid of rails
        (one(GroupCollective("all-reduce", "hierarchical", (0, 1, 2), 12)), "same rails"),
        # 2 elements among 4 ranks: some ranks' ring steps are empty, others' are not
        (one(GroupCollective("all-reduce", "ring", (0, 1, 2, 3), 2)), "too few elements"),
    ],
)
def test_a_program_that_cannot_run_is_refused_with_its_slot_and_op(
    program: Program, message: str
) -> None:
    with pytest.raises(ProgramError, match=message) as error:
        compose(program, LAYOUT, 0)
    assert "program 'bad'" in str(error.value)


def test_data_that_lands_in_another_op_s_buffer_is_counted() -> None:
    """Two equal transfers 0 -> 1; rank 1 swaps where it receives them. Each op's inputs
    begin at their own place in the fill pattern, so the swap does not go unnoticed."""
    program = Program("two", (Slot((PointToPoint(0, 1, 64), PointToPoint(0, 1, 64))),))
    layout = Layout.regular(2, 1)
    plans = compose_all(program, layout)
    step = plans[1].steps[0]
    swapped = replace(step, recvs=step.recvs[::-1])
    plans[1] = replace(plans[1], steps=(swapped,))
    results = [expected(program, layout, rank) for rank in range(2)]
    assert simulate(compose_all(program, layout), results=results) == [0, 0]
    assert simulate(plans, results=results) == [0, 128]
