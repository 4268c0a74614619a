"""The monitor's bundle layers, its queries, its fault section, its plots and its live view.

A synthetic but consistent run on astral-small: rank 0 (p0s0g0) and rank 7 (p1s1g1) talk
over two pinned paths (the controller's own path computation, controllers.pinning), every
connection carries 1000 bytes per 10 ms sample and every link direction's counter grows
by 50 kB per 0.5 s poll (100 kB/s), so bytes on a link in an interval are known by hand.
A link-slow fault on p0r0a0-c0 from T0+3 s to T0+6 s doubles rank 0's operation times,
raises its connection's RTT from 1 to 5 ms and retransmits 7 segments. The live view is
drawn from files in the shapes a run writes, once through the library and once by the real
``astral top`` in a pseudo-terminal.
"""

from __future__ import annotations

import itertools
import json
import os
import pty
import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controllers.counters import (
    PortSample,
    StatsRound,
    SwitchSample,
    dumps,
    encode_round,
    header_record,
)
from controllers.events import EventsHandler, event, read_events
from controllers.pinning import PinnedPaths
from orchestrator.monitor import live, queries, record
from orchestrator.monitor.faultreport import fault_section
from orchestrator.monitor.plots import render_monitor_plots
from orchestrator.results import IterationRecord, PortCounter, ResultsBundle, ResultsWriter
from orchestrator.results.plots import fault_rows, link_directions
from orchestrator.results.report import render_bundle
from orchestrator.results.store import (
    DATABASE,
    SCHEMA_VERSION,
    ConnectionRecord,
    ConnectionSample,
    HostCpu,
    StepRecord,
    TcpInfoSample,
    Versions,
)
from orchestrator.testbed.cpuload import CpuSample, host_intervals
from orchestrator.testbed.pinning import Candidate
from tests.helpers import REPO, preset_description
from topologies.errors import ResultsError
from topologies.fivetuple import FiveTuple

T0 = 1_780_000_000.0
DESCRIPTION = preset_description("astral-small")
FABRIC = DESCRIPTION.fabric
SRC, DST = "p0s0g0", "p1s1g1"  # ranks 0 and 7
TARGET = "p0r0a0-c0"
PINNED = PinnedPaths(DESCRIPTION)
FORWARD = PINNED.paths(SRC, DST, 1)[0][1]  # p0s0g0 p0r0t0 p0r0a0 c0 p1r1a0 p1r1t0 p1s1g1
BACKWARD = PINNED.paths(DST, SRC, 1)[0][1]
IP = {name: DESCRIPTION.addresses[name].fabric_ip for name in (SRC, DST)}
A = FiveTuple(IP[SRC], 50001, IP[DST], 47000)  # 0 -> 7
B = FiveTuple(IP[DST], 50002, IP[SRC], 47000)  # 7 -> 0
TINY = {
    "policy": "path-pinned",
    "collective": "all-to-all",
    "algorithm": "direct",
    "size": 65536,
    "count": 16384,
    "dtype": "uint32",
    "ranks": 8,
    "iterations": 6,
    "warmup": 0,
    "host_ports": "balanced",
}


def pairs(nodes: list[str]) -> set[tuple[str, str]]:
    return set(itertools.pairwise(nodes))


