"""Whole runs as a user starts them (``astral up`` in a subprocess): nothing is left behind
after Ctrl-C, SIGTERM, or kill -9 followed by ``astral clean``, and a second concurrent run is
refused with exit status 5. ``astral run`` with a corrupted chunk (the workers' hidden
``--corrupt-rank``, passed through ``--worker-arg``) exits 7, names the configuration and
keeps its bundle.

Needs root and Open vSwitch (tests/conftest.py skips or, under CI, fails without them).
A run waits for the astral run lock if another run holds it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from orchestrator.emulation.state import RunState
from orchestrator.worker import rto
from tests.helpers import REPO, run_command
from tests.integration.assertions import leftovers, snapshot
from topologies.description import FabricDescription

pytestmark = pytest.mark.integration

LOCK_WAIT = 600.0  # another run (a person, another test session) may hold the lock
READY_WAIT = 300.0


def astral(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args]


def start_up(*args: str) -> tuple[subprocess.Popen[str], RunState]:
    """``astral up ARGS`` in the background, once it printed ``ready:``; its run record.

    Another run holding the lock (exit status 5) is waited for, up to LOCK_WAIT seconds.
    The output is read by a thread (select() on a buffered pipe misses lines already
    buffered), and the thread keeps draining it so that the process never blocks on a full
    pipe.
    """
    lock_deadline = time.monotonic() + LOCK_WAIT
    while True:
        process = subprocess.Popen(
            astral("up", *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=REPO,
        )  # fmt: skip
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
        output = []
        ready_deadline = time.monotonic() + READY_WAIT
        while time.monotonic() < ready_deadline:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                break
            output.append(line)
            if line.startswith("ready:"):
                run_dir = Path(line.rsplit(" ", 1)[1].strip())
                _OUTPUT[process.pid] = lines
                return process, RunState.load(run_dir)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        status = process.wait()
        text = "".join(output) + "".join(_drain(lines))
        if status == 5 and time.monotonic() < lock_deadline:
            time.sleep(2)
            continue
        raise AssertionError(f"astral up did not get ready (exit status {status}):\n{text}")


_OUTPUT: dict[int, queue.Queue[str | None]] = {}  # pid of a started run -> its output


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _drain(lines: queue.Queue[str | None], timeout: float = 5.0) -> list[str]:
    """The rest of a started run's output, until it closed its stdout."""
    rest: list[str] = []
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            return rest
        if line is None:
            return rest
        rest.append(line)


def finish(process: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """Wait for a run started by :func:`start_up` to exit; the output after ``ready:``."""
    process.wait(timeout=timeout)
    return "".join(_drain(_OUTPUT.pop(process.pid)))


def fabric_nodes(state: RunState) -> list[str]:
    return list(FabricDescription.read(state.run_dir / "fabric.json").fabric.nodes())


def test_kill_9_leaves_a_record_that_astral_clean_removes_exactly() -> None:
    before = snapshot()
    process, state = start_up("--hold", "120")
    process.kill()  # SIGKILL: no teardown at all
    finish(process)
    left = leftovers(before, RunState.load(state.run_dir), fabric_nodes(state))
    assert any(item.startswith("recorded bridge") for item in left), left
    cleaned = subprocess.run(astral("clean"), capture_output=True, text=True, cwd=REPO)
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"run {state.run_id}" in cleaned.stdout
    assert "deleted bridges" in cleaned.stdout
    state = RunState.load(state.run_dir)
    assert state.status == "clean"
    assert leftovers(before, state, fabric_nodes(state)) == []
    again = subprocess.run(astral("clean"), capture_output=True, text=True, cwd=REPO)
    assert again.returncode == 0 and "nothing to clean" in again.stdout


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["INT", "TERM"]
)
def test_signal_tears_everything_down(signum: int, status: int) -> None:
    before = snapshot()
    process, state = start_up("--hold", "120")
    os.kill(process.pid, signum)
    out = finish(process)
    assert process.returncode == status, out
    assert "torn down in" in out
    state = RunState.load(state.run_dir)
    assert state.status == "clean"
    assert leftovers(before, state, fabric_nodes(state)) == []


def test_second_concurrent_run_is_refused_with_status_5() -> None:
    process, state = start_up("--hold", "120")
    try:
        second = subprocess.run(
            astral("up", "--hold", "0"), capture_output=True, text=True, cwd=REPO, timeout=60
        )
        assert second.returncode == 5
        assert f"pid {process.pid}" in second.stderr
        assert "another astral run is in progress" in second.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        finish(process)
    assert json.loads((state.run_dir / "state.json").read_text())["status"] == "clean"


CORRUPTED = """\
name: it-corrupted
fabric: astral-small
policies: [path-pinned]
collectives: [{op: all-reduce, algorithm: ring}]
sizes: {min: 64K, max: 64K}
iterations: 1
warmup: 1
"""


def run_experiment(*args: str) -> subprocess.CompletedProcess[str]:
    """``astral run ARGS`` to its end; another run holding the lock (exit 5) is waited for,
    up to LOCK_WAIT seconds."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        result = run_command(astral("run", *args), cwd=REPO, timeout=READY_WAIT)
        if result.returncode != 5 or time.monotonic() > deadline:
            return result
        time.sleep(2)


def test_a_corrupted_chunk_exits_7_naming_the_configuration_and_keeps_the_bundle(
    tmp_path: Path,
) -> None:
    experiment = tmp_path / "corrupted.yaml"
    experiment.write_text(CORRUPTED)
    bundle = tmp_path / "bundle"
    result = run_experiment(
        str(experiment), "--out", str(bundle), "--quiet", "--no-plots", "--no-calibrate",
        "--worker-arg=--corrupt-rank", "--worker-arg=1",
    )  # fmt: skip
    assert result.returncode == 7, result.stdout + result.stderr
    summary = json.loads((bundle / "summary.json").read_text())
    (configuration,) = summary["configurations"]
    wrong = configuration["wrong"]
    assert wrong > 0 and configuration["verified"] is True
    phrase = f"policy path-pinned, all-reduce (ring), 64K: {wrong} wrong elements"
    assert f"astral: run failed: 1 configuration delivered wrong data (#wrong > 0): {phrase}" in (
        result.stderr
    )
    assert f"# WRONG DATA: {phrase}" in result.stdout
    assert "# Out of bounds values : " + str(wrong) + " FAILED" in result.stdout
    assert "Traceback" not in result.stderr
    # the bundle is whole and says the same
    assert summary["run"]["status"] == "failed"
    assert (bundle / "tables" / "path-pinned__all-reduce-ring.txt").is_file()
    run = json.loads((bundle / "run.json").read_text())
    assert run["status"] == "failed" and phrase in run["error"] and run["failure"] is None
    # every fabric connection got its pinned source port, and the count says so
    assert configuration["unpinned_connections"] == 0
    assert "# path-pinned: source ports planned, all-reduce (ring) 8 of 8" in result.stdout
    # the workers' minimum RTO, as this kernel grants it (orchestrator/worker/rto.py)
    granted = rto.probe()[1]
    floors = run["conditions"]["tcp_rto_min"]
    assert floors["connections"] == 8 + 8  # 4 fabric + 4 NVLink ring hops, 2 channels each
    assert floors["in_effect"] == (floors["connections"] if granted else 0)
    assert ("WARNING: the 5 ms minimum RTO" in result.stdout) is (granted is None)
