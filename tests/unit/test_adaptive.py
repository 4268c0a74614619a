"""The adaptive policy without a switch: hot links, the choice of target, hysteresis, and the
plan it renders on astral-small (catch entries, per-connection entries, moves, expiry)."""

from __future__ import annotations

import itertools

import pytest

from controllers.counters import FlowRate, LinkLoad, PortRate, match_of
from controllers.plan import Output, Packet
from controllers.policies.adaptive import (
    CATCH_PRIORITY,
    CONTROLLER_PORT,
    FLOW_PRIORITY,
    AdaptiveParams,
    AdaptivePolicy,
    Hop,
    Path,
    TrackedFlow,
    choose_moves,
    placement_index,
    update_streaks,
)
from controllers.routing import programmable_switches
from controllers.tracer import follow
from tests.helpers import preset_description
from topologies.description import FabricDescription
from topologies.fivetuple import FiveTuple

CAP = 20e6
PARAMS = AdaptiveParams()

# Two parallel paths from one ToR: up via L1 or L2, then the same last hop.
L1: Hop = ("t", 1)
L2: Hop = ("t", 2)
P1 = Path((L1, ("a1", 3)), "g")
P2 = Path((L2, ("a2", 3)), "g")
CAPACITY = {L1: CAP, L2: CAP, ("a1", 3): CAP, ("a2", 3): CAP}


def flow(n: int) -> FiveTuple:
    return FiveTuple("10.0.0.1", 40000 + n, "10.1.0.1", 5201, "tcp")


def tracked(n: int, path: Path, rate: float, moved_at: float | None = None) -> TrackedFlow:
    return TrackedFlow(flow(n), "t", path, 0.0, 0.0, moved_at, rate)


def both(_: TrackedFlow) -> list[Path]:
    return [P1, P2]


def test_streaks_count_consecutive_hot_polls_and_reset() -> None:
    s: dict[Hop, int] = {}
    for u in (0.9, 0.9, 0.5, 0.9):
        s = update_streaks(s, {L1: u, L2: 0.1}, 0.75)
    assert s == {L1: 1, L2: 0}
    s = update_streaks(s, {L1: 0.8}, 0.75)
    assert s == {L1: 2}, "a link without data this poll is not hot"


def test_the_largest_flow_on_a_hot_link_moves_to_the_coolest_path() -> None:
    flows = [tracked(1, P1, 9.0e6), tracked(2, P1, 9.5e6)]
    util = {L1: 0.95, L2: 0.05, ("a1", 3): 0.95, ("a2", 3): 0.05}
    streaks = {L1: 3}
    (move,) = choose_moves(flows, util, CAPACITY, streaks, both, PARAMS, now=100.0)
    assert move.flow == flow(2) and move.old == P1 and move.new == P2 and move.hot == L1
    assert move.target_peak == pytest.approx(0.05 + 9.5e6 / CAP)
    assert move.utilization == pytest.approx(0.95)


def test_no_move_before_the_link_was_hot_long_enough() -> None:
    flows = [tracked(1, P1, 9.0e6), tracked(2, P1, 9.5e6)]
    util = {L1: 0.95, L2: 0.0}
    assert choose_moves(flows, util, CAPACITY, {L1: 2}, both, PARAMS, 100.0) == []


def test_no_move_when_it_would_not_make_things_better() -> None:
    # One saturating flow per link: both links "hot", but moving either only swaps them.
    flows = [tracked(1, P1, 19e6), tracked(2, P2, 19e6)]
    util = {L1: 0.95, L2: 0.95}
    assert choose_moves(flows, util, CAPACITY, {L1: 9, L2: 9}, both, PARAMS, 100.0) == []
    # Target cooler, but not by the margin.
    flows = [tracked(1, P1, 2e6), tracked(2, P1, 14e6)]
    util = {L1: 0.8, L2: 0.65}
    assert choose_moves(flows, util, CAPACITY, {L1: 3}, both, PARAMS, 100.0) == []


def test_cooldown_and_mice() -> None:
    flows = [tracked(1, P1, 12e6, moved_at=95.0), tracked(2, P1, 6e6), tracked(3, P1, 1e6)]
    util = {L1: 0.95, L2: 0.0}
    (move,) = choose_moves(flows, util, CAPACITY, {L1: 3}, both, PARAMS, now=100.0)
    assert move.flow == flow(2), "flow 1 moved 5 s ago (cooldown 10 s)"
    later = choose_moves(flows, util, CAPACITY, {L1: 3}, both, PARAMS, now=106.0)
    assert [m.flow for m in later] == [flow(1)]
    mice = [tracked(n, P1, 1e6) for n in range(19)]  # 5% of the link each
    assert choose_moves(mice, util, CAPACITY, {L1: 3}, both, PARAMS, 100.0) == []


