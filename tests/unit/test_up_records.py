"""``astral up`` names the run records it cannot read (orchestrator/commands/up.py): the
file and why, on stderr, with no traceback, and goes on to bring the fabric up; readable
records are left to the bring-up, which cleans up after them. No emulation: the fabric's
bring-up is replaced by one that is interrupted at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.commands import up
from orchestrator.emulation.state import STATE_DIR_ENV, STATE_FILE, RunState, runs_dir


class InterruptedEmulation:
    """An emulation whose bring-up is interrupted (Ctrl-C) before anything is created."""

    started: list[Any] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
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


def test_up_names_each_unreadable_run_record_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readable, damaged, alien = records(tmp_path)
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(up, "Emulation", InterruptedEmulation)
    InterruptedEmulation.started.clear()
    assert main(["up", "--hold", "0"]) == 130
    err = capsys.readouterr().err
    assert InterruptedEmulation.started  # the bring-up still went ahead
    lines = [line for line in err.splitlines() if "unreadable run record" in line]
    assert len(lines) == 2, err
    assert str(damaged) in lines[0] and "not JSON" in lines[0]
    assert str(alien) in lines[1] and "found list" in lines[1]
    assert str(readable) not in err  # a readable record is the bring-up's to clean
    assert "Traceback" not in err


def test_no_warning_without_unreadable_records(tmp_path: Path) -> None:
    RunState.create(tmp_path, command=["astral", "up"])
    assert up.unreadable_record_lines(tmp_path) == []
    assert up.unreadable_record_lines(tmp_path / "never-used") == []
