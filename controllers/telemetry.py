"""Network telemetry: an os-ken app that polls every switch's counters and publishes them.

Runs next to :class:`controllers.app.FabricController` in the controller process
(``python -m controllers --telemetry FILE --telemetry-interval 0.5``)::

    clock thread --EventTimerExpired every `interval` (skipped, not queued, while a tick waits)
        |
        v  (the app's event thread: all state below lives here, no lock)
    finish the previous round if some switch has not answered (it is "missing"), then send
    OFPPortStatsRequest + OFPGroupStatsRequest + OFPGroupDescStatsRequest
    + OFPFlowStatsRequest to every switch
        |
    replies (matched by xid, multipart parts joined) --> SwitchSample per switch
        |  all switches answered (or the next tick came)
        v
    StatsRound --> "stats" line in the telemetry file (controllers.counters, docs/telemetry.md)
               --> LinkLoad (rates against the last sample of each switch)
                   --> EventLinkLoadUpdated to observers (the FabricController, whose policy
                       may react to load: controllers.policies.adaptive)
    EventFlowRouted (from the FabricController: a policy placed or moved a connection)
               --> "route" line in the telemetry file

The file is append-only JSON Lines, bounded: when it would pass ``max_bytes`` it is renamed
``FILE.1`` (``FILE.1`` to ``FILE.2`` ... up to ``keep``; the oldest is deleted) and a new
``FILE`` starts with a header line. A restarted controller appends a new header to the same
file. Polling is off unless a file is given or the policy needs load
(``TelemetrySettings.active``).

Only the fabric's programmable switches are polled (the NVLink switches never connect to the
controller). Replies to requests that are not ours (the FabricController reads each switch's
flow table when it connects) are ignored by xid.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from os_ken.base import app_manager
from os_ken.controller import event, ofp_event
from os_ken.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_3, ofproto_v1_5

from controllers.counters import (
    FlowRoute,
    FlowSample,
    GroupSample,
    LinkLoad,
    PortSample,
    StatsRound,
    SwitchSample,
    dumps,
    encode_round,
    encode_route,
    header_record,
    link_load,
    match_of,
    port_capacities,
)
from controllers.ports import PortMap
from controllers.routing import programmable_switches
from topologies.description import FabricDescription

LOG = logging.getLogger(__name__)

DEFAULT_INTERVAL = 0.5
MIN_INTERVAL = 0.05
DEFAULT_MAX_BYTES = 64 * 2**20
DEFAULT_KEEP = 3
KINDS = ("ports", "groups", "group_desc", "flows")


@dataclass(frozen=True)
class TelemetrySettings:
    """What the telemetry app does; built by ``controllers.__main__`` from the command line."""

    description: FabricDescription
    policy: str = ""
    interval: float = DEFAULT_INTERVAL
    path: Path | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    keep: int = DEFAULT_KEEP
    publish: bool = False  # send EventLinkLoadUpdated (the policy reacts to load)

    @property
    def active(self) -> bool:
        return self.path is not None or self.publish


class EventLinkLoadUpdated(event.EventBase):
    """A poll round finished: the fabric's port and flow rates since the previous one."""

    def __init__(self, load: LinkLoad) -> None:
        super().__init__()
        self.load = load


class EventFlowRouted(event.EventBase):
    """A policy placed, moved or forgot connections (the FabricController sends it)."""

    def __init__(self, routes: Sequence[FlowRoute]) -> None:
        super().__init__()
        self.routes = tuple(routes)


class EventTimerExpired(event.EventBase):
    """The telemetry clock: time for the next poll round (``due``: time.monotonic())."""

    def __init__(self, due: float) -> None:
        super().__init__()
        self.due = due


class TelemetryLog:
    """An append-only JSON Lines file, rotated so that it never passes ``max_bytes`` by much.

    Every file starts with ``header()`` (called again after each rotation). Each record is
    written and flushed as one line, so a reader sees whole lines (it ignores a last line
    without its newline, which is one being written).
    """

    def __init__(
        self, path: Path, header: Callable[[], Mapping[str, Any]], max_bytes: int, keep: int
    ) -> None:
        if keep < 1:
            raise ValueError("keep at least one rotated telemetry file")
        self.path = path
        self.header = header
        self.max_bytes = max_bytes
        self.keep = keep
        self.rotations = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._out: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._size = self._out.tell()
        self._write_line(dumps(self.header()))

    def write(self, record: Mapping[str, Any]) -> None:
        line = dumps(record)
        if self._size + len(line) + 1 > self.max_bytes and self._size > 0:
            self._rotate()
        self._write_line(line)

    def _write_line(self, line: str) -> None:
        self._out.write(line + "\n")
        self._out.flush()
        self._size += len(line.encode()) + 1

    def _rotate(self) -> None:
        self._out.close()
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self.rotations += 1
        self._out = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self._size = 0
        self._write_line(dumps(self.header()))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._out.close()