def test_one_move_per_hot_link_and_moves_see_each_other() -> None:
    # Three paths; L1 and L2 both hot; L3 empty. Without the projection both would pick L3.
    l3: Hop = ("t", 3)
    p3 = Path((l3, ("a3", 3)), "g")
    cap = {**CAPACITY, l3: CAP, ("a3", 3): CAP}
    flows = [tracked(1, P1, 9e6), tracked(2, P1, 9e6), tracked(3, P2, 9e6), tracked(4, P2, 9e6)]
    util = {L1: 0.95, L2: 0.93, l3: 0.0}
    moves = choose_moves(flows, util, cap, {L1: 3, L2: 3}, lambda f: [P1, P2, p3], PARAMS, 100.0)
    assert len(moves) == 1, "after the first move L3 carries 0.45: the second would not help"
    assert moves[0].hot == L1 and moves[0].new == p3


def simulate(
    polls: int,
    background: list[tuple[float, float]],
    params: AdaptiveParams,
    demand: float = CAP,
) -> list[tuple[float, int, Path]]:
    """A fluid model: two flows (each wanting ``demand``) share what a background load
    leaves of each 20 Mbit/s link equally; the policy sees utilization and flow rates every
    0.5 s and its moves take effect the next poll. Returns the moves made."""
    paths = {1: P1, 2: P1}
    moved_at: dict[int, float | None] = {1: None, 2: None}
    streaks: dict[Hop, int] = {}
    history = []
    for k in range(polls):
        now = 0.5 * k
        bg = dict(zip((L1, L2), background[k % len(background)], strict=True))
        rates = {}
        util = {}
        for link in (L1, L2):
            users = [n for n, p in paths.items() if link in p.hops]
            free = max(0.0, CAP - bg[link])
            for n in users:
                rates[n] = min(demand, free / len(users))
            util[link] = (bg[link] + sum(rates[n] for n in users)) / CAP
        flows = [
            TrackedFlow(flow(n), "t", paths[n], 0.0, now, moved_at[n], rates[n]) for n in paths
        ]
        streaks = update_streaks(streaks, util, params.hot)
        for move in choose_moves(flows, util, CAPACITY, streaks, both, params, now):
            n = move.flow.src_port - 40000
            paths[n], moved_at[n] = move.new, now
            for hop in (*move.old.hops, *move.new.hops):
                streaks[hop] = 0
            history.append((now, n, move.new))
    return history


def test_two_flows_on_one_link_split_once_and_stay() -> None:
    history = simulate(120, [(0.0, 0.0)], PARAMS)
    assert len(history) == 1, history
    assert history[0][0] == pytest.approx(1.0), "third hot poll (t = 0, 0.5, 1.0)"


def test_no_oscillation_under_alternating_background_load() -> None:
    # Two 8 Mbit/s flows; background traffic swings between the links every 2 s (4 polls).
    # Each swing makes the flows' link hot and a move would help, but the cooldown keeps a
    # moved flow in place for 10 s: each flow moves at most once per cooldown.
    swing = [(16e6, 0.0)] * 4 + [(0.0, 16e6)] * 4
    history = simulate(240, swing, PARAMS, demand=8e6)  # 2 minutes
    per_flow = {n: [t for t, m, _ in history if m == n] for n in (1, 2)}
    for times in per_flow.values():
        assert all(b - a >= PARAMS.cooldown for a, b in itertools.pairwise(times)), times
    assert 2 <= len(history) <= 2 * (120 / PARAMS.cooldown + 1), history
    # Without the cooldown the same swings would move flows far more often.
    eager = AdaptiveParams(cooldown=0.0)
    assert len(simulate(240, swing, eager, demand=8e6)) > 2 * len(history)
    # Two 6 Mbit/s flows and a background burst every other poll: the link is hot (0.9)
    # every other poll only, never 3 polls in a row, so nothing ever moves.
    flicker = [(6e6, 0.0), (0.0, 0.0)]
    assert simulate(240, flicker, PARAMS, demand=6e6) == []
    # The same burst held for 3 polls is congestion: one flow moves, once.
    held = [(6e6, 0.0)] * 3 + [(0.0, 0.0)] * 3
    assert len(simulate(240, held, PARAMS, demand=6e6)) == 1


