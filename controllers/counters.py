"""Switch counters as data: samples, the rates derived from them, and the telemetry file format.

Pure Python, no os-ken (as :mod:`controllers.status`), so that the telemetry app
(:mod:`controllers.telemetry`), the policies that react to load
(:mod:`controllers.policies.adaptive`) and the orchestrator's reader
(:mod:`orchestrator.testbed.telemetry`) share one definition of every record and every rate::

    OFPPortStats / OFPGroupStats / OFPFlowStats replies  (controllers.telemetry)
        --> SwitchSample per switch, StatsRound per poll round
        --> encode_round() --> one JSON line in the telemetry file    --> decode_record()
        --> port_rates() / flow_rates() between two rounds --> LinkLoad --> policies

The file format is documented in ``docs/telemetry.md`` (version :data:`VERSION`). Port numbers
are the fabric model's (``topologies.model``), not OpenFlow's; times are ``time.time()``
seconds except ``duration`` fields, which are the switch's own clock (seconds since the port,
flow or group was created) and therefore the best divisor for a rate.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from topologies.description import FabricDescription
from topologies.fivetuple import FiveTuple
from topologies.model import LinkKind, Tier

VERSION = 1

PORT_COLUMNS = (
    "port",
    "rx_packets",
    "tx_packets",
    "rx_bytes",
    "tx_bytes",
    "rx_dropped",
    "tx_dropped",
    "rx_errors",
    "tx_errors",
    "duration",
)
GROUP_COLUMNS = ("group", "packets", "bytes", "duration", "buckets", "bucket_ports")
FLOW_COLUMNS = ("table", "priority", "match", "packets", "bytes", "duration", "out")
#: the columns of files written before 2026-12-07, without where entries and buckets send
#: their packets (read as sending nowhere known)
OLD_COLUMNS = {
    "group": ("group", "packets", "bytes", "duration", "buckets"),
    "flow": ("table", "priority", "match", "packets", "bytes", "duration"),
}

# A match as data: sorted (OXM field, value) pairs; a masked value is "value/mask".
Match = tuple[tuple[str, Any], ...]


# --- samples -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PortSample:
    """One port's counters (OFPPortStats); ``port`` is the model port number."""

    port: int
    rx_packets: int
    tx_packets: int
    rx_bytes: int
    tx_bytes: int
    rx_dropped: int
    tx_dropped: int
    rx_errors: int
    tx_errors: int
    duration: float


@dataclass(frozen=True)
class GroupSample:
    """One group's counters (OFPGroupStats), with (packets, bytes) per bucket in order, and
    the model ports each bucket outputs to (OFPGroupDescStats; empty when not known)."""

    group: int
    packets: int
    bytes: int
    duration: float
    buckets: tuple[tuple[int, int], ...] = ()
    bucket_ports: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class FlowSample:
    """One flow entry's counters (OFPFlowStats); the table-miss entry is never sampled.
    ``ports`` and ``groups``: the model ports and the groups its actions output to (what
    it forwarded where: a switch's forwarded packets per egress, against what the egress
    sent, say which egress lost packets; empty for a drop entry, and in older files)."""

    table: int
    priority: int
    match: Match
    packets: int
    bytes: int
    duration: float
    ports: tuple[int, ...] = ()
    groups: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[int, int, Match]:
        """What identifies the entry in its switch: table, priority and match."""
        return (self.table, self.priority, self.match)


@dataclass(frozen=True)
class SwitchSample:
    """What one switch answered in one round; ``t`` is when its last reply arrived."""

    name: str
    dpid: int
    t: float
    ports: tuple[PortSample, ...] = ()
    groups: tuple[GroupSample, ...] = ()
    flows: tuple[FlowSample, ...] = ()


@dataclass(frozen=True)
class StatsRound:
    """One poll round: requests sent to every connected switch at ``t``.

    ``switches`` holds the switches that answered all its requests before the next round
    began; ``missing`` names the connected ones that did not (their partial answers are
    dropped: a rate needs both counters of a pair from the same moment).
    """

    round: int
    t: float
    switches: Mapping[str, SwitchSample]
    missing: tuple[str, ...] = ()
    took: float | None = None  # seconds from the requests to the last reply (None: missing)