@dataclass
class _Round:
    number: int
    t: float
    started: float  # time.monotonic()
    xids: dict[int, tuple[int, str]] = field(default_factory=dict)  # xid -> (dpid, kind)
    waiting: dict[int, set[str]] = field(default_factory=dict)  # dpid -> kinds not done
    parts: dict[int, dict[str, list[Any]]] = field(default_factory=dict)  # dpid -> kind -> body
    answered: dict[int, float] = field(default_factory=dict)  # dpid -> time.time() of last


class TelemetryMonitor(app_manager.OSKenApp):
    # os-ken speaks the intersection of its apps' versions: both the FabricController's.
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION, ofproto_v1_5.OFP_VERSION]
    _EVENTS = [EventLinkLoadUpdated]

    def __init__(
        self, *args: Any, astral_telemetry: TelemetrySettings | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.settings = astral_telemetry
        self.datapaths: dict[int, Any] = {}
        self.round: _Round | None = None
        self.rounds = 0
        self.incomplete = 0
        self.skipped = 0
        self.last: dict[str, SwitchSample] = {}
        self.starts: list[float] = []  # time.monotonic() of every round, for the summary
        self._tick_pending = False
        self.log: TelemetryLog | None = None
        if astral_telemetry is None:
            self.names: dict[int, str] = {}
            self.ports = PortMap()
            self.capacities: dict[tuple[str, int], float] = {}
            return
        description = astral_telemetry.description
        self.names = {s.dpid: s.name for s in programmable_switches(description.fabric)}
        self.ports = PortMap.of(description)
        self.capacities = port_capacities(description)
        if astral_telemetry.path is not None:
            self.log = TelemetryLog(
                astral_telemetry.path,
                self._header,
                astral_telemetry.max_bytes,
                astral_telemetry.keep,
            )

    def _header(self) -> Mapping[str, Any]:
        assert self.settings is not None
        return header_record(
            time.time(),
            self.settings.description.fabric.name,
            self.settings.policy,
            self.settings.interval,
            {name: dpid for dpid, name in self.names.items()},
            os.getpid(),
        )

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        super().start()
        if self.settings is not None and self.settings.active:
            self.threads.append(hub.spawn(self._clock))
            LOG.info(
                "telemetry: polling %d switches every %.3f s%s",
                len(self.names),
                self.settings.interval,
                f", writing {self.settings.path}" if self.settings.path else "",
            )

    def _clock(self) -> None:
        """Ticks on a fixed schedule (no drift); a tick still queued makes the next one skip."""
        assert self.settings is not None
        interval = self.settings.interval
        due = time.monotonic() + interval
        while self.is_active:
            delay = due - time.monotonic()
            if delay > 0:
                hub.sleep(delay)
            if not self.is_active:
                break
            if self._tick_pending:
                self.skipped += 1
            else:
                self._tick_pending = True
                self.send_event(self.name, EventTimerExpired(due))
            due += interval
            now = time.monotonic()
            while due <= now:  # fell behind by more than a period: skip, do not burst
                due += interval
                self.skipped += 1

    def close(self) -> None:
        """Called by os-ken's AppManager after the event thread has stopped."""
        if self.starts:
            periods = sorted(b - a for a, b in itertools.pairwise(self.starts))
            if periods:
                LOG.info(
                    "telemetry: %d rounds, period mean %.1f ms, p95 %.1f ms, max %.1f ms; "
                    "%d incomplete, %d ticks skipped",
                    self.rounds,
                    1e3 * sum(periods) / len(periods),
                    1e3 * periods[int(0.95 * (len(periods) - 1))],
                    1e3 * periods[-1],
                    self.incomplete,
                    self.skipped,
                )
        if self.log is not None:
            self.log.close()

    # --- switches ------------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def state_change(self, ev: Any) -> None:
        dp = ev.datapath
        dpid = dp.id
        if ev.state == MAIN_DISPATCHER and dpid in self.names:
            self.datapaths[dpid] = dp
        elif ev.state == DEAD_DISPATCHER and dpid is not None:
            known = self.datapaths.get(dpid)
            if known is not None and known is dp:
                del self.datapaths[dpid]

    # --- rounds --------------------------------------------------------------------------

    @set_ev_cls(EventTimerExpired)
    def timer_expired(self, ev: EventTimerExpired) -> None:
        self._tick_pending = False
        if self.round is not None:
            self._finish()
        self._begin()

    def _begin(self) -> None:
        if not self.datapaths:
            return  # nobody connected: nothing to ask, nothing to write
        current = _Round(self.rounds, time.time(), time.monotonic())
        self.round = current
        self.rounds += 1
        self.starts.append(current.started)
        for dpid, dp in sorted(self.datapaths.items()):
            ofp, parser = dp.ofproto, dp.ofproto_parser
            requests = {
                "ports": parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY),
                "groups": parser.OFPGroupStatsRequest(dp, 0, ofp.OFPG_ALL),
                "group_desc": group_desc_request(dp),
                "flows": flow_stats_request(dp),
            }
            current.waiting[dpid] = set(KINDS)
            current.parts[dpid] = {kind: [] for kind in KINDS}
            for kind, request in requests.items():
                dp.set_xid(request)
                current.xids[request.xid] = (dpid, kind)
                dp.send_msg(request)

    def _reply(self, msg: Any, kind: str) -> None:
        current = self.round
        if current is None:
            return
        ours = current.xids.get(msg.xid)
        if ours is None or ours[1] != kind:
            return  # someone else's request, or one from a round already finished
        dpid, _ = ours
        dp = self.datapaths.get(dpid)
        if dp is None or dp is not msg.datapath:
            return
        current.parts[dpid][kind].extend(msg.body)
        if msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            return
        current.waiting[dpid].discard(kind)
        current.answered[dpid] = time.time()
        if not any(current.waiting.values()):
            self._finish()

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def port_stats_reply(self, ev: Any) -> None:
        self._reply(ev.msg, "ports")

    @set_ev_cls(ofp_event.EventOFPGroupStatsReply, MAIN_DISPATCHER)
    def group_stats_reply(self, ev: Any) -> None:
        self._reply(ev.msg, "groups")

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, MAIN_DISPATCHER)
    def group_desc_reply(self, ev: Any) -> None:
        self._reply(ev.msg, "group_desc")

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def flow_stats_reply(self, ev: Any) -> None:
        self._reply(ev.msg, "flows")

    @set_ev_cls(ofp_event.EventOFPFlowDescStatsReply, MAIN_DISPATCHER)
    def flow_desc_reply(self, ev: Any) -> None:
        self._reply(ev.msg, "flows")

    def _finish(self) -> None:
        current = self.round
        assert current is not None and self.settings is not None
        self.round = None
        samples: dict[str, SwitchSample] = {}
        missing = []
        for dpid, kinds in sorted(current.waiting.items()):
            name = self.names[dpid]
            if kinds:
                missing.append(name)
                continue
            samples[name] = self._sample(dpid, name, current)
        took = None if missing else time.monotonic() - current.started
        if missing:
            self.incomplete += 1
            LOG.debug("telemetry round %d: no complete answer from %s", current.number, missing)
        stats = StatsRound(current.number, current.t, samples, tuple(missing), took)
        previous = StatsRound(-1, 0.0, dict(self.last))
        load = link_load(previous, stats, self.capacities)
        self.last.update(samples)
        if self.log is not None:
            try:
                self.log.write(encode_round(stats))
            except OSError as err:
                LOG.error("telemetry: cannot write %s: %s", self.log.path, err)
        if self.settings.publish:
            self.send_event_to_observers(EventLinkLoadUpdated(load))

    def _sample(self, dpid: int, name: str, current: _Round) -> SwitchSample:
        parts = current.parts[dpid]
        dp = self.datapaths.get(dpid)
        ofp_max = dp.ofproto.OFPP_MAX if dp is not None else ofproto_v1_3.OFPP_MAX
        ports = tuple(
            port_sample(p, self.ports.model_port(name, p.port_no))
            for p in sorted(parts["ports"], key=lambda p: p.port_no)
            if p.port_no <= ofp_max
        )

        def model(ofport: int) -> int | None:
            if ofport > ofp_max:
                return None  # the controller, a flood: no egress of the fabric
            return self.ports.model_port(name, ofport)

        described = {d.group_id: bucket_ports(d, model) for d in parts["group_desc"]}
        groups = tuple(
            group_sample(g, described.get(g.group_id, ()))
            for g in sorted(parts["groups"], key=lambda g: g.group_id)
        )
        flows = tuple(
            sorted(
                (flow_sample(f, model) for f in parts["flows"] if f.priority > 0),  # not miss
                key=lambda f: (f.table, -f.priority, repr(f.match)),
            )
        )
        return SwitchSample(name, dpid, current.answered.get(dpid, current.t), ports, groups, flows)

    # --- what policies did ---------------------------------------------------------------

    @set_ev_cls(EventFlowRouted)
    def flow_routed(self, ev: EventFlowRouted) -> None:
        if self.log is None:
            return
        for route in ev.routes:
            try:
                self.log.write(encode_route(route))
            except OSError as err:
                LOG.error("telemetry: cannot write %s: %s", self.log.path, err)
                return