def test_params_from_options() -> None:
    params = AdaptiveParams.from_options(hot="0.8", hot_polls="2", cooldown="5")
    assert (params.hot, params.hot_polls, params.cooldown) == (0.8, 2, 5.0)
    with pytest.raises(TypeError, match="unknown option"):
        AdaptiveParams.from_options(speed="1")
    with pytest.raises(ValueError, match="not a number"):
        AdaptiveParams.from_options(hot="warm")
    with pytest.raises(ValueError, match="margin"):
        AdaptiveParams(hot=0.5, margin=0.6)


# --- the policy on astral-small ------------------------------------------------------------


@pytest.fixture(scope="module")
def description() -> FabricDescription:
    return preset_description("astral-small")


def nic(description: FabricDescription, gpu: str, port: int) -> tuple[str, int]:
    (n,) = [x for x in description.addresses[gpu].nics if x.port == port]
    return n.peer, n.peer_port


def load_with(
    t: float, ports: dict[Hop, float], flows: dict[tuple[str, FiveTuple], float]
) -> LinkLoad:
    port_rates = {
        hop: PortRate(hop[0], hop[1], 0.5, 0.0, u * CAP, 0, 0, 0, 0, 0, 0, CAP)
        for hop, u in ports.items()
    }
    flow_rates = {}
    for (switch, f), bps in flows.items():
        fields = {"eth_type": 2048, "ip_proto": 6, "ipv4_src": f.src_ip, "ipv4_dst": f.dst_ip}
        match = match_of([*fields.items(), ("tcp_src", f.src_port), ("tcp_dst", f.dst_port)])
        flow_rates[(switch, 0, FLOW_PRIORITY, match)] = FlowRate(
            switch, 0, FLOW_PRIORITY, match, 1, int(bps / 16), bps, 0.5
        )
    return LinkLoad(t, 0, port_rates, flow_rates)


def test_policy_catches_tcp_places_connections_and_moves_one_off_a_hot_uplink(
    description: FabricDescription,
) -> None:
    policy = AdaptivePolicy()
    plan = policy.render(description, frozenset())
    fabric = description.fabric
    tor, port = nic(description, "p0s0g0", 1)
    tor_dpid = fabric.switches[tor].dpid
    dst = description.addresses["p1s0g0"].fabric_ip
    src = description.addresses["p0s0g0"].fabric_ip
    catches = [e for e in plan.tables[tor_dpid].flows if e.priority == CATCH_PRIORITY]
    # Every GPU-facing port x every destination more than one path away (not the ToR's own).
    assert {(e.in_port, e.ipv4_dst) for e in catches} >= {(port, dst)}
    assert all(e.actions[0] == Output(CONTROLLER_PORT) and e.ip_proto == 6 for e in catches)
    assert not any(e.priority == FLOW_PRIORITY for e in plan.flows())
    # Every switch still reaches every GPU without a tracked connection (shortest's routes).
    for switch in programmable_switches(fabric):
        for gpu, addr in description.addresses.items():
            assert follow(description, plan, switch.name, addr.fabric_ip)[-1] == gpu

    # Two connections from two GPUs behind the same ToR, placed on the same uplink.
    other_src = description.addresses["p0s1g0"].fabric_ip
    assert nic(description, "p0s1g0", 1)[0] == tor
    other_dst = description.addresses["p1s1g0"].fabric_ip
    paths = policy.paths(tor, "p1s0g0")
    assert len(paths) == 8  # 2 aggs x 2 cores x 2 ToRs of the destination
    first = FiveTuple(src, 40001, dst, 5201, "tcp")
    uplink = paths[placement_index(first, 8)].hops[0]
    others = policy.paths(tor, "p1s1g0")
    sport = next(
        p
        for p in range(40000, 41000)
        if others[placement_index(FiveTuple(other_src, p, other_dst, 5201, "tcp"), 8)].hops[0]
        == uplink
    )
    second = FiveTuple(other_src, sport, other_dst, 5201, "tcp")
    routes = policy.on_packet_in(tor, port, Packet.tcp(src, dst, 40001, 5201), now=0.0)
    routes += policy.on_packet_in(
        tor, nic(description, "p0s1g0", 1)[1], Packet.tcp(other_src, other_dst, sport, 5201), 0.0
    )
    assert [(r.event, r.flow) for r in routes] == [("placed", first), ("placed", second)]
    assert policy.on_packet_in(tor, port, Packet.tcp(src, dst, 40001, 5201), 0.1) == []
    plan = policy.render(description, frozenset())
    path1 = follow(description, plan, tor, Packet.tcp(src, dst, 40001, 5201))
    path2 = follow(description, plan, tor, Packet.tcp(other_src, other_dst, sport, 5201))
    assert path1[:-1] == list(policy.flows[first].path.switches)
    assert path1[1] == path2[1], "both on one uplink"
    # The per-connection entry at the ToR is the counting one.
    assert any(
        e.priority == FLOW_PRIORITY and e.tcp_src == 40001 for e in plan.tables[tor_dpid].flows
    )

    # The uplink is hot for three polls; both connections carry ~9.5 Mbit/s.
    moved = []
    for k in range(4):
        load = load_with(0.5 * k, {uplink: 0.96}, {(tor, first): 9.6e6, (tor, second): 9.5e6})
        moved += policy.on_link_load(load, now=0.5 * k)
    (move,) = moved
    assert (
        move.event == "moved" and move.flow == first and move.detail["hot"] == f"{tor}:{uplink[1]}"
    )
    plan = policy.render(description, frozenset())
    new1 = follow(description, plan, tor, Packet.tcp(src, dst, 40001, 5201))
    assert new1[1] != path2[1], "moved to the other uplink"
    assert new1[:-1] == list(move.path)

    # Idle connections are forgotten (their entries go), with an "expired" record each.
    quiet = policy.on_link_load(load_with(30.0, {}, {}), now=30.0)
    assert sorted(r.event for r in quiet) == ["expired", "expired"]
    assert not policy.flows
    plan = policy.render(description, frozenset())
    assert not any(e.priority == FLOW_PRIORITY for e in plan.flows())