@dataclass(frozen=True)
class FlowRoute:
    """A policy placed, moved or forgot a connection: the path it takes from now on.

    ``path`` lists the switches from the first (where the policy steers it) to the last
    (the ToR delivering to the destination GPU); empty when ``event`` is "expired".
    ``detail`` is policy-specific (for a move: the hot link, its utilization, the flow's rate).
    """

    t: float
    policy: str
    event: str  # "placed" | "moved" | "expired"
    flow: FiveTuple
    path: tuple[str, ...]
    previous: tuple[str, ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)


# --- rates ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PortRate:
    """A port's traffic between two samples (bits and packets per second, drops and errors
    as counts), and its utilization of the emulated link rate (None: no fabric link)."""

    switch: str
    port: int
    dt: float
    rx_bps: float
    tx_bps: float
    rx_pps: float
    tx_pps: float
    rx_dropped: int
    tx_dropped: int
    rx_errors: int
    tx_errors: int
    capacity: float | None = None

    @property
    def tx_utilization(self) -> float | None:
        return None if not self.capacity else self.tx_bps / self.capacity

    @property
    def rx_utilization(self) -> float | None:
        return None if not self.capacity else self.rx_bps / self.capacity


@dataclass(frozen=True)
class FlowRate:
    """A flow entry's traffic between two samples (or since it was installed, if new)."""

    switch: str
    table: int
    priority: int
    match: Match
    packets: int
    bytes: int
    bps: float
    dt: float


@dataclass(frozen=True)
class LinkLoad:
    """The load of the fabric between two poll rounds: what adaptive policies react to.

    ``ports`` by (switch, model port); ``flows`` by (switch, table, priority, match).
    """

    t: float
    round: int
    ports: Mapping[tuple[str, int], PortRate]
    flows: Mapping[tuple[str, int, int, Match], FlowRate]

    def tx_utilization(self, switch: str, port: int) -> float | None:
        rate = self.ports.get((switch, port))
        return None if rate is None else rate.tx_utilization


def port_capacities(description: FabricDescription) -> dict[tuple[str, int], float]:
    """Emulated rate (bit/s, per direction) behind every port of the programmable switches."""
    switches = {n for n, s in description.fabric.switches.items() if s.tier is not Tier.NVLINK}
    capacities = {}
    for link in description.fabric.links:
        if link.kind is LinkKind.NVLINK:
            continue
        rate = description.emulated_rate(link)
        for name, port in ((link.a, link.a_port), (link.b, link.b_port)):
            if name in switches:
                capacities[(name, port)] = rate
    return capacities


def _elapsed(prev_duration: float, cur_duration: float, prev_t: float, cur_t: float) -> float:
    """Seconds between two samples: the switch's clock when it is usable, else ours."""
    dt = cur_duration - prev_duration
    if dt > 0:
        return dt
    return cur_t - prev_t


def port_rates(
    prev: SwitchSample,
    cur: SwitchSample,
    capacities: Mapping[tuple[str, int], float] | None = None,
) -> dict[int, PortRate]:
    """Per-port rates of one switch between two of its samples.

    A port whose counters went backwards (it was re-created, or the switch restarted) or whose
    time did not advance is left out: no rate rather than a wrong one.
    """
    before = {p.port: p for p in prev.ports}
    rates = {}
    for now in cur.ports:
        was = before.get(now.port)
        if was is None or now.duration < was.duration:
            continue
        deltas = [
            now.rx_packets - was.rx_packets,
            now.tx_packets - was.tx_packets,
            now.rx_bytes - was.rx_bytes,
            now.tx_bytes - was.tx_bytes,
        ]
        if min(deltas) < 0:
            continue
        dt = _elapsed(was.duration, now.duration, prev.t, cur.t)
        if dt <= 0:
            continue
        rates[now.port] = PortRate(
            switch=cur.name,
            port=now.port,
            dt=dt,
            rx_bps=8 * deltas[2] / dt,
            tx_bps=8 * deltas[3] / dt,
            rx_pps=deltas[0] / dt,
            tx_pps=deltas[1] / dt,
            rx_dropped=max(0, now.rx_dropped - was.rx_dropped),
            tx_dropped=max(0, now.tx_dropped - was.tx_dropped),
            rx_errors=max(0, now.rx_errors - was.rx_errors),
            tx_errors=max(0, now.tx_errors - was.tx_errors),
            capacity=(capacities or {}).get((cur.name, now.port)),
        )
    return rates


