"""The forecast timeline as the diagnosis's expectation (orchestrator/diagnosis/expectation.py):
a replayed iteration's slots that ran beyond their forecast point at the link that the
connections holding them up crossed; an iteration near its forecast blames nothing."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.diagnosis import diagnose
from orchestrator.diagnosis.evidence import ConnectionView
from orchestrator.diagnosis.expectation import behind_forecast, holding
from tests.helpers import preset_description
from tests.unit.test_diagnosis import GPUS, T0, observations, path
from topologies.description import FabricDescription

# rank 0 (p0s0g0) all-reduces with rank 2 (p0s1g0) in slot 0, rank 2 sends to rank 4
# (p1s0g0) in slot 1, ranks 0 and 4 exchange experts in slot 2
SLOTS = [[["dp", [0, 2]]], [["pp", [2, 4]]], [["ep", [0, 4]]]]
FAULTY = "p0r0t0-p0s0g0"


@pytest.fixture(scope="module")
def astral() -> FabricDescription:
    return preset_description("astral-small")


def sender(cid: int, src: int, dst: int, hops: list[str], busy: tuple[float, float]) -> Any:
    """A connection that moves bytes every 10 ms while ``busy`` (seconds from T0)."""
    c = ConnectionView(cid, 1, src, dst, GPUS[src], GPUS[dst], path(*hops))
    steps = round((busy[1] - busy[0]) / 0.01)
    c.samples = [(T0 + busy[0] + k * 0.01, 12_000) for k in range(steps + 1)]
    return c


CONNECTIONS = [
    sender(1, 0, 2, ["p0s0g0", "p0r0t0", "p0s1g0"], (0.0, 3.9)),  # the faulty link: late
    sender(2, 0, 2, ["p0s0g0", "p0r0t1", "p0s1g0"], (0.0, 1.0)),  # rail 1: done early
    sender(3, 2, 4, ["p0s1g0", "p0r0t0", "c0", "p1r0t0", "p1s0g0"], (4.0, 5.0)),
    sender(4, 0, 4, ["p0s0g0", "p0r0t0", "c0", "p1r0t0", "p1s0g0"], (5.0, 7.9)),
]


def workload(iteration_s: float) -> dict[str, Any]:
    """Slot spans [slot, start, end, compute, kind] per rank, replayed and forecast."""
    forecast = {
        "0": [[0, 0.0, 2.0, 0.5, "dp"], [2, 3.0, 4.0, 0.2, "ep"]],
        "2": [[0, 0.0, 2.0, 0.5, "dp"], [1, 2.0, 3.0, 0.0, "pp"]],
        "4": [[1, 2.0, 3.0, 0.0, "pp"], [2, 3.0, 4.0, 0.2, "ep"]],
    }
    replayed = {
        "0": [[0, 0.0, 4.0, 0.5, "dp"], [2, 5.0, 8.0, 0.2, "ep"]],  # both late
        "2": [[0, 0.0, 4.0, 0.5, "dp"], [1, 4.0, 5.0, 0.0, "pp"]],  # waits on rank 0
        "4": [[1, 4.0, 5.0, 0.0, "pp"], [2, 5.0, 8.0, 0.2, "ep"]],
    }
    record = {
        "iteration_s": iteration_s,
        "timeline": replayed,
        "timeline_origin": T0,
        "forecast": {"iteration_s": 10.0, "timeline": forecast},
    }
    return {"slots": SLOTS, "policies": {"path-pinned": record}}


def test_the_link_the_late_slots_waited_on_is_the_suspect(astral: FabricDescription) -> None:
    obs = observations(
        astral, connections=CONNECTIONS, workload=workload(14.0), config_policies={1: "path-pinned"}
    )
    (suspect,) = behind_forecast(obs)
    assert suspect.key() == ("link", FAULTY, "slow")
    assert suspect.score >= 0.5
    assert "+40% over its forecast" in suspect.evidence[0]
    assert "100% of that excess" in suspect.evidence[2]
    assert diagnose(obs).ranked[0].key() == ("link", FAULTY, "slow")


def test_an_iteration_near_its_forecast_blames_nothing(astral: FabricDescription) -> None:
    obs = observations(
        astral, connections=CONNECTIONS, workload=workload(10.4), config_policies={1: "path-pinned"}
    )
    assert behind_forecast(obs) == []
    assert diagnose(obs).healthy


def test_without_a_forecast_or_a_replay_there_is_no_expectation(
    astral: FabricDescription,
) -> None:
    document = workload(14.0)
    del document["policies"]["path-pinned"]["forecast"]
    for layers in ({"workload": document}, {"workload": None}, {}):
        obs = observations(
            astral, connections=CONNECTIONS, config_policies={1: "path-pinned"}, **layers
        )
        assert behind_forecast(obs) == []


def test_the_connection_that_moved_its_last_bytes_last_held_the_slot() -> None:
    late, early = CONNECTIONS[0], CONNECTIONS[1]
    assert holding([late, early], T0, T0 + 4.0) == [late]
    # nothing moved in the window: every connection may have held it
    assert holding([late, early], T0 + 100, T0 + 101) == [late, early]