def test_a_failed_link_forgets_the_connections_on_it(description: FabricDescription) -> None:
    policy = AdaptivePolicy()
    policy.render(description, frozenset())
    tor, port = nic(description, "p0s0g0", 1)
    src = description.addresses["p0s0g0"].fabric_ip
    dst = description.addresses["p1s0g0"].fabric_ip
    (placed,) = policy.on_packet_in(tor, port, Packet.tcp(src, dst, 40001, 5201), 0.0)
    first, second = placed.path[0], placed.path[1]
    link = next(x for x in description.fabric.links if {x.a, x.b} == {first, second})
    plan = policy.render(description, frozenset({link}))
    assert not policy.flows
    # Re-learned on its next packet, on a path without the link.
    (again,) = policy.on_packet_in(tor, port, Packet.tcp(src, dst, 40001, 5201), 1.0)
    assert again.path[1] != second
    plan = policy.render(description, frozenset({link}))
    assert follow(description, plan, tor, Packet.tcp(src, dst, 40001, 5201))[1] != second


def test_packets_that_are_not_catch_copies_are_ignored(description: FabricDescription) -> None:
    policy = AdaptivePolicy()
    policy.render(description, frozenset())
    tor, port = nic(description, "p0s0g0", 1)
    src = description.addresses["p0s0g0"].fabric_ip
    dst = description.addresses["p1s0g0"].fabric_ip
    agg = next(s.name for s in description.fabric.switches.values() if s.name.startswith("p0r0a"))
    assert policy.on_packet_in(agg, 1, Packet.tcp(src, dst, 1, 2), 0.0) == []
    assert policy.on_packet_in(tor, port, Packet(dst, src, 17, 1, 2), 0.0) == []
    assert policy.on_packet_in(tor, port, Packet.tcp(src, "10.9.9.9", 1, 2), 0.0) == []
    limited = AdaptivePolicy(max_flows="1")
    limited.render(description, frozenset())
    assert len(limited.on_packet_in(tor, port, Packet.tcp(src, dst, 1, 2), 0.0)) == 1
    assert limited.on_packet_in(tor, port, Packet.tcp(src, dst, 3, 4), 0.0) == []


def test_the_app_reads_the_five_tuple_of_a_copied_tcp_packet() -> None:
    from os_ken.lib.packet import ethernet, ipv4, packet, tcp, udp

    from controllers.app import tcp_packet

    def frame(l4: object) -> bytes:
        pkt = packet.Packet()
        pkt.add_protocol(ethernet.ethernet(src="02:00:00:00:00:01", dst="02:00:00:00:00:02"))
        proto = 6 if isinstance(l4, tcp.tcp) else 17
        pkt.add_protocol(ipv4.ipv4(src="10.0.0.1", dst="10.1.0.1", proto=proto))
        pkt.add_protocol(l4)
        pkt.serialize()
        return bytes(pkt.data)

    syn = frame(tcp.tcp(src_port=40001, dst_port=5201, bits=tcp.TCP_SYN))
    assert tcp_packet(syn) == Packet.tcp("10.0.0.1", "10.1.0.1", 40001, 5201)
    assert tcp_packet(frame(udp.udp(src_port=1, dst_port=2))) is None
