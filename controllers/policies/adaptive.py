"""adaptive: congestion-aware placement of long TCP flows (Hedera-like), with hysteresis.

Hedera (NSDI'10) starts every flow on a hashed path and, every few seconds, moves the large
flows off congested links. Here, with OpenFlow 1.3 counters only::

    GPU --SYN/first packets--> ToR: catch entry (per NIC port, destination; TCP only)
        |  forwards on the per-destination route AND copies to the controller
        v
    controller: on_packet_in -> the connection (five-tuple) is tracked: a path among the
        ToR's equal-cost shortest paths to the destination, chosen by a hash of the
        five-tuple (ECMP, but known to the controller); per-connection entries at the ToR
        (they count its bytes) and at every switch of the path with a choice
        |
    telemetry (EventLinkLoadUpdated, every poll): port tx utilization per (switch, port),
        bytes of each connection's entry at its ToR
        v
    on_link_load: a link hot (tx utilization > ``hot``) for ``hot_polls`` polls in a row
        -> the largest tracked connection crossing it that is not cooling down moves to the
        equal-cost path whose worst link, with the connection added, is the least loaded,
        if that stays at least ``margin`` below the hot link's utilization; at most one
        move per hot link per poll; links on both paths must then be hot for ``hot_polls``
        fresh polls before anything moves because of them again
        -> "placed"/"moved"/"expired" route records (telemetry file, docs/telemetry.md)

Why it does not oscillate: a link must stay hot for several polls (a burst or a counter
glitch moves nothing), a moved connection stays put for ``cooldown`` seconds, and a move
must leave the target strictly cooler than the hot link by ``margin`` (two links carrying
one saturating flow each are both "hot", but neither move improves anything: nothing
moves). :func:`update_streaks` and :func:`choose_moves` are pure and unit-tested on
synthetic counter series.

Everything that is not a tracked TCP connection (ICMP, UDP, connections whose ToR has one
path to the destination) follows the per-destination routes of ``shortest``. A connection
idle for ``idle`` seconds is forgotten (its entries are removed; if it sends again, the
catch entry brings it back). After a link failure the plan is re-rendered: connections
whose path used the link are forgotten and re-learned on their next packet, placed on the
surviving paths. A restarted controller starts with no tracked connections: the switches'
per-connection entries are removed as stale and the catch entries re-learn the live ones.

Options (``adaptive:hot=0.8,cooldown=5``): ``hot``, ``hot_polls``, ``margin``,
``cooldown``, ``min_share``, ``idle``, ``max_flows`` (:class:`AdaptiveParams`).

The copy to the controller is an ``Output`` to OpenFlow's reserved CONTROLLER port (the plan
has no action with a ``max_len``, so the switch sends the whole packet: a SYN, or the few
data packets of an untracked connection that pass before its entries are installed).
Measured on astral-small (tests/integration/test_adaptive.py): two 20 Mbit/s flows hashed
onto one uplink are split 1.8-2.5 s after they start (three hot polls at 0.5 s), then run at
17-18.5 Mbit/s each.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from controllers.counters import FlowRoute, LinkLoad, port_capacities
from controllers.plan import (
    IPPROTO_TCP,
    ROUTE_PRIORITY,
    Action,
    FlowEntry,
    ForwardingPlan,
    Output,
    Packet,
    SwitchTable,
)
from controllers.routing import (
    RoutingGraph,
    last_hop_actions,
    programmable_switches,
    shortest_path_plan,
)
from topologies.description import FabricDescription
from topologies.fivetuple import FiveTuple
from topologies.model import Link, LinkKind, Tier

# Between the per-destination routes (100) and path-pinned's source-port entries (200)...
CATCH_PRIORITY = ROUTE_PRIORITY + 50
# ... and per-connection entries above both, below fast-failover detour guards (300).
FLOW_PRIORITY = ROUTE_PRIORITY + 150
# OpenFlow's reserved port "CONTROLLER" (OFPP_CONTROLLER, the same in 1.3 and 1.5).
CONTROLLER_PORT = 0xFFFFFFFD

Hop = tuple[str, int]  # (switch, model port it sends out of): one direction of one link


@dataclass(frozen=True)
class AdaptiveParams:
    """The knobs, with the defaults used in the tests (poll interval 0.5 s)."""

    hot: float = 0.75  # tx utilization above which a link is hot
    hot_polls: int = 3  # ... for this many polls in a row
    margin: float = 0.1  # target's worst link (with the flow) <= hot link - margin
    cooldown: float = 10.0  # seconds before a moved connection may move again
    min_share: float = 0.1  # connections below this share of the hot link stay (mice)
    idle: float = 10.0  # seconds without a byte before a connection is forgotten
    max_flows: int = 4096  # connections tracked at once (rules grow with them)

    def __post_init__(self) -> None:
        if not 0 < self.hot <= 1.5:
            raise ValueError(f"hot={self.hot}: expected a utilization in (0, 1.5]")
        if self.hot_polls < 1:
            raise ValueError(f"hot_polls={self.hot_polls}: expected at least 1")
        if not 0 <= self.margin < self.hot:
            raise ValueError(f"margin={self.margin}: expected 0 <= margin < hot")
        for name in ("cooldown", "min_share", "idle"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.max_flows < 0:
            raise ValueError("max_flows must not be negative")

    @classmethod
    def from_options(cls, **options: str | float | int) -> AdaptiveParams:
        """From policy options (strings from ``adaptive:key=value``); unknown keys: TypeError."""
        known = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, raw in options.items():
            if key not in known:
                raise TypeError(f"unknown option {key!r} (known: {', '.join(sorted(known))})")
            try:
                values[key] = int(raw) if known[key] == "int" else float(raw)
            except ValueError:
                raise ValueError(f"{key}={raw!r} is not a number") from None
        return cls(**values)


@dataclass(frozen=True)
class Path:
    """A path from the switch where a connection enters to its destination GPU."""

    hops: tuple[Hop, ...]  # (switch, out port) from the ingress ToR to the last ToR
    gpu: str

    @property
    def switches(self) -> tuple[str, ...]:
        return tuple(switch for switch, _ in self.hops)


@dataclass
class TrackedFlow:
    """A connection the policy placed: where it entered, its path, what it carries."""

    flow: FiveTuple
    ingress: str
    path: Path
    placed_at: float
    active_at: float  # last time its bytes grew (placement counts)
    moved_at: float | None = None
    rate: float = 0.0  # bit/s over the last poll


@dataclass(frozen=True)
class Move:
    """A decision of :func:`choose_moves`."""

    flow: FiveTuple
    old: Path
    new: Path
    hot: Hop
    utilization: float  # of the hot link when decided
    rate: float  # the connection's rate, bit/s
    target_peak: float  # projected worst utilization on the new path


# --- the decision, pure --------------------------------------------------------------------


def update_streaks(
    streaks: Mapping[Hop, int], utilization: Mapping[Hop, float], hot: float
) -> dict[Hop, int]:
    """Consecutive polls each link has been above ``hot`` (0 once it is not)."""
    return {hop: (streaks.get(hop, 0) + 1 if u > hot else 0) for hop, u in utilization.items()}


def choose_moves(
    flows: Sequence[TrackedFlow],
    utilization: Mapping[Hop, float],
    capacity: Mapping[Hop, float],
    streaks: Mapping[Hop, int],
    alternatives: Callable[[TrackedFlow], Sequence[Path]],
    params: AdaptiveParams,
    now: float,
) -> list[Move]:
    """The moves to make after one poll (see the module docstring for the rules).

    Hot links are handled from the hottest down; each move updates a projection of the
    utilization (the connection's rate leaves the links only the old path has and lands
    on the links only the new one has), so later decisions in the same poll see it.
    """
    work = dict(utilization)
    moves: list[Move] = []
    moved: set[FiveTuple] = set()
    hot_links = [h for h, n in streaks.items() if n >= params.hot_polls]
    hot_links.sort(key=lambda h: (-work.get(h, 0.0), h))
    for link in hot_links:
        u = work.get(link, 0.0)
        cap = capacity.get(link)
        if u <= params.hot or not cap:
            continue  # an earlier move of this poll cooled it
        candidates = [
            f
            for f in flows
            if link in f.path.hops
            and f.flow not in moved
            and (f.moved_at is None or now - f.moved_at >= params.cooldown)
            and f.rate >= params.min_share * cap
        ]
        candidates.sort(key=lambda f: (-f.rate, str(f.flow)))
        for f in candidates:
            best: tuple[float, Path] | None = None
            old = set(f.path.hops)
            for path in alternatives(f):
                if path == f.path or link in path.hops:
                    continue
                peak = max(
                    work.get(h, 0.0) + (0.0 if h in old else f.rate / capacity.get(h, cap))
                    for h in path.hops
                )
                if best is None or (peak, path.hops) < (best[0], best[1].hops):
                    best = (peak, path)
            if best is None or best[0] > u - params.margin:
                continue
            peak, path = best
            for h in old - set(path.hops):
                work[h] = work.get(h, 0.0) - f.rate / capacity.get(h, cap)
            for h in set(path.hops) - old:
                work[h] = work.get(h, 0.0) + f.rate / capacity.get(h, cap)
            moves.append(Move(f.flow, f.path, path, link, u, f.rate, peak))
            moved.add(f.flow)
            break  # one move per hot link per poll: let the counters show its effect
    return moves


def placement_index(flow: FiveTuple, count: int) -> int:
    """Which of ``count`` equal-cost paths (sorted) a new connection starts on: a static
    hash of its five-tuple (BLAKE2b: the same in every process, unlike ``hash``)."""
    digest = hashlib.blake2b(str(flow).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def shortest_paths(
    graph: RoutingGraph, start: str, gpu: str, dist: Mapping[str, int] | None = None
) -> list[Path]:
    """Every shortest path from switch ``start`` to ``gpu`` in ``graph``, sorted by hops."""
    dist = graph.distances_to(gpu) if dist is None else dist
    found: list[Path] = []

    def walk(node: str, hops: tuple[Hop, ...]) -> None:
        for adj in graph.next_hops(node, gpu, dist):
            step = (*hops, (node, adj.port))
            if adj.neighbor == gpu:
                found.append(Path(step, gpu))
            else:
                walk(adj.neighbor, step)

    walk(start, ())
    return sorted(found, key=lambda p: p.hops)


# --- the policy ----------------------------------------------------------------------------


@dataclass
class _Fabric:
    """What one render of one failure set computes once."""

    description: FabricDescription
    failed: frozenset[Link]
    graph: RoutingGraph
    base: dict[int, list[FlowEntry]]  # per-destination routes and catch entries
    dist: dict[str, dict[str, int]] = field(default_factory=dict)
    paths: dict[tuple[str, str], list[Path]] = field(default_factory=dict)

    def distances(self, gpu: str) -> dict[str, int]:
        if gpu not in self.dist:
            self.dist[gpu] = self.graph.distances_to(gpu)
        return self.dist[gpu]

    def shortest(self, start: str, gpu: str) -> list[Path]:
        if (start, gpu) not in self.paths:
            self.paths[(start, gpu)] = shortest_paths(self.graph, start, gpu, self.distances(gpu))
        return self.paths[(start, gpu)]


class AdaptivePolicy:
    name = "adaptive"
    pins_source_ports: ClassVar[bool] = False
    needs_load = True  # the telemetry app publishes EventLinkLoadUpdated for it

    def __init__(self, **options: str | float | int) -> None:
        self.params = AdaptiveParams.from_options(**options)
        self.flows: dict[FiveTuple, TrackedFlow] = {}
        self.streaks: dict[Hop, int] = {}
        self._fabric: _Fabric | None = None
        self._capacity: dict[Hop, float] = {}
        self._gpu_of: dict[str, str] = {}
        self._nic_ports: set[Hop] = set()  # (ToR, port) facing a GPU
        self._dpid: dict[str, int] = {}

    def paths(self, switch: str, gpu: str) -> list[Path]:
        """The equal-cost paths a connection entering at ``switch`` may take to ``gpu`` (as
        of the last render), sorted: it starts on ``placement_index(flow, len(paths))``."""
        if self._fabric is None:
            raise RuntimeError("render() first")
        return list(self._fabric.shortest(switch, gpu))

    # --- rendering -----------------------------------------------------------------------

    def render(
        self, description: FabricDescription, failed_links: frozenset[Link]
    ) -> ForwardingPlan:
        fabric = self._fabric_for(description, failed_links)
        tables: dict[int, list[FlowEntry]] = {d: list(e) for d, e in fabric.base.items()}
        for tracked in sorted(self.flows.values(), key=lambda f: str(f.flow)):
            for entry in self._flow_entries(fabric, tracked):
                tables[entry.dpid].append(entry)
        names = {s.dpid: s.name for s in programmable_switches(description.fabric)}
        return ForwardingPlan(
            self.name,
            {d: SwitchTable(d, names[d], tuple(entries)) for d, entries in tables.items()},
            fabric.graph.failed,
            extra={"tracked_flows": len(self.flows)},
        )

    def _fabric_for(self, description: FabricDescription, failed: frozenset[Link]) -> _Fabric:
        current = self._fabric
        if current is not None and current.description is description and current.failed == failed:
            return current
        if current is None or current.description is not description:
            self._learn(description)
        base_plan = shortest_path_plan(description, failed, policy=self.name)
        graph = RoutingGraph(description.fabric, failed)
        fabric = _Fabric(description, frozenset(failed), graph, {})
        for dpid, table in base_plan.tables.items():
            fabric.base[dpid] = [*table.flows, *self._catch_entries(fabric, base_plan, dpid)]
        self._fabric = fabric
        # Connections whose path lost a link are forgotten: their next packet re-learns them.
        for key, tracked in list(self.flows.items()):
            if tracked.path not in fabric.shortest(tracked.ingress, tracked.path.gpu):
                del self.flows[key]
        return fabric

    def _learn(self, description: FabricDescription) -> None:
        fabric = description.fabric
        self._capacity = dict(port_capacities(description))
        self._gpu_of = {a.fabric_ip: gpu for gpu, a in description.addresses.items()}
        self._dpid = {s.name: s.dpid for s in programmable_switches(fabric)}
        tors = {n for n, s in fabric.switches.items() if s.tier is Tier.TOR}
        self._nic_ports = set()
        for link in fabric.links:
            if link.kind is LinkKind.NIC:
                for name, port in ((link.a, link.a_port), (link.b, link.b_port)):
                    if name in tors:
                        self._nic_ports.add((name, port))
        self.flows.clear()
        self.streaks.clear()

    def _catch_entries(self, fabric: _Fabric, base: ForwardingPlan, dpid: int) -> list[FlowEntry]:
        """At a ToR: TCP from each live GPU-facing port to each destination it reaches over
        more than one path goes its usual way and, once, to the controller."""
        table = base.tables[dpid]
        switch = table.switch
        ports = sorted(
            port
            for name, port in self._nic_ports
            if name == switch
            and any(adj.port == port for adj in fabric.graph.neighbors(switch))  # alive
        )
        if not ports:
            return []
        entries = []
        for route in table.flows:
            gpu = self._gpu_of.get(route.ipv4_dst)
            if gpu is None or route.priority != ROUTE_PRIORITY or len(route.match()) != 1:
                continue
            if len(fabric.shortest(switch, gpu)) < 2:
                continue
            actions: tuple[Action, ...] = (Output(CONTROLLER_PORT), *route.actions)
            for port in ports:
                entries.append(
                    FlowEntry(
                        dpid,
                        switch,
                        route.ipv4_dst,
                        actions,
                        priority=CATCH_PRIORITY,
                        ip_proto=IPPROTO_TCP,
                        in_port=port,
                    )
                )
        return entries

    def _flow_entries(self, fabric: _Fabric, tracked: TrackedFlow) -> list[FlowEntry]:
        """The connection's entries: at its ToR (counting its bytes) and wherever the path
        has a choice (elsewhere the per-destination route already goes the same way)."""
        path, flow = tracked.path, tracked.flow
        dist = fabric.distances(path.gpu)
        entries = []
        for i, (switch, port) in enumerate(path.hops):
            if i > 0 and len(fabric.graph.next_hops(switch, path.gpu, dist)) < 2:
                continue
            if i == len(path.hops) - 1:
                actions = tuple(last_hop_actions(fabric.description, path.gpu, switch, port))
            else:
                actions = (Output(port),)
            entries.append(
                FlowEntry(
                    self._dpid[switch],
                    switch,
                    flow.dst_ip,
                    actions,
                    priority=FLOW_PRIORITY,
                    ipv4_src=flow.src_ip,
                    ip_proto=IPPROTO_TCP,
                    tcp_src=flow.src_port,
                    tcp_dst=flow.dst_port,
                )
            )
        return entries

    # --- events (called by the app) ------------------------------------------------------

    def on_packet_in(
        self, switch: str, in_port: int, packet: Packet, now: float
    ) -> list[FlowRoute]:
        """A catch entry's copy: track the connection (returns its "placed" record)."""
        fabric = self._fabric
        if (
            fabric is None
            or (switch, in_port) not in self._nic_ports
            or packet.ip_proto != IPPROTO_TCP
            or packet.ipv4_src is None
            or packet.src_port is None
            or packet.dst_port is None
        ):
            return []
        gpu = self._gpu_of.get(packet.ipv4_dst)
        if gpu is None:
            return []
        flow = FiveTuple(packet.ipv4_src, packet.src_port, packet.ipv4_dst, packet.dst_port, "tcp")
        known = self.flows.get(flow)
        if known is not None and known.ingress == switch:
            return []  # a copy sent before its entries were installed
        if known is None and len(self.flows) >= self.params.max_flows:
            return []
        paths = fabric.shortest(switch, gpu)
        if len(paths) < 2:
            return []
        path = paths[placement_index(flow, len(paths))]
        self.flows[flow] = TrackedFlow(flow, switch, path, now, now)
        previous = known.path.switches if known is not None else ()
        return [
            FlowRoute(
                now, self.name, "placed", flow, path.switches, previous, {"paths": len(paths)}
            )
        ]

    def on_link_load(self, load: LinkLoad, now: float) -> list[FlowRoute]:
        """One poll: connection rates, expiry, hot links, moves (their route records)."""
        if self._fabric is None:
            return []
        routes: list[FlowRoute] = []
        rates: dict[tuple[str, FiveTuple], tuple[float, int]] = {}
        for (switch, _table, priority, match), rate in load.flows.items():
            if priority == FLOW_PRIORITY:
                flow = _five_tuple(match)
                if flow is not None:
                    rates[(switch, flow)] = (rate.bps, rate.bytes)
        for key, tracked in list(self.flows.items()):
            seen = rates.get((tracked.ingress, key))
            if seen is not None:
                tracked.rate = seen[0]
                if seen[1] > 0:
                    tracked.active_at = now
            if now - tracked.active_at > self.params.idle:
                del self.flows[key]
                routes.append(FlowRoute(now, self.name, "expired", key, (), tracked.path.switches))
        utilization = {
            hop: u
            for hop, rate in load.ports.items()
            if (u := rate.tx_utilization) is not None and hop in self._capacity
        }
        self.streaks = update_streaks(self.streaks, utilization, self.params.hot)
        fabric = self._fabric
        moves = choose_moves(
            list(self.flows.values()),
            utilization,
            self._capacity,
            self.streaks,
            lambda f: fabric.shortest(f.ingress, f.path.gpu),
            self.params,
            now,
        )
        for move in moves:
            tracked = self.flows[move.flow]
            tracked.path, tracked.moved_at = move.new, now
            for hop in (*move.old.hops, *move.new.hops):
                self.streaks[hop] = 0
            routes.append(
                FlowRoute(
                    now,
                    self.name,
                    "moved",
                    move.flow,
                    move.new.switches,
                    move.old.switches,
                    {
                        "hot": f"{move.hot[0]}:{move.hot[1]}",
                        "utilization": round(move.utilization, 4),
                        "rate_bps": round(move.rate),
                        "target_peak": round(move.target_peak, 4),
                        "hops": [f"{s}:{p}" for s, p in move.new.hops],
                    },
                )
            )
        return routes


def _five_tuple(match: Sequence[tuple[str, Any]]) -> FiveTuple | None:
    fields_ = dict(match)
    try:
        if int(fields_.get("ip_proto", -1)) != IPPROTO_TCP:
            return None
        return FiveTuple(
            str(fields_["ipv4_src"]),
            int(fields_["tcp_src"]),
            str(fields_["ipv4_dst"]),
            int(fields_["tcp_dst"]),
            "tcp",
        )
    except (KeyError, ValueError, TypeError):
        return None  # masked or partial: not one of ours