@pytest.fixture
def bundle_path(tmp_path: Path) -> Path:
    path = tmp_path / "bundle"
    with ResultsWriter(path, DESCRIPTION) as w:
        w.add_run(experiment="unit", host="h", versions=Versions("a", "b", "c", "d"))
        config = w.add_configuration(**TINY)
        records, steps = [], []
        for i in range(6):
            for rank in (0, 7):
                slow = rank == 0 and i >= 3  # the fault's interval: rank 0 twice as slow
                time_us = 200_000.0 * (2 if slow else 1)
                start = T0 + i + 0.1
                records.append(IterationRecord(i, rank, time_us, 1000, 0, False, start))
                peer = 7 - rank
                steps.append(
                    StepRecord(i, rank, 0, "exchange", start, start + time_us / 1e6, (peer,),
                               (peer,), 1000, 1000)
                )  # fmt: skip
        w.add_iterations(config, records)
        w.add_steps(config, steps)
        w.add_connections(  # both ends of both connections
            config,
            [
                ConnectionRecord(rank, five, src, dst, 0, "fabric")
                for five, src, dst in ((A, 0, 7), (B, 7, 0))
                for rank in (src, dst)
            ],
        )
        samples = [
            ConnectionSample(rank, five, T0 + k * 0.01, 1000)
            for k in range(1, 601)
            for rank, five in ((0, A), (7, B))
        ]
        w.add_samples(config, samples)
        w.add_tcp_info(
            config,
            [
                TcpInfoSample(0, A, T0 + k * 0.1, 5000 if k >= 30 else 1000, 100, 10, 20,
                              7 if k >= 45 else 0, 0, 1)
                for k in range(1, 60)
            ],
        )  # fmt: skip
        for five, src, nodes in ((A, 0, FORWARD), (B, 7, BACKWARD)):
            hops = record.path_hops(FABRIC, Candidate(0, 1, tuple(nodes)))
            w.add_path(w.connection_id(config, src, five), hops)
        counters = []
        for k in range(0, 15):
            for d in link_directions(w.fabric):
                moved = 50_000 * k
                drops = 3 * max(0, k - 6) if d.label == "p0r0a0 > c0" else 0
                counters.append(
                    PortCounter(T0 + 0.5 * k, d.switch, d.port, moved, moved, k, k, drops)
                )
        unique = {(c.switch, c.port, c.t): c for c in counters}  # one row per port and time
        w.add_port_counters(unique.values())
        w.confirm_paths()
        w.add_host_cpu([HostCpu(T0 + k, T0 + k + 1, 0.5, 0.9, 0.01, 0.0, 0.05, 0.4)
                        for k in range(7)])  # fmt: skip
        w.finish()
    with sqlite3.connect(path / DATABASE) as db:  # as the fault scheduler writes it
        db.execute(
            "INSERT INTO faults (id, run_id, kind, target, params, scheduled, applied, undone,"
            " error) VALUES (1, 1, 'link-slow', ?, '{\"rate\": 0.25}', ?, ?, ?, NULL)",
            (TARGET, T0 + 3.0 - 0.02, T0 + 3.0, T0 + 6.0),
        )
    return path


# --- the schema ------------------------------------------------------------------------------


def test_path_hops_name_the_ports_the_fabric_model_gives() -> None:
    hops = record.path_hops(FABRIC, Candidate(0, 1, tuple(FORWARD)))
    assert [h.node for h in hops] == FORWARD
    assert {h.source for h in hops} == {record.PINNED}
    assert hops[0].in_port is None and hops[0].out_port == 1 and hops[-1].out_port is None
    for a, b in itertools.pairwise(hops):  # a leaves by the port b enters by, on one link
        link = next(x for x in FABRIC.links_of(a.node) if x.other(a.node) == b.node
                    and x.port_of(a.node) == a.out_port)  # fmt: skip
        assert link.port_of(b.node) == b.in_port
    first = record.path_hops(FABRIC, Candidate(0, 2, (SRC, FORWARD[1])))
    assert {h.source for h in first} == {record.FIRST_HOP}


def test_version_3_layers_read_back(bundle_path: Path) -> None:
    with ResultsBundle.open(bundle_path) as b:
        assert b.version == SCHEMA_VERSION
        (config,) = b.configurations()
        assert len(b.steps(config.id)) == 12
        assert b.iterations(config.id)[0].start == pytest.approx(T0 + 0.1)
        ends = {(c.rank, c.src_rank, c.dst_rank) for c in b.connections(config.id)}
        assert ends == {(0, 0, 7), (7, 0, 7), (7, 7, 0), (0, 7, 0)}
        sender = next(c for c in b.connections() if c.five_tuple == A and c.rank == 0)
        assert [s.rtt_us for s in b.tcp_info(sender.id)][:2] == [1000, 1000]
        path = b.paths()[sender.id]
        assert [h.node for h in path] == FORWARD
        # the counters confirm every hop: each direction counted 100 kB/s over the
        # connection's 6 s (from the poll at T0 to the one at T0 + 6.0)
        assert [h.counter_bytes for h in path[:-1]] == [600_000] * (len(FORWARD) - 1)
        assert path[-1].counter_bytes is None
        assert len(b.host_cpu()) == 7
        assert b.faults()[0].params == {"rate": 0.25}


