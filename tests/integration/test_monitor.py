"""The monitor on a real run: ``astral run --live`` in a pseudo-terminal on astral-small.

One short run (path-pinned, ring all-reduce at 256K and 1M, 2 iterations) through the real
command line, its terminal a pty: the live view must draw while the run goes, and the
bundle it leaves must hold all four layers of the monitor, filled from the real fabric:
every rank's steps; the senders' TCP_INFO and every fabric connection's pinned path, its
hops confirmed by the switch counters; port counters at 0.5 s; the controller's events
from its bring-up; the CPU of the machine, ovs-vswitchd, the controller and the workers
per interval; the logs. Then ``astral report`` renders the monitor's plots.

Needs root and Open vSwitch (tests/conftest.py skips or, under CI, fails without them). A
run waits for the astral run lock if another run holds it.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path
from statistics import median

import pytest

from orchestrator.results import ResultsBundle
from tests.helpers import REPO

pytestmark = pytest.mark.integration

EXPERIMENT = """\
name: it-monitor
fabric: astral-small
policies: [path-pinned]
collectives: [all-reduce]
sizes: {min: 256K, max: 1M, factor: 4}
iterations: 2
warmup: 1
monitor: full
"""
LOCK_WAIT = 600.0
RUN_TIMEOUT = 900.0


def run_in_pty(argv: list[str], timeout: float) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as its terminal; its exit status and output."""
    main, secondary = pty.openpty()
    env = {**os.environ, "COLUMNS": "150", "LINES": "80", "TERM": "xterm-256color"}
    process = subprocess.Popen(
        argv, stdin=secondary, stdout=secondary, stderr=secondary, cwd=REPO, env=env
    )
    os.close(secondary)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif process.poll() is not None:
                break
    finally:
        if process.poll() is None:
            process.terminate()
        status = process.wait(timeout=120)
        os.close(main)
    return status, out.decode("utf-8", "replace")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    base = tmp_path_factory.mktemp("monitor")
    experiment = base / "monitor.yaml"
    experiment.write_text(EXPERIMENT)
    out = base / "bundle"
    argv = [sys.executable, "-m", "orchestrator.cli", "run", str(experiment), "--out", str(out),
            "--live", "--no-calibrate", "--no-plots", "--lock-wait", str(LOCK_WAIT)]  # fmt: skip
    status, text = run_in_pty(argv, LOCK_WAIT + RUN_TIMEOUT)
    assert status == 0, text[-3000:]
    return out, text


def test_the_live_view_draws_while_the_run_goes(bundle: tuple[Path, str]) -> None:
    _, text = bundle
    assert "astral top" in text and "busiest links" in text
    assert "operation: all-reduce (ring)" in text  # a batch was running when it drew
    assert "# astral run 'it-monitor': ok" in text  # the run's own output above it


def test_the_bundle_holds_all_four_layers(bundle: tuple[Path, str]) -> None:
    path, _ = bundle
    with ResultsBundle.open(path) as b:
        configs = b.configurations()
        assert len(configs) == 2
        # application: every rank's every step, with its ring peers
        for c in configs:
            steps = b.steps(c.id)
            ops = b.iterations(c.id)
            assert all(r.start is not None for r in ops)
            ring = [s for s in steps if s.phase in ("reduce-scatter", "all-gather")]
            assert len(ring) == len(ops) * 2 * (c.ranks - 1)
        # transport: TCP_INFO of the senders; pinned paths, confirmed by the counters
        senders = [x for x in b.connections() if x.rank == x.src_rank and x.link == "fabric"]
        assert senders
        info = [s for x in senders for s in b.tcp_info(x.id)]
        assert info and all(s.rtt_us > 0 for s in info)
        paths = b.paths()
        assert {x.id for x in senders} <= set(paths)
        hops = [h for x in senders for h in paths[x.id]]
        assert {h.source for h in hops} == {"pinned"}
        confirmed = [h for h in hops if h.counter_bytes is not None]
        assert confirmed and sum(h.counter_bytes > 0 for h in confirmed) >= len(confirmed) // 2
        # network: port counters at the 0.5 s poll, the controller's events from bring-up
        times: dict[tuple[str, int], list[float]] = {}
        for counter in b.port_counters():
            times.setdefault((counter.switch, counter.port), []).append(counter.t)
        gaps = [t2 - t1 for ts in times.values() for t1, t2 in pairwise(ts)]
        assert gaps and median(gaps) <= 0.55
        kinds = Counter(e.kind for e in b.controller_events())
        switches = len(b.fabric["switches"]) - len(b.fabric["servers"])  # NVLink: not OpenFlow
        assert kinds["connect"] >= switches and kinds["programmed"] >= switches
        assert kinds["log"] > 0
        # host: the machine and the emulator's processes per interval
        cpu = b.host_cpu()
        assert len(cpu) > 10
        assert any(c.vswitchd_cores > 0 for c in cpu)
        assert any((c.workers_cores or 0) > 0 for c in cpu)
        assert all(c.controller_cores is not None for c in cpu)
    logs = {p.relative_to(path / "logs").as_posix() for p in (path / "logs").rglob("*.log")}
    assert "controller.log" in logs and "workers-1/worker-0.log" in logs


def test_astral_report_renders_the_monitor_plots(bundle: tuple[Path, str]) -> None:
    path, _ = bundle
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "report", str(path)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (path / "plots" / "gantt.png").read_bytes()[:4] == b"\x89PNG"
    assert "# faults:" not in done.stdout  # no faults injected: no fault section
