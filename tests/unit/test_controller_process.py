"""ControllerProcess without switches: start, status, timeouts, restart, stop, crash cleanup.

These start real controller processes (no root, no Open vSwitch): about a second each.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controllers.status import EXIT_LISTEN_FAILED
from orchestrator.emulation.controller import ControllerProcess, proc_starttime, stop_recorded
from tests.helpers import preset_description
from topologies.errors import EmulationError


@pytest.fixture
def fabric_json(tmp_path: Path) -> Path:
    desc = preset_description("astral-small")
    return desc.write(tmp_path / "fabric.json")


def test_start_status_restart_stop(fabric_json: Path, tmp_path: Path) -> None:
    started: list[tuple[int | None, int | None]] = []
    controller = ControllerProcess(
        fabric_json, tmp_path / "run", on_start=lambda c: started.append((c.pid, c.starttime))
    )
    with controller:
        first, first_start = controller.pid, controller.starttime
        assert first is not None and first_start == proc_starttime(first) is not None
        status = controller.status()
        assert status is not None and status.listening and status.state == "running"
        assert (status.listen_host, status.listen_port) == ("127.0.0.1", controller.port)
        assert status.expected_dpids == list(range(5, 25))  # every switch but NVLink
        assert status.missing() == status.expected_dpids
        with pytest.raises(EmulationError, match=r"not programmed after 0.2 s \(dpids \[5"):
            controller.wait_programmed(timeout=0.2)
        port = controller.port
        controller.restart()
        assert controller.port == port and controller.pid != first
        assert started == [(first, first_start), (controller.pid, controller.starttime)]
    assert controller.pid is None and not controller.running()
    assert controller.stop() is None, "stop is idempotent"
    log = controller.log_path.read_text()
    assert log.count("starting:") == 2 and "controller stopped (exit status 0)" in log


def test_taken_port_is_reported_with_the_log(fabric_json: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        controller = ControllerProcess(fabric_json, tmp_path / "run", port=port)
        with pytest.raises(EmulationError, match=f"exit status {EXIT_LISTEN_FAILED}"):
            controller.start()
    assert not controller.running()


def test_bad_description_fails_fast(tmp_path: Path) -> None:
    bad = tmp_path / "fabric.json"
    bad.write_text("{}")
    with pytest.raises(EmulationError, match="exit status 2"):
        ControllerProcess(bad, tmp_path / "run").start()


def test_wait_programmed_notices_a_dead_controller(fabric_json: Path, tmp_path: Path) -> None:
    with ControllerProcess(fabric_json, tmp_path / "run") as controller:
        assert controller.pid is not None
        os.kill(controller.pid, signal.SIGKILL)
        with pytest.raises(EmulationError, match="exited with status -9"):
            controller.wait_programmed(timeout=10)


def test_stop_recorded_checks_the_start_time() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        start = proc_starttime(proc.pid)
        assert start is not None
        assert not stop_recorded(proc.pid, start + 1), "a different start time: not ours"
        assert proc.poll() is None
        began = time.monotonic()
        assert stop_recorded(proc.pid, start, timeout=5)
        assert time.monotonic() - began < 2, "an exited (zombie) process counts as stopped"
        assert proc.wait(5) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
