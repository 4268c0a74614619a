"""The probe mesh's trains: the prober sending and timing them over real TCP on loopback,
and the diagnosis placing a slow link from their rates (orchestrator.testbed.prober,
orchestrator.diagnosis.trains). Paths are astral-small's (tests.unit.test_probes); its
links are 20 Mbit/s emulated."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from collections import Counter
from typing import Any

import pytest

from orchestrator.diagnosis import diagnose
from orchestrator.diagnosis.evidence import direction_map
from orchestrator.diagnosis.proberecord import ProbeRecord, Train
from orchestrator.diagnosis.trains import slow_directions
from orchestrator.testbed.prober import TRAIN, Prober, ProbeSpec, interleaved
from tests.helpers import preset_description
from tests.unit.test_diagnosis import T0, connection, observations, path
from tests.unit.test_probes import DOWN_A0, DOWN_A1, ELSEWHERE, record
from topologies.description import FabricDescription

RATE = 20e6  # astral-small's links, emulated bit/s


@pytest.fixture(scope="module")
def astral() -> FabricDescription:
    return preset_description("astral-small")


def train(t: float, share: float) -> Train:
    """A train whose first bytes came at ``t`` (s from T0) and whose second half came at
    ``share`` of a 20 Mbit/s link."""
    half = T0 + t + 0.002
    return Train(TRAIN, T0 + t, 1448, half, TRAIN // 2, half + (TRAIN // 2) * 8 / (share * RATE))


def with_trains(
    rec: ProbeRecord,
    slow: dict[int, tuple[float, float]],
    until: float = 20.0,
    slow_share: float = 0.2,
) -> ProbeRecord:
    """Every probe sends a train every 2 s (probe i at 0.3 i s past each); those of
    ``slow`` (probe -> from, to in s) come at ``slow_share`` of the link's rate then, all
    others at 1.3 (an idle path, at the pace)."""
    rec.train = TRAIN
    for pid, probe in rec.probes.items():
        for k in range(int(until / 2)):
            t = 2.0 * k + 0.3 * pid
            window = slow.get(pid)
            share = slow_share if window and window[0] <= t <= window[1] else 1.3
            probe.trains.append(train(t, share))
    return rec


CASES = DOWN_A1 + DOWN_A0 + ELSEWHERE  # probes 0-2 cross p1r0a1>p1r0t0, 3-4 p1r0t0 too


def test_trains_slow_across_one_link_and_only_they_make_it_slow(
    astral: FabricDescription,
) -> None:
    slow = {i: (4.0, 12.0) for i in range(3)}
    obs = observations(astral, probes=with_trains(record(CASES, {}), slow))
    top = diagnose(obs).ranked[0]
    # their acknowledgements come back up the same link: either direction may be the slow
    # one, so the link is named
    assert top.key() == ("link", "p1r0a1-p1r0t0", "slow"), diagnose(obs).render()
    assert top.evidence[0].startswith("probe trains: 13 trains in a row across p1r0")
    assert round(top.onset - T0, 1) == 4.0  # type: ignore[operator]
    # the probes' other links: each was crossed by a fast train too, or only by these
    assert [s.target for s in slow_directions(obs)] == ["p1r0a1-p1r0t0"]


def test_a_fast_train_up_the_link_clears_that_direction(astral: FabricDescription) -> None:
    up = [("p1s0g0", "p0s1g1", ("p1s0g0", "p1r0t0", "p1r0a1", "c3", "p0r1a1", "p0r1t1", "p0s1g1"))]
    slow = {i: (4.0, 12.0) for i in range(3)}
    obs = observations(astral, probes=with_trains(record(CASES + up, {}), slow))
    assert [s.target for s in slow_directions(obs)] == ["p1r0a1>p1r0t0"], diagnose(obs).render()


def test_a_train_up_the_link_at_twice_the_slow_line_clears_it(astral: FabricDescription) -> None:
    """A link slowed so that trains cross it under the slow line lets none across at
    twice that: trains up it at 0.7 between the slow ones say it was not slowed then
    (a CI run's healthy ring: three trains at 0.09-0.20 over 12 s, across a core uplink
    that trains at 0.67 and 0.78 crossed between them, were a slow link at 0.60)."""
    up = [("p1s0g0", "p0s1g1", ("p1s0g0", "p1r0t0", "p1r0a1", "c3", "p0r1a1", "p0r1t1", "p0s1g1"))]
    slow = {0: (4.0, 16.0), 2: (4.0, 16.0)}
    for between, slowed in ((0.7, False), (0.5, True)):
        rec = with_trains(record(CASES + up, {}), slow)
        # probe 1 crosses p1r0a1>p1r0t0 on its way, the last one p1r0t0>p1r0a1
        for pid in (1, len(CASES)):
            rec.probes[pid].trains = [
                train(tr.first - T0, between) if 4.0 <= tr.first - T0 <= 16.0 else tr
                for tr in rec.probes[pid].trains
            ]
        obs = observations(astral, probes=rec)
        assert bool(slow_directions(obs)) is slowed, (between, diagnose(obs).render())


def test_a_slow_train_behind_another_busy_link_is_congestion(astral: FabricDescription) -> None:
    slow = {i: (4.0, 12.0) for i in range(3)}
    # the ToR's ports down to the GPUs the slow probes go to sent at 0.9 of their rate
    # all along: the trains had a share of busy links
    rows = [(T0 - 2 + k * 0.5, 0, int(0.9 * RATE / 8 * k * 0.5), 0, 0) for k in range(50)]
    counters = {obs_port(astral, d): rows for d in ("p1r0t0>p1s0g0", "p1r0t0>p1s1g0")}
    obs = observations(astral, probes=with_trains(record(CASES, {}), slow), counters=counters)
    assert not slow_directions(obs), diagnose(obs).render()
    # the link itself carrying that much is not slowed below the line either
    own = {obs_port(astral, "p1r0a1>p1r0t0"): rows, obs_port(astral, "p1r0t0>p1r0a1"): rows}
    obs = observations(astral, probes=with_trains(record(CASES, {}), slow), counters=own)
    assert not slow_directions(obs), diagnose(obs).render()
    # nor slowed to the trains' 0.2 while it carried twice that (seed 36: a healthy
    # all-to-all's GPU port carried 0.34 of its rate beside trains at 0.20); a quarter of
    # its rate, what a link slowed to the trains' pace still carries, leaves them slow
    for carried, slowed in ((0.4, False), (0.25, True)):
        load = [(t, 0, int(carried * RATE / 8 * k * 0.5), 0, 0) for k, (t, *_) in enumerate(rows)]
        own = {obs_port(astral, "p1r0a1>p1r0t0"): load, obs_port(astral, "p1r0t0>p1r0a1"): load}
        obs = observations(astral, probes=with_trains(record(CASES, {}), slow), counters=own)
        assert bool(slow_directions(obs)) is slowed, (carried, diagnose(obs).render())


def test_a_busy_link_holds_a_train_back_to_about_an_equal_share_not_far_below(
    astral: FabricDescription,
) -> None:
    """A train is one more TCP flow on a busy link of its way: it gets about an equal share
    of it, less as a short flow, not a tenth of a link it shares with one connection
    carrying under half the rate (seed 49 run 1: trains across a slowed core link at
    0.22-0.23 beside a ring connection, excused by it, the slow link missed). Shared with
    three connections, a tenth is within a quarter of an equal share; traffic no
    connection explains still excuses it."""
    slow = {i: (4.0, 12.0) for i in range(3)}
    rows = [(T0 - 2 + k * 0.5, 0, int(0.48 * RATE / 8 * k * 0.5), 0, 0) for k in range(50)]
    down = ("p1r0t0>p1s0g0", "p1r0t0>p1s1g0")
    counters = {obs_port(astral, d): rows for d in down}
    # connections between the two GPUs below the ToR cross one downlink each
    pairs = [("p1s1g0", "p1s0g0"), ("p1s0g0", "p1s1g0")]

    def found(connections: int) -> list[str]:
        conns = [
            connection(10 + 2 * i + j, 4, 5, path(a, "p1r0t0", b))
            for i in range(connections)
            for j, (a, b) in enumerate(pairs)
        ]
        rec = with_trains(record(CASES, {}), slow, slow_share=0.1)
        obs = observations(astral, probes=rec, counters=counters, connections=conns)
        return [s.target for s in slow_directions(obs)]

    assert found(1) == ["p1r0a1-p1r0t0"], "one connection beside a train at 0.1"
    assert found(3) == [], "three connections"
    assert found(0) == [], "traffic no connection explains"


def test_every_train_slow_at_once_is_the_machine_not_a_link(astral: FabricDescription) -> None:
    slow = {i: (4.0, 12.0) for i in range(len(CASES))}
    obs = observations(astral, probes=with_trains(record(CASES, {}), slow))
    assert not slow_directions(obs), diagnose(obs).render()


def test_trains_slow_only_when_their_probe_lost_are_a_loss_not_a_slow_link(
    astral: FabricDescription,
) -> None:
    """A lossy link's train is slow when a lost segment waited for the probe's timer (its
    second half then takes 0.2 s or more: at 0.03 of 20 Mbit/s, 0.22 s)."""
    # probes 0-2 retransmit during each of their trains from 4 s to 12 s
    lost = {i: {"lost": [2.0 * k + 0.3 * i + 0.05 for k in range(2, 7)]} for i in range(3)}
    slow = {i: (4.0, 12.0) for i in range(3)}
    obs = observations(astral, probes=with_trains(record(CASES, lost), slow, slow_share=0.03))
    assert not slow_directions(obs), diagnose(obs).render()


def test_trains_that_lost_but_came_at_a_slowed_links_rate_are_a_slow_link(
    astral: FabricDescription,
) -> None:
    """A slowed link's small queue overflows under a train, which retransmits within a
    round trip: its second half still comes at the link's rate (0.2 of 20 Mbit/s: 33 ms),
    and every train losing is no reason to call it a loss (seed 50 run 1)."""
    lost = {i: {"lost": [2.0 * k + 0.3 * i + 0.05 for k in range(2, 7)]} for i in range(3)}
    slow = {i: (4.0, 12.0) for i in range(3)}
    obs = observations(astral, probes=with_trains(record(CASES, lost), slow))
    assert [s.target for s in slow_directions(obs)] == ["p1r0a1-p1r0t0"], diagnose(obs).render()


def test_a_train_cut_short_or_read_in_one_go_has_no_rate() -> None:
    whole = train(0.0, 0.5)
    assert whole.tail_bps(TRAIN) == pytest.approx(0.5 * RATE)
    cut = Train(TRAIN // 2, T0, 1448, T0 + 0.01, TRAIN // 4, T0 + 0.02)
    assert cut.tail_bps(TRAIN) is None
    one_read = Train(TRAIN, T0, 1448, T0 + 0.01, TRAIN, T0 + 0.01)
    assert one_read.tail_bps(TRAIN) is None


def obs_port(description: FabricDescription, direction: str) -> tuple[str, int]:
    port = direction_map(description)[direction].tx_at
    assert port is not None
    return port


def loopback_probes() -> tuple[socket.socket, dict[int, socket.socket], dict[tuple[str, int], int]]:
    """A listener on 127.0.0.1 and probes 1 and 2 connecting to it: (listener, sockets by
    probe, probe by source address), as the prober takes them."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    clients, senders = {}, {}
    for pid in (1, 2):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        clients[pid] = sock
        senders[("127.0.0.1", sock.getsockname()[1])] = pid
    return listener, clients, senders