def test_an_older_bundle_reads_the_monitor_tables_as_empty(bundle_path: Path) -> None:
    with sqlite3.connect(bundle_path / DATABASE) as db:
        for table in ("steps", "tcp_info", "connection_paths", "controller_events",
                      "host_cpu", "faults", "controller_restarts"):  # fmt: skip
            db.execute(f"DROP TABLE {table}")
        db.execute("PRAGMA user_version = 2")
    with ResultsBundle.open(bundle_path) as b:
        (config,) = b.configurations()
        assert b.steps(config.id) == [] and b.paths() == {} and b.faults() == []
        assert b.controller_events() == [] and b.host_cpu() == []
        assert b.controller_restarts() is None  # not recorded, rather than none made
        assert b.tcp_info(1) == []
        assert {c.src_rank for c in b.connections()} == {None}
        assert b.iterations(config.id)[0].start is None
        assert fault_section(b) == []


# --- queries ---------------------------------------------------------------------------------


def test_what_crossed_a_link_between_two_instants(bundle_path: Path) -> None:
    with ResultsBundle.open(bundle_path) as b:
        traffic = queries.link_traffic(b, TARGET, T0 + 1.0, T0 + 2.0)
        by_label = {t.direction.label: t for t in traffic}
        assert set(by_label) == {"p0r0a0>c0", "c0>p0r0a0"}
        for label, t in by_label.items():
            src, dst = label.split(">")
            expected = {five for five, nodes in ((A, FORWARD), (B, BACKWARD))
                        if (src, dst) in pairs(nodes)}  # fmt: skip
            assert {c.five_tuple for c in t.connections} == expected
            assert all(c.bytes == 100 * 1000 for c in t.connections)  # 100 samples in (1, 2]
            assert t.counter_bytes == 100_000  # polls at 1.0 and 2.0: 2 x 50 kB
        assert "p0r0a0>c0" in {d.label for d in queries.target_directions(b, "p0r0a0>c0")}
        assert len(queries.target_directions(b, "c0")) == 2 * len(
            [x for x in FABRIC.links_of("c0")]
        )
        with pytest.raises(ResultsError, match="no-such-link"):
            queries.link_traffic(b, "no-such-link", T0, T0 + 1)


def test_which_links_a_ranks_slow_step_used(bundle_path: Path) -> None:
    with ResultsBundle.open(bundle_path) as b:
        (config,) = b.configurations()
        used = queries.step_links(b, config.id, rank=0)
        assert used is not None
        assert (used.step.iteration, used.step.step) == (3, 0)  # the first slowed one
        measured = set(queries.directions(b.fabric))
        expected = (pairs(FORWARD) | pairs(BACKWARD)) & measured
        assert {(t.direction.src, t.direction.dst) for t in used.links} == expected
        assert {c.five_tuple for c in used.connections} == {A, B}
        for t in used.links:  # 0.4 s of the step: the counters around it span 0.5 s or 1 s
            assert t.counter_bytes in (50_000, 100_000)
        named = queries.step_links(b, config.id, rank=7, iteration=1, step=0)
        assert named is not None and named.step.rank == 7 and named.step.iteration == 1
        assert queries.step_links(b, config.id, rank=3) is None


# --- the fault section and the plots ---------------------------------------------------------


def test_the_fault_section_says_what_each_layer_saw(bundle_path: Path) -> None:
    with ResultsBundle.open(bundle_path) as b:
        text = "\n".join(fault_section(b))
    assert "fault 1: link-slow on p0r0a0-c0 (rate 0.25)" in text
    assert "applied +2.900 s (20 ms after its schedule), undone +5.900 s" in text
    assert "slowed most: rank 0 2.00x, rank 7 1.00x" in text
    # before: T0 + 0..3 (RTT 1 ms, no retransmission); during: T0 + 3..6 (5 ms, 7)
    assert "connections cross the target: retransmissions 0 before, 7 during" in text
    assert "mean RTT 1.00 ms before, 5.00 ms during" in text
    assert "p0r0a0>c0" in text and "drops during" in text
    assert "host: before: idle 50%, ovs-vswitchd 0.90 cores" in text


def test_monitor_plots_are_written(bundle_path: Path) -> None:
    with ResultsBundle.open(bundle_path) as b:
        written = render_monitor_plots(b)
    names = {p.relative_to(bundle_path / "plots").as_posix() for p in written}
    assert names == {"gantt.png", "faults/fault-1-link-slow.png"}
    # the results' own heat map, with the fault's interval and target marked on it
    heat = [p for p in render_bundle(bundle_path).files if p.name == "link-utilization.png"]
    for path in [*written, *heat]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(heat) == 1
    labels = [d.label for d in link_directions(DESCRIPTION.to_dict())]
    rows = fault_rows(TARGET, labels)
    assert sorted(labels[r] for r in rows) == ["c0 > p0r0a0", "p0r0a0 > c0"]
    assert len(fault_rows("c0", labels)) == 2 * len(FABRIC.links_of("c0"))


