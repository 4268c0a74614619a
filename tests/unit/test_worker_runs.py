"""Workers as real processes over real TCP on 127.0.0.x, coordinated by the launcher.

Every collective with 2, 3 and 4 ranks (and 8 for the all-reduces and PXN) must verify
with #wrong == 0 and move exactly the bytes its plan prescribes on every rank in every
iteration; faults (a corrupted chunk, a killed, hung or frozen worker) must be detected
and blamed on the right rank within seconds.
"""

from __future__ import annotations

import itertools
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from orchestrator.collectives.latency import LatencyTable
from orchestrator.collectives.nccl import format_row, format_table
from orchestrator.collectives.plans import ELEMENT_BYTES, default_registry
from orchestrator.worker import protocol
from orchestrator.worker.launcher import Launcher, _Link
from orchestrator.worker.outcome import (
    CollectiveResult,
    IterationResult,
    RankIteration,
    RunResult,
    phase_spans,
)
from orchestrator.worker.spec import (
    CollectiveTest,
    loopback_workers,
    workers_from_description,
)
from tests.helpers import fast_options, preset_description
from topologies.errors import EmulationError, ExperimentError

ALGORITHMS = [tuple(name.split("/")) for name in default_registry().names()]
SIZES = (3 << 14, 40_004)  # a multiple of 2, 3, 4 and 8 ranks x 4 bytes, and not
LAYOUTS = {2: 1, 3: 1, 4: 2}  # ranks -> GPUs per server (3 x 1 is fabric only, 2 x 2 both)


@cache
def run_everything(ranks: int, gpus_per_server: int) -> RunResult:
    tests = [
        CollectiveTest(c, a, size)
        for c, a in ALGORITHMS
        if c != "p2p" or ranks == 2
        for size in SIZES
    ]
    with Launcher(loopback_workers(ranks, gpus_per_server), options=fast_options()) as launcher:
        result = launcher.run(tests)
    return result  # closed: the final samples are in


@cache
def run_eight() -> RunResult:
    tests = [
        CollectiveTest("all-reduce", "ring", 1 << 18),
        CollectiveTest("all-reduce", "hierarchical", 1 << 18),
        CollectiveTest("all-to-all", "pxn", 1 << 18),
    ]
    with Launcher(loopback_workers(8, 4), options=fast_options()) as launcher:
        return launcher.run(tests)


def results() -> Iterator[tuple[int, CollectiveResult, RunResult]]:
    for ranks, g in LAYOUTS.items():
        run = run_everything(ranks, g)
        for test in run.tests:
            yield ranks, test, run
    run = run_eight()
    for test in run.tests:
        yield 8, test, run


def case_ids() -> list[str]:
    ids = [
        f"n{n}-{c}-{a}-{s}"
        for n in LAYOUTS
        for c, a in ALGORITHMS
        if c != "p2p" or n == 2
        for s in SIZES
    ]
    return [*ids, "n8-all-reduce-ring", "n8-all-reduce-hierarchical", "n8-all-to-all-pxn"]


