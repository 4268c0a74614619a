"""A bring-up names the run records it cannot read (Emulation._clean_leftovers): the file
and why, in its log (``astral up``'s and ``astral run``'s stderr), with no traceback, and
goes on to bring the fabric up; readable records it cleans up after. No emulation: the
records are read and nothing is started, and ``astral up``'s bring-up is replaced by one
that is interrupted at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.commands import up
from orchestrator.emulation.network import Emulation
from orchestrator.emulation.state import (
    STATE_DIR_ENV,
    STATE_FILE,
    RunState,
    runs_dir,
    unreadable_record_warnings,
)


class InterruptedEmulation:
    """An emulation whose bring-up is interrupted (Ctrl-C) before anything is created."""

    started: list[Any] = []
    logs: list[Any] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        InterruptedEmulation.logs = [kwargs.get("log")]
        self.teardown_report = None
        self.timings: dict[str, float] = {}

    def __enter__(self) -> InterruptedEmulation:
        InterruptedEmulation.started.append(self)
        raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        pass


def records(base: Path) -> tuple[Path, Path, Path]:
    """A readable record, one that is not JSON and one that is no run record."""
    readable = RunState.create(base, command=["astral", "up"], now=1_700_000_000.0)
    damaged = runs_dir(base) / "20231114T000000-1" / STATE_FILE
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"version": 1, "run_id": ', encoding="utf-8")
    alien = runs_dir(base) / "20231114T000001-2" / STATE_FILE
    alien.parent.mkdir(parents=True)
    alien.write_text("[1, 2, 3]\n", encoding="utf-8")
    return readable.run_dir / STATE_FILE, damaged, alien


def test_a_bring_up_names_each_unreadable_run_record_and_why(tmp_path: Path) -> None:
    """Every bring-up (``astral up``, ``astral run``, a calibration) cleans up after the
    readable records before it starts, and says which records it could not read: before,
    only ``astral up`` said so and ``astral run`` skipped them in silence."""
    readable, damaged, alien = records(tmp_path)
    RunState.load(readable.parent).set_status("clean")
    said: list[str] = []
    Emulation(state_base=tmp_path, log=said.append)._clean_leftovers()
    lines = [line for line in said if "unreadable run record" in line]
    assert len(lines) == 2, said
    assert str(damaged) in lines[0] and "not JSON" in lines[0]
    assert str(alien) in lines[1] and "found list" in lines[1]
    assert str(readable) not in " ".join(said)  # a readable record is the bring-up's to clean


def test_up_says_what_the_bring_up_says_and_brings_up_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    records(tmp_path)
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(up, "Emulation", InterruptedEmulation)
    InterruptedEmulation.started.clear()
    assert main(["up", "--hold", "0"]) == 130
    err = capsys.readouterr().err
    assert InterruptedEmulation.started  # the bring-up still went ahead
    # the bring-up's log is up's stderr: what it says about the records reaches the user
    assert InterruptedEmulation.logs == [up.say]
    assert "Traceback" not in err


def test_no_warning_without_unreadable_records(tmp_path: Path) -> None:
    RunState.create(tmp_path, command=["astral", "up"])
    assert unreadable_record_warnings(tmp_path) == []
    assert unreadable_record_warnings(tmp_path / "never-used") == []
