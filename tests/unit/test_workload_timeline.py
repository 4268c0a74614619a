"""A replayed iteration's timeline (orchestrator/workload/timeline.py): the workers' per-step
records grouped into the program's slots, and the exposed communication per kind."""

from __future__ import annotations

import pytest

from orchestrator.collectives.plans import Layout
from orchestrator.collectives.program import (
    Compute,
    GroupCollective,
    PointToPoint,
    Program,
    Slot,
    compose_all,
    step_slots,
)
from orchestrator.workload.timeline import exposure, kind_of, last_rank, measured_timeline

LAYOUT = Layout((0, 0, 1, 1), (0, 1, 0, 1))  # 4 ranks on 2 servers

PROGRAM = Program(
    "probe",
    (
        Slot((Compute.on(range(4), 1.0, "forward"),), "forward"),
        Slot(
            (
                Compute.on(range(4), 0.5, "backward"),
                GroupCollective("all-reduce", "ring", (0, 1, 2, 3), 64, "dp bucket 0"),
            ),
            "backward + dp",
        ),
        Slot((PointToPoint(1, 3, 32, "pp activations"),), "pp"),
        Slot(
            (
                GroupCollective("all-reduce", "ring", (0, 1), 16, "tp attention"),
                GroupCollective("all-to-all", "direct", (0, 2), 64, "ep dispatch"),
            ),
            "tp + ep",
        ),
    ),
)


def test_every_step_of_a_rank_belongs_to_one_slot_in_order() -> None:
    owners = step_slots(PROGRAM, LAYOUT)
    plans = compose_all(PROGRAM, LAYOUT)
    for rank, plan in enumerate(plans):
        assert len(owners[rank]) == len(plan.steps)
        assert owners[rank] == sorted(owners[rank])
    # every rank passes every slot (a rank outside the p2p idles through it)
    assert all(set(slots) == {0, 1, 2, 3} for slots in owners)


def fake_phases(durations: dict[int, float]) -> dict[int, list[tuple[str, int, float, float]]]:
    """Each rank's steps back to back from t=100, a step of slot s lasting durations[s]
    divided among the slot's steps; then the delivery record (not a slot's)."""
    owners = step_slots(PROGRAM, LAYOUT)
    phases = {}
    for rank, slots in enumerate(owners):
        t, rows = 100.0, []
        for step, slot in enumerate(slots):
            length = durations[slot] / slots.count(slot)
            rows.append((f"step {step}", step, t, t + length))
            t += length
        rows.append(("delivery", len(slots), t, t + 0.01))
        phases[rank] = rows
    return phases


def test_slots_are_timed_from_their_steps_and_exposed_time_is_beyond_compute() -> None:
    durations = {0: 1.0, 1: 2.5, 2: 0.4, 3: 0.3}
    timeline = measured_timeline(PROGRAM, LAYOUT, fake_phases(durations))
    assert sorted(timeline) == [0, 1, 2, 3]
    spans = {s.slot: s for s in timeline[1]}
    assert spans[0].start == pytest.approx(0.0) and spans[0].end == pytest.approx(1.0)
    assert spans[0].kind == "" and spans[0].exposed == 0.0  # only computes
    assert spans[1].end - spans[1].start == pytest.approx(2.5)
    assert spans[1].kind == "dp" and spans[1].exposed == pytest.approx(2.0)  # 2.5 - 0.5
    assert spans[2].kind == "pp" and spans[2].exposed == pytest.approx(0.4)
    assert spans[3].kind == "tp" and spans[3].exposed == pytest.approx(0.3)
    # rank 0's slot 3 holds a tp and an ep op: the ep one moves more bytes
    assert {s.slot: s.kind for s in timeline[0]}[3] == "ep"
    assert exposure(timeline[1]) == pytest.approx({"tp": 0.3, "ep": 0.0, "pp": 0.4, "dp": 2.0})
    # rank 0 is outside the p2p: it passes that slot, which is not in its timeline
    assert [s.slot for s in timeline[0]] == [0, 1, 3]
    assert exposure(timeline[0])["pp"] == 0.0
    late = fake_phases(durations)
    late[2] = [(p, k, a + 1.0, b + 1.0) for p, k, a, b in late[2]]
    assert last_rank(measured_timeline(PROGRAM, LAYOUT, late)) == 2


def test_an_op_label_names_its_kind() -> None:
    assert kind_of("tp attention") == "tp"
    assert kind_of("expert dp bucket 3") == "dp"
    assert kind_of("p2p") == "p2p"