@pytest.mark.parametrize("index", range(len(case_ids())), ids=case_ids())
def test_collective_verifies_and_moves_the_prescribed_bytes(index: int) -> None:
    ranks, test, run = list(results())[index]
    assert run.failure is None, str(run.failure)
    assert len(test.iterations) == 3
    for iteration in test.iterations:
        assert sorted(iteration.ranks) == list(range(ranks))
        for r in iteration.ranks.values():
            assert r.wrong == 0, f"rank {r.rank} iteration {iteration.iteration}"
            assert r.sent == test.expected_sent[r.rank]
            assert r.time_us > 0
            # [verify between two operations of a batch], the plan's steps, [delivery]
            steps = [p.step for p in r.phases if p.phase not in ("verify", "delivery")]
            assert steps == list(range(len(steps)))
            extra = [(p.phase, p.step) for p in r.phases if p.phase in ("verify", "delivery")]
            assert extra in (
                [("verify", -1), ("delivery", len(steps))],
                [("delivery", len(steps))],
                [("verify", -1)],
                [],
            )
            if r.sent:
                assert r.phases[-1].phase == "delivery"
            assert r.phases[-1].end <= r.start + r.time_us / 1e6 + 1e-6
            spans = phase_spans(r.phases)
            assert all(a.end <= b.start for a, b in itertools.pairwise(spans))
        total_sent = sum(r.sent for r in iteration.ranks.values())
        assert total_sent == sum(r.received for r in iteration.ranks.values())
    row = test.row()
    assert row.wrong == 0 and row.size == test.size and row.algbw > 0


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_iterations_run_as_nccl_tests_batches(ranks: int) -> None:
    """Warm-up and timed iterations are two batches: every rank begins a batch at the same
    instant, and within a batch each operation counts from the end of the previous one on
    that rank (no barrier between them), so a rank's times add up to its batch."""
    run = run_eight() if ranks == 8 else run_everything(ranks, LAYOUTS[ranks])
    for test in run.tests:
        warmup = [i for i in test.iterations if i.warmup]
        timed = [i for i in test.iterations if not i.warmup]
        assert len(warmup) == 1 and len(timed) == 2
        for batch in (warmup, timed):
            first = batch[0].ranks
            assert len({r.start for r in first.values()}) == 1, "one common start per batch"
            for before, after in itertools.pairwise(batch):
                for rank, r in after.ranks.items():
                    previous = before.ranks[rank]
                    end = previous.start + previous.time_us / 1e6
                    assert r.start == pytest.approx(end, abs=1e-6)
        # the timed batch begins after every rank finished the warm-up
        warm_end = max(r.start + r.time_us / 1e6 for r in warmup[0].ranks.values())
        assert next(iter(timed[0].ranks.values())).start >= warm_end