# --- OpenFlow 1.3 / 1.5 stats bodies as samples ----------------------------------------------


def flow_stats_request(dp: Any) -> Any:
    """Every flow entry with its counters: 1.3 flow stats, 1.5 flow descriptions.

    Open vSwitch answers OpenFlow 1.5's flow-description request (type 1) with entries and
    their counters (OXS ``duration``, ``packet_count``, ``byte_count``).
    """
    ofp, parser = dp.ofproto, dp.ofproto_parser
    request = (
        parser.OFPFlowDescStatsRequest
        if ofp.OFP_VERSION >= ofproto_v1_5.OFP_VERSION
        else parser.OFPFlowStatsRequest
    )
    return request(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch())


def port_sample(stat: Any, model_port: int) -> PortSample:
    """An OFPPortStats (same fields in 1.3 and 1.5) as a sample."""
    return PortSample(
        model_port,
        stat.rx_packets,
        stat.tx_packets,
        stat.rx_bytes,
        stat.tx_bytes,
        stat.rx_dropped,
        stat.tx_dropped,
        stat.rx_errors,
        stat.tx_errors,
        stat.duration_sec + stat.duration_nsec / 1e9,
    )


def group_desc_request(dp: Any) -> Any:
    """Every group's buckets (1.5 names the group asked for: all of them)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    if ofp.OFP_VERSION >= ofproto_v1_5.OFP_VERSION:
        return parser.OFPGroupDescStatsRequest(dp, 0, ofp.OFPG_ALL)
    return parser.OFPGroupDescStatsRequest(dp, 0)


def group_sample(stat: Any, ports: tuple[tuple[int, ...], ...] = ()) -> GroupSample:
    """An OFPGroupStats (same in 1.3 and 1.5) as a sample, with the model ports of its
    buckets (``ports``, from its description)."""
    return GroupSample(
        stat.group_id,
        stat.packet_count,
        stat.byte_count,
        stat.duration_sec + stat.duration_nsec / 1e9,
        tuple((b.packet_count, b.byte_count) for b in stat.bucket_stats),
        ports,
    )


def bucket_ports(desc: Any, model: Callable[[int], int | None]) -> tuple[tuple[int, ...], ...]:
    """The model ports each bucket of an OFPGroupDescStats outputs to, in bucket order."""
    return tuple(
        tuple(p for p in (_outputs(bucket.actions, model)[0]) if p is not None)
        for bucket in desc.buckets
    )


def _outputs(
    actions: Sequence[Any], model: Callable[[int], int | None]
) -> tuple[list[int | None], list[int]]:
    """(model ports, groups) that OpenFlow ``actions`` output to."""
    ports: list[int | None] = []
    groups: list[int] = []
    for action in actions:
        if hasattr(action, "group_id"):
            groups.append(action.group_id)
        elif hasattr(action, "port") and hasattr(action, "max_len"):  # OFPActionOutput
            ports.append(model(action.port))
    return ports, groups


def flow_sample(stat: Any, model: Callable[[int], int | None] | None = None) -> FlowSample:
    """An OFPFlowStats (1.3: fields) or OFPFlowDesc (1.5: OXS ``stats``) as a sample, with
    the model ports and groups its apply-actions instructions output to (``model`` maps an
    OpenFlow port number to the model's, None for one outside the fabric)."""
    if hasattr(stat, "packet_count"):
        packets, nbytes = stat.packet_count, stat.byte_count
        duration = stat.duration_sec + stat.duration_nsec / 1e9
    else:
        fields = dict(stat.stats.fields) if stat.stats is not None else {}
        packets, nbytes = fields.get("packet_count", 0), fields.get("byte_count", 0)
        seconds, nanoseconds = fields.get("duration", (0, 0))
        duration = seconds + nanoseconds / 1e9
    ports: list[int] = []
    groups: list[int] = []
    if model is not None:
        for instruction in getattr(stat, "instructions", None) or []:
            found, via = _outputs(getattr(instruction, "actions", None) or [], model)
            ports += [p for p in found if p is not None]
            groups += via
    return FlowSample(
        stat.table_id,
        stat.priority,
        match_of(stat.match.items()),
        packets,
        nbytes,
        duration,
        tuple(ports),
        tuple(groups),
    )