# --- host and controller layers --------------------------------------------------------------


def test_host_intervals_come_from_consecutive_samples() -> None:
    samples = [
        CpuSample(T0, 100, 1000, 0, groups=(("controller", 0), ("workers", 0))),
        CpuSample(T0 + 1, 150, 1200, 100, groups=(("controller", 10), ("workers", 50))),
        CpuSample(T0 + 2, 150, 1400, 200),  # groups not watched
    ]
    first, second = host_intervals(samples, ticks_per_second=100)
    assert first.idle_share == pytest.approx(0.75) and first.vswitchd_cores == pytest.approx(1)
    assert first.controller_cores == pytest.approx(0.1)
    assert first.workers_cores == pytest.approx(0.5)
    assert second.controller_cores is None and second.idle_share == pytest.approx(1.0)


def test_the_controllers_events_file_keeps_each_records_kind(tmp_path: Path) -> None:
    import logging

    logger = logging.getLogger("test-monitor-events")
    handler = EventsHandler(tmp_path / "events.jsonl")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("%s port %d %s", "p0r0t0", 3, "down", extra=event("port-down", "p0r0t0", 3))
        logger.info("plain line")
    finally:
        logger.removeHandler(handler)
        handler.close()
    down, plain = read_events(tmp_path / "events.jsonl")
    assert (down["event"], down["switch"], down["port"]) == ("port-down", "p0r0t0", 3)
    assert down["message"] == "p0r0t0 port 3 down" and plain["event"] is None
    events = record.controller_events(tmp_path / "events.jsonl")
    assert [e.kind for e in events] == ["port-down", "log"]
    assert record.controller_events(tmp_path / "events.jsonl", since=time.time() + 1) == []


# --- the live view ---------------------------------------------------------------------------


def write_run_dir(run_dir: Path, done: tuple[int, int] = (3, 1)) -> None:
    """A run directory as a run in progress leaves it: progress, two counter polls (the
    target link full and dropping), a fault applied, a controller event."""
    run_dir.mkdir(parents=True, exist_ok=True)
    DESCRIPTION.write(run_dir / live.FABRIC_NAME)
    now = time.time()
    progress = {
        "t": now,
        "operation": {"collective": "all-reduce", "algorithm": "ring", "size": 1 << 20,
                      "warmup": False, "first": 1, "count": 5, "since": now - 1},
        "ranks": {
            "0": {"host": SRC, "done": done[0], "busy": True, "iteration": 4, "step": 3,
                  "phase": "all-gather", "elapsed": 0.2, "waiting_on": [], "failed": False},
            "1": {"host": "p0s0g1", "done": done[1], "busy": True, "iteration": 2, "step": 5,
                  "phase": "reduce-scatter", "elapsed": 2.5, "waiting_on": [0],
                  "failed": False},
        },
    }  # fmt: skip
    (run_dir / live.LIVE_NAME).write_text(json.dumps(progress))
    target = next(d for d in link_directions(DESCRIPTION.to_dict()) if d.label == "p0r0a0 > c0")
    rate = target.capacity / 8  # bytes/s: exactly its capacity
    lines = [dumps(header_record(now - 2, "astral-small", "ecmp", 0.5, {"p0r0a0": 9}, 1))]
    for k, t in enumerate((now - 1.0, now - 0.5)):
        port = PortSample(target.port, 0, 0, 0, int(rate * 0.5 * k), 0, 4 * k, 0, 0, 1 + k / 2)
        switch = SwitchSample("p0r0a0", 9, t, (port,))
        lines.append(dumps(encode_round(StatsRound(k, t, {"p0r0a0": switch}))))
    (run_dir / live.TELEMETRY_NAME).write_text("\n".join(lines) + "\n")
    fault = {"id": 1, "kind": "link-slow", "target": TARGET, "event": "applied",
             "t": now - 0.8, "scheduled": now - 0.82, "detail": "rate x0.25"}  # fmt: skip
    (run_dir / live.FAULTS_NAME).write_text(json.dumps(fault) + "\n")
    down = {"t": now - 0.7, "level": "INFO", "event": "port-down", "switch": "p0r0t0",
            "port": 3, "message": "p0r0t0 port 3 down"}  # fmt: skip
    (run_dir / live.EVENTS_NAME).write_text(json.dumps(down) + "\n")


