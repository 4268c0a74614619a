"""The diagnosis of a damaged bundle: a table its schema version has is missing from its
database (orchestrator.results.store.ResultsBundle.missing_tables).

Without the ``controller_events`` table the controller's events are read from the bundle's
copy of its events file (logs/), the same events; without either, nothing says a port went
down, and a link that went down looks like a hole or a loss: the diagnosis says the bundle
is damaged and weakens those verdicts, instead of a blackhole at 0.9 (seed 56's run 38).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import astuple
from pathlib import Path

import pytest

from controllers.events import EVENTS_NAME
from orchestrator.diagnosis import diagnose, diagnose_bundle
from orchestrator.results.store import (
    CONTROLLER_EVENTS_LOG,
    DATABASE,
    LOGS,
    ControllerEvent,
    ResultsBundle,
)
from tests.helpers import preset_description
from tests.unit.test_diagnosis import observations
from tests.unit.test_probes import DOWN_A0, DOWN_A1, record
from tests.unit.test_results import DESCRIPTION, T0, write_synthetic_bundle
from topologies.description import FabricDescription

SWITCH, PEER = "p0r0t0", "p0r0a0"  # the link that goes down, in astral-small


@pytest.fixture(scope="module")
def astral() -> FabricDescription:
    return preset_description("astral-small")


def port_of_link() -> int:
    (link,) = [x for x in DESCRIPTION.fabric.links if {x.a, x.b} == {SWITCH, PEER}]
    return link.port_of(SWITCH)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A synthetic bundle whose controller saw the ToR's port to the aggregation switch go
    down 3 s into the run and come up 6 s later, in its table and in the log's copy."""
    path = write_synthetic_bundle(tmp_path / "run")
    port = port_of_link()
    records = [
        {"t": T0 + 1.0 + 3.0, "event": "port-down", "switch": SWITCH, "port": port,
         "level": "INFO", "message": f"{SWITCH} port {port} down"},
        {"t": T0 + 1.0 + 9.0, "event": "port-up", "switch": SWITCH, "port": port,
         "level": "INFO", "message": f"{SWITCH} port {port} up"},
        {"t": T0 + 1.0 + 9.5, "level": "INFO", "message": "a plain log line"},
    ]  # fmt: skip
    (path / LOGS).mkdir(exist_ok=True)
    lines = [json.dumps(r) for r in records] + ['{"t": 1, "half writ']
    (path / LOGS / CONTROLLER_EVENTS_LOG).write_text("\n".join(lines) + "\n")
    with sqlite3.connect(path / DATABASE) as db:
        db.executemany(
            "INSERT INTO controller_events (run_id, t, kind, switch, port, level, message)"
            " VALUES (1, ?, ?, ?, ?, ?, ?)",
            [astuple(ControllerEvent.of_record(r)) for r in records],
        )
    return path


def drop_events_table(path: Path) -> None:
    with sqlite3.connect(path / DATABASE) as db:
        db.execute("DROP TABLE controller_events")


def down_link(path: Path) -> list[str]:
    return [
        s.target
        for s in diagnose_bundle(path).ranked
        if s.component == "link" and s.fault == "down"
    ]


def test_an_intact_bundle_is_not_damaged_and_names_the_link_down(bundle: Path) -> None:
    with ResultsBundle.open(bundle) as results:
        assert results.missing_tables() == []
    assert down_link(bundle) == [f"{SWITCH}-{PEER}"]
    assert not any("damaged" in note for note in diagnose_bundle(bundle).notes)


def test_without_the_events_table_the_logs_copy_of_the_events_still_names_the_link(
    bundle: Path,
) -> None:
    drop_events_table(bundle)
    with ResultsBundle.open(bundle) as results:
        assert results.missing_tables() == ["controller_events"]
        logged = results.logged_controller_events()
    assert logged is not None and [e.kind for e in logged] == ["port-down", "port-up", "log"]
    assert down_link(bundle) == [f"{SWITCH}-{PEER}"]
    notes = diagnose_bundle(bundle).notes
    assert any(
        note.startswith("damaged bundle: its database lacks the controller_events table")
        and f"read from the bundle's {LOGS}/{CONTROLLER_EVENTS_LOG} instead" in note
        for note in notes
    ), notes


def test_without_any_copy_of_the_events_the_diagnosis_says_the_bundle_is_damaged(
    bundle: Path,
) -> None:
    drop_events_table(bundle)
    (bundle / LOGS / CONTROLLER_EVENTS_LOG).unlink()
    diagnosis = diagnose_bundle(bundle)
    assert down_link(bundle) == []
    (note,) = [n for n in diagnosis.notes if n.startswith("damaged bundle")]
    assert "lacks the controller_events table" in note
    assert "no port event says a link went down" in note


def test_a_hole_is_a_weaker_blackhole_when_no_port_event_was_kept(
    astral: FabricDescription,
) -> None:
    """The probes stalled through one switch (tests/unit/test_probes.py's blackhole case):
    a blackhole at 0.9 with the controller's events, but one of that switch's links going
    down stalls them alike, and a bundle without the events cannot say none did."""
    held = {0: {"stall": (5.0, 12.0)}, 2: {"stall": (5.0, 12.0)}}
    probes = record(DOWN_A1 + DOWN_A0, held)
    whole = diagnose(observations(astral, probes=probes)).ranked[0]
    damaged = diagnose(
        observations(astral, probes=probes, missing_tables=("controller_events",))
    ).ranked[0]
    assert whole.key() == damaged.key() == ("switch", "p1r0a1", "blackhole")
    assert whole.score == pytest.approx(0.9) and "no port down" in whole.evidence[0]
    assert 0.5 <= damaged.score < 0.8  # still named, as a weaker verdict
    assert "no port down" not in damaged.evidence[0]
    assert damaged.evidence[-1].startswith("but the bundle lacks the controller's events")


def test_the_events_file_the_bundle_keeps_is_the_one_the_controller_writes() -> None:
    assert CONTROLLER_EVENTS_LOG == EVENTS_NAME