def flow_rates(prev: SwitchSample | None, cur: SwitchSample) -> list[FlowRate]:
    """Per-entry rates of one switch; an entry new since ``prev`` is averaged over its life.

    An entry whose counters went backwards was replaced (deleted and added again between the
    samples): it is treated as new too.
    """
    before = {f.key: f for f in prev.flows} if prev is not None else {}
    rates = []
    for now in cur.flows:
        was = before.get(now.key)
        if was is not None and now.bytes >= was.bytes and now.duration >= was.duration:
            dt = _elapsed(was.duration, now.duration, prev.t if prev else cur.t, cur.t)
            nbytes, npackets = now.bytes - was.bytes, now.packets - was.packets
        else:
            dt, nbytes, npackets = now.duration, now.bytes, now.packets
        bps = 8 * nbytes / dt if dt > 0 else 0.0
        rates.append(
            FlowRate(cur.name, now.table, now.priority, now.match, npackets, nbytes, bps, dt)
        )
    return rates


def link_load(
    prev: StatsRound | None,
    cur: StatsRound,
    capacities: Mapping[tuple[str, int], float] | None = None,
) -> LinkLoad:
    """Rates of every switch present in both rounds (flows: in ``cur``)."""
    ports: dict[tuple[str, int], PortRate] = {}
    flows: dict[tuple[str, int, int, Match], FlowRate] = {}
    for name, sample in cur.switches.items():
        before = prev.switches.get(name) if prev is not None else None
        if before is not None:
            for port, rate in port_rates(before, sample, capacities).items():
                ports[(name, port)] = rate
        for flow in flow_rates(before, sample):
            flows[(name, flow.table, flow.priority, flow.match)] = flow
    return LinkLoad(cur.t, cur.round, ports, flows)


# --- matches -------------------------------------------------------------------------------


def match_of(items: Iterable[tuple[str, Any]]) -> Match:
    """A match as data from OXM (field, value) pairs; (value, mask) becomes "value/mask"."""
    out = []
    for name, value in items:
        if isinstance(value, tuple) and len(value) == 2:
            value = f"{value[0]}/{value[1]}"
        out.append((str(name), value))
    return tuple(sorted(out))


def match_summary(match: Match) -> str:
    """Short text for logs: ``ipv4_dst=10.1.0.1,tcp_dst=5201``."""
    return ",".join(f"{k}={v}" for k, v in match if k != "eth_type") or "any"


# --- the file format -----------------------------------------------------------------------


def header_record(
    t: float,
    fabric: str,
    policy: str,
    interval: float,
    switches: Mapping[str, int],
    pid: int,
) -> dict[str, Any]:
    """The first line of every telemetry file (also after a rotation)."""
    return {
        "type": "header",
        "version": VERSION,
        "t": t,
        "pid": pid,
        "fabric": fabric,
        "policy": policy,
        "interval": interval,
        "switches": dict(sorted(switches.items())),
        "columns": {
            "port": list(PORT_COLUMNS),
            "group": list(GROUP_COLUMNS),
            "flow": list(FLOW_COLUMNS),
        },
    }


