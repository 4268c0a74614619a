"""The table ``astral run`` prints as each collective's sizes finish, from constructed launches.

A configuration whose workers failed used to vanish from it: its row was kept only when the
launch finished with timed iterations, and the run stopped before the group's table was
printed at all. These tests build what a launch records (no emulation, no workers) and
check that every configuration that ran has its row, the failed one saying why.
"""

from __future__ import annotations

from typing import Any

from orchestrator.collectives.ceilings import Ceiling
from orchestrator.results.store import Configuration, IterationRecord
from orchestrator.run.experiment import ExperimentSpec, parse_experiment
from orchestrator.run.runner import (
    FAILURE_NOTE_CHARS,
    Recorded,
    asked_configuration,
    failure_note,
    live_table,
    step_rows,
)
from orchestrator.worker.outcome import (
    HUNG,
    CollectiveResult,
    Failure,
    IterationResult,
    Problem,
)
from orchestrator.worker.spec import CollectiveTest
from tests.helpers import REPO

SCALE = 1e-4
CEILING = Ceiling(rail=0.0025, fabric_share=1.0, burst_s=0.01)
HUNG_RANK_3 = Failure(
    "all-reduce (ring) 16K iterations 1-2",
    (Problem(3, "lo3", HUNG, "hung: no progress for 1.5 s (step deadline)"),),
)


def spec() -> ExperimentSpec:
    document: dict[str, Any] = {
        "name": "unit",
        "fabric": "astral-small",
        "policies": ["ecmp"],
        "collectives": ["all-reduce"],
        "sizes": {"min": "4K", "max": "16K", "factor": 4},
        "iterations": 2,
        "warmup": 1,
    }
    return parse_experiment(document, "unit.yaml", REPO)


def launch(config_id: int, size: int, timed: int, ranks: int = 8) -> Recorded:
    """What a launch of all-reduce (ring) at ``size`` records: one warm-up iteration and
    ``timed`` timed ones (fewer than asked: its workers failed in between)."""
    iterations = [IterationResult(i, warmup=i == 0) for i in range(1 + timed)]
    done = CollectiveResult(CollectiveTest("all-reduce", "ring", size), ranks, size // 4, {})
    done.iterations = iterations
    configuration = Configuration(
        config_id, "ecmp", "all-reduce", "ring", size, size // 4, "uint32", ranks,
        max(timed, 2), 1, "balanced",
    )  # fmt: skip
    records = [
        IterationRecord(i.iteration, rank, 1000.0 + rank, size, wrong=0, warmup=i.warmup)
        for i in iterations
        for rank in range(ranks)
    ]
    return done, config_id, configuration, records


def rows_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_a_configuration_whose_workers_failed_keeps_its_row_saying_why() -> None:
    experiment = spec()
    first, second = experiment.steps()
    ok = step_rows(
        [launch(1, 4096, 2)], None, SCALE, CEILING, asked_configuration(first, experiment)
    )
    # the workers hung in 16K's timed batch: its warm-up is all that was recorded
    failed = step_rows(
        [launch(2, 16384, 0)], HUNG_RANK_3, SCALE, CEILING, asked_configuration(second, experiment)
    )
    assert [(r.counted, r.failed) for r in ok] == [(True, "")]
    assert [r.counted for r in failed] == [False]  # no figure of it joins the run's
    text = live_table(experiment, ("ecmp", "all-reduce (ring)"), ok + failed, SCALE, {}, None)
    measured, broken = rows_of(text)
    assert measured.split()[0] == "4096" and "FAILED" not in measured
    assert broken.split()[0] == "16384"
    assert "NOT MEASURED; FAILED: rank 3 (lo3) hung: no progress" in broken
    assert "nan" not in broken


def test_a_failure_before_anything_was_recorded_still_shows_the_size_asked() -> None:
    """Workers that failed while connecting leave no configuration in the bundle: the row
    is the step as the experiment asked for it."""
    experiment = spec()
    step = experiment.steps()[1]
    blamed_nobody = Failure("connection set-up", ())
    rows = step_rows([], blamed_nobody, SCALE, CEILING, asked_configuration(step, experiment))
    assert len(rows) == 1 and not rows[0].counted
    assert rows[0].failed == "FAILED: workers failed during connection set-up"
    (row,) = rows_of(live_table(experiment, ("ecmp", "all-reduce (ring)"), rows, SCALE, {}, None))
    assert row.split()[0] == str(step.size) and row.endswith(rows[0].failed)


def test_a_long_failure_is_cut_short_beside_its_row() -> None:
    many = Failure(
        "all-to-all (direct) 4M iterations 3-4",
        tuple(Problem(r, f"lo{r}", HUNG, "hung: no progress for 30 s") for r in range(8)),
    )
    note = failure_note(many)
    assert note.startswith("FAILED: rank 0 (lo0) hung") and note.endswith("...")
    assert len(note) <= FAILURE_NOTE_CHARS
    assert failure_note(HUNG_RANK_3) == (
        "FAILED: rank 3 (lo3) hung: no progress for 1.5 s (step deadline)"
    )