def run_for(prober: Prober, out: io.StringIO, seconds: float) -> list[dict[str, Any]]:
    """Run ``prober`` in a thread for ``seconds``, stop it, and read its lines."""
    thread = threading.Thread(target=prober.run, args=(time.monotonic(),))
    thread.start()
    time.sleep(seconds)
    prober.stopping = True
    thread.join(timeout=5)
    prober.close()
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_the_prober_sends_trains_and_times_their_arrival_on_loopback() -> None:
    """Two probes over real TCP on 127.0.0.1: each sends its train in turn, and the
    receiver's line names the probe, counts every byte and has kernel timestamps in
    order."""
    listener, clients, senders = loopback_probes()
    out = io.StringIO()
    prober = Prober(
        [listener], clients, out, 0.05, 0.1, senders=senders, train=TRAIN, train_cycle=0.4
    )
    lines = run_for(prober, out, 1.5)
    trains = [row for line in lines for row in line.get("tr", ())]
    assert {row[0] for row in trains} == {1, 2}, lines[:3]
    for _, n, first, first_n, half, half_n, last in trains:
        assert n == TRAIN and 0 < first_n <= half_n <= n
        assert first <= half <= last and abs(first - time.time()) < 10


def test_the_trains_take_each_gpu_in_turn() -> None:
    probes = [
        ProbeSpec(i, src, "x", "a", 61000 + i, "b", 46999)
        for i, src in enumerate(["g0", "g0", "g0", "g1", "g1", "g2"])
    ]
    assert interleaved(probes) == [0, 3, 5, 1, 4, 2]


def test_a_probe_under_a_budget_sends_every_nth_message_and_train_on_loopback() -> None:
    """Two probes over real TCP on 127.0.0.1, one thinned by the mesh's budget (a message
    every 4 ticks, a train every 3 of its turns): over the same seconds it sends about a
    quarter of the other's messages and a third of its trains."""
    listener, clients, senders = loopback_probes()
    out = io.StringIO()
    prober = Prober(
        [listener], clients, out, 0.02, 0.1, senders=senders, train=TRAIN, train_cycle=0.2,
        every={2: 4}, train_every={2: 3},
    )  # fmt: skip
    lines = run_for(prober, out, 2.5)
    acked = {pid: n for pid, n, *_ in lines[-1]["v"]}
    trains = Counter(row[0] for line in lines for row in line.get("tr", ()))
    messages = {pid: (acked[pid] - trains[pid] * TRAIN) / 64 for pid in (1, 2)}
    assert 3.0 <= messages[1] / messages[2] <= 5.5, (messages, trains)
    assert trains[2] >= 1 and 2.0 <= trains[1] / trains[2] <= 4.5, trains