def encode_round(stats: StatsRound) -> dict[str, Any]:
    """A ``"stats"`` record: one poll round, rows in the header's column order."""
    switches = {}
    for name in sorted(stats.switches):
        s = stats.switches[name]
        switches[name] = {
            "dpid": s.dpid,
            "t": round(s.t, 6),
            "ports": [
                [
                    p.port,
                    p.rx_packets,
                    p.tx_packets,
                    p.rx_bytes,
                    p.tx_bytes,
                    p.rx_dropped,
                    p.tx_dropped,
                    p.rx_errors,
                    p.tx_errors,
                    round(p.duration, 9),
                ]
                for p in s.ports
            ],
            "groups": [
                [
                    g.group,
                    g.packets,
                    g.bytes,
                    round(g.duration, 9),
                    [list(b) for b in g.buckets],
                    [list(b) for b in g.bucket_ports],
                ]
                for g in s.groups
            ],
            "flows": [
                [
                    f.table,
                    f.priority,
                    dict(f.match),
                    f.packets,
                    f.bytes,
                    round(f.duration, 9),
                    [*f.ports, *(f"g{g}" for g in f.groups)],
                ]
                for f in s.flows
            ],
        }
    return {
        "type": "stats",
        "round": stats.round,
        "t": round(stats.t, 6),
        "took": None if stats.took is None else round(stats.took, 6),
        "switches": switches,
        "missing": list(stats.missing),
    }


def encode_route(route: FlowRoute) -> dict[str, Any]:
    """A ``"route"`` record: a policy placed, moved or forgot one connection."""
    return {
        "type": "route",
        "t": round(route.t, 6),
        "policy": route.policy,
        "event": route.event,
        "flow": route.flow.to_dict(),
        "path": list(route.path),
        "previous": list(route.previous),
        "detail": dict(route.detail),
    }


def dumps(record: Mapping[str, Any]) -> str:
    """One line of the file (no newline): compact JSON."""
    return json.dumps(record, separators=(",", ":"))


def decode_round(record: Mapping[str, Any]) -> StatsRound:
    """The :class:`StatsRound` of a ``"stats"`` record (columns of :data:`VERSION`)."""
    switches = {}
    for name, s in record["switches"].items():
        switches[name] = SwitchSample(
            name=name,
            dpid=int(s["dpid"]),
            t=float(s["t"]),
            ports=tuple(PortSample(*row) for row in s.get("ports", [])),
            groups=tuple(_group(row) for row in s.get("groups", [])),
            flows=tuple(_flow(row) for row in s.get("flows", [])),
        )
    took = record.get("took")
    return StatsRound(
        int(record["round"]),
        float(record["t"]),
        switches,
        tuple(record.get("missing", [])),
        None if took is None else float(took),
    )


def _group(row: Sequence[Any]) -> GroupSample:
    g, p, b, d, buckets = row[:5]
    ports = tuple(tuple(int(x) for x in bucket) for bucket in row[5]) if len(row) > 5 else ()
    return GroupSample(int(g), int(p), int(b), float(d), tuple((x, y) for x, y in buckets), ports)


def _flow(row: Sequence[Any]) -> FlowSample:
    tb, pr, m, p, b, d = row[:6]
    out = row[6] if len(row) > 6 else []
    ports = tuple(int(x) for x in out if not isinstance(x, str))
    groups = tuple(int(x[1:]) for x in out if isinstance(x, str) and x.startswith("g"))
    return FlowSample(
        int(tb), int(pr), match_of(m.items()), int(p), int(b), float(d), ports, groups
    )


def decode_route(record: Mapping[str, Any]) -> FlowRoute:
    return FlowRoute(
        t=float(record["t"]),
        policy=str(record["policy"]),
        event=str(record["event"]),
        flow=FiveTuple.from_dict(record["flow"]),
        path=tuple(record.get("path", [])),
        previous=tuple(record.get("previous", [])),
        detail=dict(record.get("detail", {})),
    )


def rotated_names(name: str, keep: int) -> list[str]:
    """The files of one telemetry stream, oldest first: ``name.<keep>`` ... ``name.1``, ``name``."""
    return [f"{name}.{i}" for i in range(keep, 0, -1)] + [name]


def check_columns(header: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``header`` announces the version and columns decoded here."""
    if header.get("type") != "header" or header.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} telemetry header: {dict(header)!r:.200}")
    columns = header.get("columns", {})
    expected = {"port": PORT_COLUMNS, "group": GROUP_COLUMNS, "flow": FLOW_COLUMNS}
    for kind, names in expected.items():
        found = tuple(columns.get(kind, ()))
        if found != names and found != OLD_COLUMNS.get(kind):
            raise ValueError(f"telemetry {kind} columns {columns.get(kind)!r} != {list(names)}")