def test_timed_iterations_in_batches_of_one_each_start_together() -> None:
    """``timed_batch=1`` (a workload replay's): every timed iteration is a batch of its
    own, after a barrier, all ranks starting it at one instant."""
    options = replace(fast_options(), iterations=3, max_iterations=3, timed_batch=1)
    with Launcher(loopback_workers(4, 2), options=options) as launcher:
        run = launcher.run([CollectiveTest("all-reduce", "ring", 1 << 16)])
    (test,) = run.tests
    timed = [i for i in test.iterations if not i.warmup]
    assert [i.iteration for i in timed] == [1, 2, 3]
    for before, after in itertools.pairwise(timed):
        assert len({r.start for r in after.ranks.values()}) == 1, "one common start each"
        end = max(r.start + r.time_us / 1e6 for r in before.ranks.values())
        assert next(iter(after.ranks.values())).start >= end
    assert test.row().wrong == 0


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_ring_all_reduce_sends_2_n_minus_1_over_n_of_the_buffer(ranks: int) -> None:
    run = run_eight() if ranks == 8 else run_everything(ranks, LAYOUTS[ranks])
    test = next(
        t for t in run.tests if t.test.collective == "all-reduce" and t.test.algorithm == "ring"
    )
    assert test.size % (ranks * ELEMENT_BYTES) == 0
    for iteration in test.iterations:
        assert {r.sent for r in iteration.ranks.values()} == {2 * (ranks - 1) * test.size // ranks}


def test_connections_use_nvlink_inside_a_server_and_report_five_tuples() -> None:
    run = run_everything(4, 2)
    workers = {w.rank: w for w in loopback_workers(4, 2)}
    assert run.connections
    for c in run.connections:
        same_server = workers[c.src].server == workers[c.dst].server
        assert c.link == ("nvlink" if same_server else "fabric")
        src, dst = workers[c.src], workers[c.dst]
        ips = (src.nvlink_ip, dst.nvlink_ip) if same_server else (src.fabric_ip, dst.fabric_ip)
        assert (c.five_tuple.src_ip, c.five_tuple.dst_ip) == ips
        assert c.five_tuple.src_port > 0 and c.five_tuple.dst_port > 0


def test_throughput_samples_add_up_to_the_bytes_moved() -> None:
    run = run_everything(4, 2)
    app_sent: dict[tuple[int, int, int], int] = {}
    app_received: dict[tuple[int, int, int], int] = {}
    for test in run.tests:
        for iteration in test.iterations:
            for r in iteration.ranks.values():
                for c, sent, received in r.traffic:
                    key = (c.src, c.dst, c.channel)
                    app_sent[key] = app_sent.get(key, 0) + sent
                    app_received[key] = app_received.get(key, 0) + received
    sampled_tx: dict[tuple[int, int, int], int] = {}
    sampled_rx: dict[tuple[int, int, int], int] = {}
    last_t: dict[tuple[int, int, int, int], float] = {}
    for s in run.samples:
        key = (s.connection.src, s.connection.dst, s.connection.channel)
        side = sampled_tx if s.rank == s.connection.src else sampled_rx
        side[key] = side.get(key, 0) + s.bytes
        assert s.t >= last_t.get((s.rank, *key), 0.0)
        last_t[(s.rank, *key)] = s.t
    # Kernel counters since the connection opened: the sender's include the SYN and the
    # 16-byte connection hello, the receiver's the hello; a FIN adds one more.
    for key, sent in app_sent.items():
        assert sent + 17 <= sampled_tx[key] <= sent + 18, key
    for key, received in app_received.items():
        assert received + 16 <= sampled_rx[key] <= received + 17, key


def test_corrupted_chunk_is_counted_in_that_iteration_only() -> None:
    options = fast_options(
        warmup=0, iterations=3, worker_args=("--corrupt-rank", "1", "--corrupt-iteration", "1")
    )
    with Launcher(loopback_workers(3), options=options) as launcher:
        result = launcher.run([CollectiveTest("all-reduce", "ring", 1 << 16)])
    assert result.failure is None
    wrong = [i.wrong for i in result.tests[0].iterations]
    assert wrong[0] == 0 and wrong[1] > 0 and wrong[2] == 0
    assert result.rows()[0].wrong == wrong[1]
    assert "FAILED" in result.table()


def test_a_run_without_verification_says_not_verified() -> None:
    options = fast_options(
        warmup=1, iterations=2, verify=False, worker_args=("--corrupt-rank", "1")
    )
    with Launcher(loopback_workers(3), options=options) as launcher:
        result = launcher.run([CollectiveTest("all-reduce", "ring", 1 << 16)])
    assert result.failure is None
    test = result.tests[0]
    assert all(r.wrong == -1 for i in test.iterations for r in i.ranks.values())
    assert [i.wrong for i in test.iterations] == [None, None, None]  # warm-up too
    assert test.wrong is None and result.rows()[0].wrong is None
    table = result.table()
    assert "# Out of bounds values : not verified" in table  # corrupted, but unchecked
    assert " OK" not in table and "FAILED" not in table


def _long_run() -> list[CollectiveTest]:
    return [CollectiveTest("all-reduce", "ring", 1 << 16)]


def test_killed_worker_is_detected_within_seconds_and_named() -> None:
    options = fast_options(warmup=0, iterations=100_000)
    with Launcher(loopback_workers(3), options=options) as launcher:
        pid = launcher.process(1).pid
        killed_at: list[float] = []

        def kill() -> None:
            killed_at.append(time.monotonic())
            os.kill(pid, signal.SIGKILL)

        threading.Timer(0.5, kill).start()
        result = launcher.run(_long_run())
        detected = time.monotonic() - killed_at[0]
    assert result.failure is not None
    assert result.failure.kind == "exited" and result.failure.ranks == [1]
    assert "rank 1 (lo1) exited with status -9" in str(result.failure)
    assert detected < 3.0
    assert result.tests[0].iterations  # what completed is kept
    with pytest.raises(EmulationError, match="rank 1"):
        result.raise_for_failure()


def test_hung_worker_is_detected_by_the_step_deadline() -> None:
    options = fast_options(
        warmup=0, iterations=10, worker_args=("--hang-rank", "2", "--hang-at-iteration", "3")
    )
    start = time.monotonic()
    with Launcher(loopback_workers(4, 2), options=options) as launcher:
        result = launcher.run(_long_run())
    assert result.failure is not None
    assert result.failure.kind == "hung" and result.failure.ranks == [2]
    assert "iteration 3" in str(result.failure)
    assert len(result.tests[0].iterations) == 3
    assert time.monotonic() - start < 8.0


def test_frozen_worker_is_detected_by_missing_heartbeats() -> None:
    options = fast_options(warmup=0, iterations=100_000, heartbeat_timeout=1.0, step_deadline=30.0)
    with Launcher(loopback_workers(3), options=options) as launcher:
        pid = launcher.process(2).pid
        threading.Timer(0.5, os.kill, (pid, signal.SIGSTOP)).start()
        result = launcher.run(_long_run())
        status = launcher.process(2)
    assert result.failure is not None
    assert result.failure.kind == "unresponsive" and result.failure.ranks == [2]
    assert status.poll() is not None  # killed on close, although stopped


def test_worker_that_cannot_start_fails_the_launch_with_its_log() -> None:
    options = fast_options(worker_args=("--no-such-flag",))
    with (
        pytest.raises(EmulationError, match=r"exited with status 2 .*unrecognized arguments"),
        Launcher(loopback_workers(2), options=options),
    ):
        pass


def test_unknown_algorithm_or_unsupported_layout_is_an_experiment_error() -> None:
    launcher = Launcher(loopback_workers(3), options=fast_options())  # prepare needs no process
    with pytest.raises(ExperimentError, match="all-reduce/tree"):
        launcher.prepare([CollectiveTest("all-reduce", "tree", 1 << 10)])
    with pytest.raises(ExperimentError, match="at least 12 bytes"):
        launcher.prepare([CollectiveTest("all-gather", "ring", 8)])
    uneven = Launcher(
        [*loopback_workers(2, 2), *loopback_workers(3, 1)[2:]], options=fast_options()
    )  # servers s0 = {0, 1}, s2 = {2}
    with pytest.raises(ExperimentError, match="same rails"):
        uneven.prepare([CollectiveTest("all-reduce", "hierarchical", 1 << 10)])


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        port: int = s.getsockname()[1]
        return port


def test_channels_and_pinned_source_ports() -> None:
    workers = loopback_workers(2)
    pins = {
        (0, 1, 0): _free_port(workers[0].fabric_ip),
        (0, 1, 1): _free_port(workers[0].fabric_ip),
        (1, 0, 1): _free_port(workers[1].fabric_ip),
    }
    options = fast_options(channels=2, source_ports=pins)
    with Launcher(workers, options=options) as launcher:
        result = launcher.run([CollectiveTest("all-reduce", "ring", 1 << 16 | 4)])
    assert result.failure is None
    by_key = {(c.src, c.dst, c.channel): c for c in result.connections}
    assert sorted(by_key) == [(0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1)]
    for key, port in pins.items():
        assert by_key[key].five_tuple.src_port == port
    test = result.tests[0]
    for iteration in test.iterations:
        for r in iteration.ranks.values():
            assert r.wrong == 0 and r.sent == test.expected_sent[r.rank]
            assert {c.channel for c, sent, _ in r.traffic if sent} == {0, 1}


def test_nccl_row_averages_over_ranks_and_counts_the_worst_iteration() -> None:
    def iteration(i: int, warmup: bool, times: list[float], wrong: list[int]) -> IterationResult:
        ranks = {
            r: RankIteration(r, 0.0, t, w, 0, 0, (), ())
            for r, (t, w) in enumerate(zip(times, wrong, strict=True))
        }
        return IterationResult(i, warmup, ranks)

    test = CollectiveResult(CollectiveTest("all-reduce", "ring", 1 << 20), 4, 262144, {})
    test.iterations = [
        iteration(0, True, [5000, 5000, 5000, 5000], [0, 3, 0, 0]),
        iteration(1, False, [900, 1000, 950, 990], [0, 0, 0, 0]),
        iteration(2, False, [1100, 1200, 1000, 1000], [0, 0, 0, 0]),
    ]
    # nccl-tests -a 1: time = mean(mean(900, 1000, 950, 990), mean(1100, 1200, 1000, 1000))
    # = mean(960, 1075) = 1017.5 us; algbw = 1048576 B / 1017.5 us = 1.030542 GB/s;
    # busbw = algbw * 2 * 3 / 4 = 1.545812 GB/s; #wrong = 3 (warm-up counts)
    row = test.row()
    assert format_row(row) == (
        "     1048576        262144    uint32     sum      -1      1017.5    1.030542"
        "    1.545812       3"
    )
    gather = CollectiveResult(CollectiveTest("all-gather", "ring", 1 << 20), 4, 262144, {})
    gather.iterations = [iteration(0, False, [2000, 2000, 2000, 2000], [0, 0, 0, 0])]
    # per-rank count column; algbw = 0.524288 GB/s; busbw = algbw * 3 / 4 = 0.393216
    assert format_row(gather.row()).split() == [
        "1048576",
        "65536",
        "uint32",
        "none",
        "-1",
        "2000.0",
        "0.524288",
        "0.393216",
        "0",
    ]
    table = format_table([row, gather.row()])
    assert table.splitlines()[-1] == "# Avg bus bandwidth    : 0.969514"


def test_workers_exit_when_their_launcher_dies(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from orchestrator.worker.launcher import Launcher\n"
        "from orchestrator.worker.spec import CollectiveTest, LaunchOptions, loopback_workers\n"
        "options = LaunchOptions(iterations=10**6)\n"
        f"launcher = Launcher(loopback_workers(2), options=options, run_dir={str(tmp_path)!r})\n"
        "launcher.start()\n"
        "print(*(launcher.process(r).pid for r in (0, 1)), flush=True)\n"
        "launcher.run([CollectiveTest('all-reduce', 'ring', 1 << 16)])\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        time.sleep(0.3)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 5.0
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in pids if _running(pid)]
    assert not alive


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_worker_process_imports_only_what_it_needs() -> None:
    code = (
        "import sys, orchestrator.worker.worker\n"
        "heavy = {'mininet', 'os_ken', 'matplotlib', 'networkx', 'yaml', 'topologies'}\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in heavy\n"
        "       or m in ('orchestrator.worker.launcher', 'orchestrator.collectives.nccl')]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_workers_from_a_fabric_description_use_its_address_plan() -> None:
    description = preset_description("astral-small")
    workers = workers_from_description(description)
    fabric = description.fabric
    assert [w.rank for w in workers] == list(range(len(fabric.gpus)))
    for w in workers:
        gpu, addresses = fabric.gpus[w.host], description.addresses[w.host]
        assert (w.server, w.local_rank) == (gpu.server, gpu.local_rank)
        assert (w.fabric_ip, w.nvlink_ip) == (addresses.fabric_ip, addresses.nvlink.ip)
    # the rail-aware algorithms accept the generated layout
    launcher = Launcher(workers)
    launcher.prepare(
        [
            CollectiveTest("all-reduce", "hierarchical", 1 << 20),
            CollectiveTest("all-to-all", "pxn", 1 << 20),
        ]
    )


def test_a_straggler_told_just_after_a_batch_began_delays_its_first_operation() -> None:
    """The fault scheduler applies a straggler at the batch's common start, so its
    message reaches the worker a moment after the first operation began; the rank had not
    sent yet (the operation's latency comes first), so it enters that operation late too
    (before 2026-12-05 it read its lateness as the operation began, and a straggler at
    0 s missed the first operation)."""
    late, told = 0.2, []
    latency = LatencyTable((), operation=0.05)
    test = CollectiveTest("all-reduce", "ring", 1 << 12)
    options = fast_options(warmup=0, iterations=1, latency=latency)
    with Launcher(loopback_workers(3), options=options) as launcher:

        def at_start(at: float, warmup: bool) -> None:
            if not warmup and not told:
                told.append(threading.Timer(at - time.time() + 0.005, launcher.set_late, (1, late)))
                told[0].start()

        launcher.on_batch = at_start
        first = launcher.run([test]).tests[0].timed()[0]
    told[0].join()
    assert all(r.time_us / 1e6 > late for r in first.ranks.values())


def test_a_ranks_entry_into_a_running_operation_reaches_the_live_view_by_its_heartbeat() -> None:
    """The live diagnosis reads a straggler from when each rank's step 0 began
    (orchestrator.run.alerts), which before 2026-12-06 it had only from the operation's
    done message, an operation after the straggler entered it. The heartbeats carry it
    while the operation runs: the on-time ranks' entries are in the live view before
    the late rank's bytes let them finish, and equal their done messages' step 0."""
    late = 0.4
    test = CollectiveTest("all-reduce", "ring", 1 << 12)
    options = fast_options(warmup=0, iterations=1, latency=LatencyTable((), operation=0.05))
    seen: dict[int, float] = {}  # rank -> its entry, as read while its operation ran
    with Launcher(loopback_workers(3), options=options) as launcher:
        launcher.set_late(1, late)
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.01):
                view = launcher.live_view()
                for rank, entries in view.entering.items():
                    if 0 in entries and 0 not in view.dones.get(rank, {}):
                        seen.setdefault(rank, entries[0])

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            launcher.run([test])
        finally:
            stop.set()
            watcher.join()
        dones = launcher.live_view().dones
    assert {0, 2} <= set(seen), seen
    for rank, entered in seen.items():
        assert entered == pytest.approx(dones[rank][0][2], abs=1e-6)
    assert protocol.shift_clock(
        protocol.heartbeat(
            0, busy=True, test=0, iteration=0, step=0, phase="", elapsed=0.0,
            waiting_on=[], entered=100.0,
        ),
        -2.0,
    )["entered"] == pytest.approx(98.0)  # fmt: skip


def test_a_late_rank_delays_every_operation_of_the_ring_by_its_lateness() -> None:
    """A straggler (orchestrator/testbed/faults.py): ``Launcher.set_late`` makes one rank
    enter every following operation late, told while the workers run; the launcher's
    ``on_batch`` announces each batch's common start (the fault scheduler's origin)."""
    late = 0.15
    batches: list[tuple[float, bool]] = []
    test = CollectiveTest("all-reduce", "ring", 1 << 12)
    with Launcher(loopback_workers(3), options=fast_options(iterations=3)) as launcher:
        launcher.on_batch = lambda at, warmup: batches.append((at, warmup))
        on_time = launcher.run([test]).tests[0].timed()
        launcher.set_late(1, late)
        delayed = launcher.run([test]).tests[0].timed()
        launcher.set_late(1, 0.0)
        again = launcher.run([test]).tests[0].timed()
    assert [w for _, w in batches] == [True, False] * 3
    assert all(t > time.time() - 60 for t, _ in batches)

    def mean(iterations: list[IterationResult]) -> float:
        return sum(r.time_us for i in iterations for r in i.ranks.values()) / (
            1e6 * sum(len(i.ranks) for i in iterations)
        )

    # every rank's operation waits for rank 1's first sends
    assert late * 0.9 < mean(delayed) - mean(on_time) < late * 1.5
    assert mean(again) < mean(on_time) + late / 3
    with pytest.raises(ValueError, match="no rank 7"):
        Launcher(loopback_workers(2)).set_late(7, 1.0)


def test_a_worker_writing_faster_than_the_launcher_reads_does_not_keep_it_from_a_ctrl_c() -> None:
    """A run of a million tiny operations sends a DONE each as fast as it can; the
    launcher, reading one worker's connection until it was empty, never got back to ask
    whether a Ctrl-C had been noted (a unit test hung so). It reads a bounded share of one
    connection per turn. The writer here is another process, which writes heartbeats
    faster than this one handles them."""
    launcher = Launcher(loopback_workers(2), options=fast_options())  # no process started
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    launcher._selector.register(ours, selectors.EVENT_READ, _Link(ours))
    beat = protocol.encode(
        protocol.heartbeat(
            0, busy=True, test=0, iteration=0, step=0, phase="", elapsed=0.0, waiting_on=[]
        )
    )
    flood = f"import os\nwhile True: os.write({theirs.fileno()}, {beat * 512!r})"
    writer = subprocess.Popen([sys.executable, "-c", flood], pass_fds=[theirs.fileno()])
    theirs.close()
    launcher.interrupted = lambda: True
    handle = launcher._handle

    def slow_handle(link: _Link, message: dict[str, object]) -> None:
        time.sleep(0.0002)  # a launcher slower than its worker (another thread holds the GIL)
        handle(link, message)

    launcher._handle = slow_handle  # type: ignore[method-assign]
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            launcher._await("done", lambda rank: False, None, "a batch")
        except BaseException as error:
            raised.append(error)

    waiter = threading.Thread(target=wait, daemon=True)
    try:
        time.sleep(0.3)  # the connection holds more than one turn's reads
        waiter.start()
        waiter.join(timeout=10.0)
        asked_while_flooded = not waiter.is_alive()
    finally:
        writer.kill()
        writer.wait()
    waiter.join(timeout=5.0)
    ours.close()
    assert asked_while_flooded, "the launcher kept reading and never asked"
    assert len(raised) == 1 and isinstance(raised[0], KeyboardInterrupt)