def test_the_live_view_shows_progress_links_faults_and_alerts(tmp_path: Path) -> None:
    from rich.console import Console

    write_run_dir(tmp_path / "run")
    source = live.LiveSource(tmp_path / "run")
    state = live.snapshot(source)
    (link,) = state.links
    assert link.label == "p0r0a0 > c0" and link.utilization == pytest.approx(1.0, rel=0.01)
    assert link.drops == 4
    assert [f.id for f in state.faults] == [1]
    assert live.rank_lag(state.progress or {}) == {"0": 0, "1": 2}
    alerts = "\n".join(state.alerts)
    assert "fault 1 link-slow on p0r0a0-c0 applied" in alerts
    assert "controller: p0r0t0 port 3 down" in alerts
    assert "p0r0a0 > c0: 4 drops" in alerts and "p0r0a0 > c0 at 100% of its capacity" in alerts
    assert "rank 1 (p0s0g1) waits 2.5 s on 0 in step 5" in alerts
    console = Console(record=True, width=140)
    console.print(live.render(state))
    text = console.export_text()
    assert "operation: all-reduce (ring) 1M, timed batch of 5 from iteration 1" in text
    assert "all-gather" in text and "3/5" in text
    assert "#1 link-slow on p0r0a0-c0" in text
    # an undone fault leaves the active list; nothing new: the alerts are not repeated
    with open(tmp_path / "run" / live.FAULTS_NAME, "a") as out:
        out.write(json.dumps({"id": 1, "kind": "link-slow", "target": TARGET,
                              "event": "undone", "t": time.time()}) + "\n")  # fmt: skip
    again = live.snapshot(source)
    assert again.faults == [] and again.alerts.count(state.alerts[0]) == 1


def read_pty(fd: int, seconds: float) -> str:
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
    return out.decode("utf-8", "replace")


def wait_reading(process: subprocess.Popen[bytes], fd: int, seconds: float) -> int:
    """``process``'s exit status, reading its terminal meanwhile as a terminal would: a
    view interrupted mid-frame writes its last frame on the way out, and a pseudo-terminal
    nobody reads blocks that write once its buffer is full (the process then never exits)."""
    deadline = time.monotonic() + seconds
    while process.poll() is None and time.monotonic() < deadline:
        read_pty(fd, 0.1)
    return process.wait(timeout=max(0.0, deadline - time.monotonic()) + 0.1)


def test_astral_top_draws_in_a_pseudo_terminal_and_redraws(tmp_path: Path) -> None:
    write_run_dir(tmp_path / "run")
    main, secondary = pty.openpty()
    env = {**os.environ, "COLUMNS": "140", "LINES": "60", "TERM": "xterm-256color"}
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "top", str(tmp_path / "run")],
        stdin=secondary, stdout=secondary, stderr=secondary, cwd=REPO, env=env,
        start_new_session=True,
    )  # fmt: skip
    os.close(secondary)
    try:
        first = read_pty(main, 5.0)  # the interpreter starts (slowly on a busy machine)
        assert "astral top" in first and "busiest links" in first
        assert "p0r0a0 > c0" in first and "link-slow on p0r0a0-c0" in first
        write_run_dir(tmp_path / "run", done=(5, 4))  # the ranks move on
        later = read_pty(main, 3.0)
        # it redraws by itself (every 0.4 s: 7 frames in 3 s; at least 3 even when the
        # machine is busy), erasing the previous frame first, and shows what changed
        assert later.count("\x1b[2K") and later.count("astral top") >= 3
        assert "5/5" in later
    finally:
        os.killpg(process.pid, signal.SIGINT)
        status = wait_reading(process, main, 10.0)
        os.close(main)
    assert status == 0


def test_astral_top_refuses_a_missing_directory(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "top", str(tmp_path / "nope"), "--once"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "a run's directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_astral_report_prints_the_fault_section(
    bundle_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    assert main(["report", str(bundle_path), "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert "# faults: 1 injected" in printed and "#     application:" in printed
    with sqlite3.connect(bundle_path / DATABASE) as db:
        db.execute("DELETE FROM faults")
    assert main(["report", str(bundle_path), "--no-plots"]) == 0
    assert "# faults:" not in capsys.readouterr().out  # no rows: no section
