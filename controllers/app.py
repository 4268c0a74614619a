"""The os-ken application that programs the fabric's switches from a policy's plan.

Architecture (one process, started by ``python -m controllers``)::

    fabric description (JSON) --> Policy.render(description, failed links) --> ForwardingPlan
                                        ^                                          |
      OFPPortStatus / port desc --------+ (set of failed links changed)            v
                                                     diff against what each switch has
                                                     --> OFPFlowMod ... + OFPBarrierRequest
                                                     <-- OFPBarrierReply: "programmed"
                                                     --> status file (controllers.status)

What a switch goes through: connect -> ``EventOFPSwitchFeatures``: install the table-miss
entry (drop: nothing is ever flooded) and one entry sending ARP to the controller, and ask
for the switch's flow table and group table -> the port description reply (os-ken's
ofp_handler asks for it) tells which ports are down, the flow and group replies what the
switch already has -> delete what is not ours (but a fault's entries, whose cookies are
``controllers.plan.FAULT_COOKIE``'s: the orchestrator removes those), send the difference
between the plan and what is there (after a controller restart: nothing, so the data plane
is not disturbed), then a barrier; its reply marks the switch programmed. A port status
message that changes the set of failed links makes the policy render a new plan; every
programmed switch gets the difference, then a barrier.

Order of a difference (a flow may only point at a group that exists, and deleting a group
deletes the flows that point at it)::

    add / modify groups  -> barrier -> delete / add / modify flows -> barrier
    -> delete groups     -> barrier (its reply: "programmed")

Modify keeps an entry's counters. A group whose buckets change is modified in place (one
message, atomic in the switch); group ids are stable across renders
(``controllers.plan.stable_group_id``).

OpenFlow versions: the app offers 1.3 and 1.5 and works with either (``controllers.openflow``
holds the differences). Select groups need 1.5 for Open vSwitch's ``selection_method=hash``
(deterministic bucket choice); a switch that speaks only 1.3 gets its select groups with
the switch's default method (``dp_hash``) and a warning. Bridges should allow both:
``protocols=OpenFlow13,OpenFlow15``. os-ken intersects the ``OFP_VERSIONS`` of every app in
the process, so every app loaded with this one must offer 1.5 too (``OFP_VERSIONS`` here).

A link counts as failed while a switch at either end reports its port down (link down,
administratively down, or deleted). A switch that disconnects is not a failure by itself:
its neighbours' ports tell.

What the app knows about each switch (its connection, what it holds, its ports that are down)
is one :class:`~controllers.session.SwitchSession` per dpid, in ``sessions``. Handlers run on
the app's one event thread (os-ken's native hub), so that state needs no lock; only the
status file is also written from the main thread (start, stop), under a lock.

Configuration: os-ken passes keyword arguments of ``AppManager.instantiate_apps`` to every
app's constructor. ``controllers.__main__`` builds a :class:`ControllerSettings` (one typed
object, docs/architecture.md) and passes it as ``astral_settings``; os-ken's global ``CONF``
carries only os-ken's own options (listen address and port).

ARP: GPUs have a permanent neighbour entry for the gateway, but the kernel flushes even
permanent entries of a device that is set administratively down (a link failure emulated with
``ip link set DEV down``), and then the GPU ARPs on that port once it is up again. Requests
for the gateway address are answered with the gateway MAC; every other packet that reaches
the controller is dropped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from os_ken.base import app_manager
from os_ken.controller import event, ofp_event
from os_ken.controller.handler import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    HANDSHAKE_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from os_ken.lib.packet import arp, ether_types, ethernet, ipv4, packet, tcp

from controllers import openflow
from controllers.counters import FlowRoute
from controllers.events import event as log_event
from controllers.openflow import COOKIE, OFP15, OFP_VERSIONS, entry_from_flow_stats
from controllers.pinning import write_json
from controllers.plan import (
    ARP_PRIORITY,
    MISS_PRIORITY,
    FlowEntry,
    FlowKey,
    ForwardingPlan,
    GroupEntry,
    GroupType,
    Packet,
    is_fault_cookie,
)
from controllers.policies import Policy
from controllers.ports import PortMap
from controllers.routing import failed_links_at, programmable_switches
from controllers.session import Connecting, SwitchSession
from controllers.status import ControllerStatus, SwitchStatus, write_status
from controllers.telemetry import EventFlowRouted, EventLinkLoadUpdated
from topologies.addressing import GATEWAY_IP, GATEWAY_MAC
from topologies.description import FabricDescription
from topologies.model import Link

LOG = logging.getLogger(__name__)

# Entries of table 0 besides the plan's: table-miss (drop) and ARP to the controller.
BASE_FLOWS = 2


@dataclass(frozen=True)
class ControllerSettings:
    """Everything the app needs, resolved before os-ken starts (errors surface early)."""

    description: FabricDescription
    policy: Policy
    listen_host: str
    listen_port: int
    status_path: Path | None = None
    paths_path: Path | None = None  # where a policy's publish() document goes


class EventListenerBound(event.EventBase):
    """The OpenFlow listener is bound (sent by ``controllers.__main__``, which checks)."""


def gateway_arp_reply(data: bytes) -> bytes | None:
    """The gateway's answer to an ARP request for ``GATEWAY_IP`` in ``data``, else None."""
    pkt = packet.Packet(data)
    eth = pkt.get_protocol(ethernet.ethernet)
    req = pkt.get_protocol(arp.arp)
    if eth is None or req is None or req.opcode != arp.ARP_REQUEST or req.dst_ip != GATEWAY_IP:
        return None
    reply = packet.Packet()
    reply.add_protocol(
        ethernet.ethernet(dst=req.src_mac, src=GATEWAY_MAC, ethertype=ether_types.ETH_TYPE_ARP)
    )
    reply.add_protocol(
        arp.arp(
            opcode=arp.ARP_REPLY,
            src_mac=GATEWAY_MAC,
            src_ip=GATEWAY_IP,
            dst_mac=req.src_mac,
            dst_ip=req.src_ip,
        )
    )
    reply.serialize()
    return bytes(reply.data)


def tcp_packet(data: bytes) -> Packet | None:
    """The five-tuple of an IPv4 TCP packet in ``data`` (an Ethernet frame), else None."""
    pkt = packet.Packet(data)
    ip = pkt.get_protocol(ipv4.ipv4)
    segment = pkt.get_protocol(tcp.tcp)
    if ip is None or segment is None:
        return None
    return Packet.tcp(ip.src, ip.dst, segment.src_port, segment.dst_port)


def diff_flows(
    installed: dict[FlowKey, FlowEntry], desired: dict[FlowKey, FlowEntry]
) -> tuple[list[FlowEntry], list[FlowEntry], list[FlowEntry]]:
    """(to delete, to add, to modify) to turn ``installed`` into ``desired`` (keyed by match)."""
    return _diff(installed, desired)


def diff_groups(
    installed: dict[int, GroupEntry], desired: dict[int, GroupEntry]
) -> tuple[list[GroupEntry], list[GroupEntry], list[GroupEntry]]:
    """(to delete, to add, to modify) to turn ``installed`` into ``desired`` (by group id)."""
    return _diff(installed, desired)


def _diff(
    installed: dict[Any, Any], desired: dict[Any, Any]
) -> tuple[list[Any], list[Any], list[Any]]:
    delete = [installed[k] for k in sorted(installed.keys() - desired.keys(), key=repr)]
    add = [desired[k] for k in sorted(desired.keys() - installed.keys(), key=repr)]
    modify = [
        desired[k]
        for k in sorted(desired.keys() & installed.keys(), key=repr)
        if desired[k] != installed[k]
    ]
    return delete, add, modify


class FabricController(app_manager.OSKenApp):
    OFP_VERSIONS = OFP_VERSIONS
    _EVENTS = [EventFlowRouted]  # to the telemetry app (controllers.telemetry)

    def __init__(
        self, *args: Any, astral_settings: ControllerSettings | None = None, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        if astral_settings is None:
            raise RuntimeError(
                "FabricController needs astral_settings; start it with python -m controllers"
            )
        self.settings = astral_settings
        openflow.fix_os_ken_group_parsing()
        self.description = astral_settings.description
        self.fabric = self.description.fabric
        self.policy = astral_settings.policy
        self.ports = PortMap.of(self.description)
        self.switch_names = {s.dpid: s.name for s in programmable_switches(self.fabric)}
        self.sessions: dict[int, SwitchSession] = {}  # every dpid that ever connected
        self.failed: frozenset[Link] = frozenset()
        self.plan: ForwardingPlan = self.policy.render(self.description, self.failed)
        now = time.time()
        self.status = ControllerStatus(
            pid=os.getpid(),
            fabric=self.fabric.name,
            policy=self.policy.name,
            listen_host=astral_settings.listen_host,
            listen_port=astral_settings.listen_port,
            started_at=now,
            updated_at=now,
            expected_dpids=sorted(self.switch_names),
        )
        self._status_lock = threading.Lock()
        self._paths_lock = threading.Lock()
        self._paths_generation = 0
        self.write_status()
        self.publish_paths()

    # --- status file ---------------------------------------------------------------------

    def write_status(self) -> None:
        path = self.settings.status_path
        if path is None:
            return
        with self._status_lock:
            self.status.updated_at = time.time()
            self.status.failed_links = sorted((x.a, x.a_port, x.b, x.b_port) for x in self.failed)
            try:
                write_status(path, self.status)
            except OSError as err:
                LOG.error("cannot write the status file %s: %s", path, err)

    def publish_paths(self) -> None:
        """Write the policy's published document (path-pinned's paths) for the current
        failures, in a background thread: it can take seconds on a large fabric, and the
        event thread must keep programming switches. A newer render's document wins.
        """
        publish = getattr(self.policy, "publish", None)
        path = self.settings.paths_path
        if publish is None or path is None:
            return
        with self._paths_lock:
            self._paths_generation += 1
            generation = self._paths_generation
        failed = self.failed

        def work() -> None:
            started = time.monotonic()
            try:
                document = publish(self.description, failed)
                with self._paths_lock:
                    if generation != self._paths_generation:
                        return
                    write_json(path, document)
            except Exception:
                LOG.exception("cannot write the paths file %s", path)
                return
            LOG.info(
                "paths file %s written in %.2f s (%d failed links)",
                path,
                time.monotonic() - started,
                len(failed),
            )

        threading.Thread(target=work, name="publish-paths", daemon=True).start()

    def _session(self, dpid: int) -> SwitchSession:
        """The session of ``dpid``, created (with its status entry) when it first connects."""
        session = self.sessions.get(dpid)
        if session is None:
            name = self.switch_names.get(dpid)
            if dpid not in self.status.switches:
                self.status.switches[dpid] = SwitchStatus(dpid, name)
            session = SwitchSession(dpid, name, self.status.switches[dpid])
            self.sessions[dpid] = session
        return session

    def _session_of(self, dp: Any) -> SwitchSession | None:
        """The session whose current connection is ``dp`` (None: a stale one, ignore it)."""
        for session in self.sessions.values():
            if session.datapath is dp:
                return session
        return None

    def _ready(self) -> list[SwitchSession]:
        """The switches that get every new plan (programmed at least once), by dpid."""
        return [self.sessions[dpid] for dpid in sorted(self.sessions) if self.sessions[dpid].ready]

    def close(self) -> None:
        """Called by os-ken's AppManager after the event thread has stopped."""
        self.status.state = "stopped"
        self.write_status()

    @set_ev_cls(EventListenerBound)
    def listener_bound(self, ev: EventListenerBound) -> None:
        self.status.listening = True
        self.status.state = "running"
        LOG.info(
            "listening on %s:%d, policy %s, fabric %s (%d switches to program)",
            self.settings.listen_host,
            self.settings.listen_port,
            self.policy.name,
            self.fabric.name,
            len(self.switch_names),
        )
        self.write_status()

    # --- connection ----------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev: Any) -> None:
        dp = ev.msg.datapath
        dpid = ev.msg.datapath_id
        name = self.switch_names.get(dpid)
        session = self._session(dpid)
        session.connect(dp)
        st = session.status
        st.connected, st.programmed, st.connected_at = True, False, time.time()
        st.programmed_at, st.rules, st.groups = None, 0, 0
        st.openflow = dp.ofproto.OFP_VERSION
        if name is None:
            LOG.warning("switch with unknown dpid %d connected; it only gets a drop rule", dpid)
            self._send_wipe(dp)
            self._send_base(dp, arp_to_controller=False)
            st.flows = 1
            self.write_status()
            return
        LOG.info(
            "switch %s (dpid %d) connected from %s, OpenFlow version %#x",
            name,
            dpid,
            dp.address,
            dp.ofproto.OFP_VERSION,
            extra=log_event("connect", name),
        )
        # Base entries first: adding an identical entry replaces it without a gap.
        self._send_base(dp, arp_to_controller=True)
        st.flows = BASE_FLOWS
        # Before programming: which ports are down (os-ken's ofp_handler asks for the port
        # descriptions) and what the switch already has (kept across a controller restart:
        # only the difference is sent, so a restart does not disturb the data plane).
        table_request = openflow.flow_table_request(dp)
        dp.send_msg(table_request)  # sets its xid
        session.connecting = Connecting(flows_xid=table_request.xid)
        dp.send_msg(openflow.group_table_request(dp))
        self.write_status()

    def _send_wipe(self, dp: Any) -> None:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        dp.send_msg(
            parser.OFPFlowMod(
                dp,
                table_id=ofp.OFPTT_ALL,
                command=ofp.OFPFC_DELETE,
                out_port=ofp.OFPP_ANY,
                out_group=ofp.OFPG_ANY,
                match=parser.OFPMatch(),
            )
        )
        dp.send_msg(openflow.group_delete(dp, ofp.OFPG_ALL))

    def _send_base(self, dp: Any, arp_to_controller: bool) -> None:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        # Table-miss: no instructions = drop. Nothing is ever flooded.
        dp.send_msg(
            parser.OFPFlowMod(
                dp, cookie=COOKIE, priority=MISS_PRIORITY, match=parser.OFPMatch(), instructions=[]
            )
        )
        if arp_to_controller:
            actions = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)]
            dp.send_msg(
                parser.OFPFlowMod(
                    dp,
                    cookie=COOKIE,
                    priority=ARP_PRIORITY,
                    match=parser.OFPMatch(eth_type=ether_types.ETH_TYPE_ARP),
                    instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)],
                )
            )

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def port_desc_reply(self, ev: Any) -> None:
        dp = ev.msg.datapath
        session = self._session_of(dp)
        connecting = session.connecting if session is not None else None
        if session is None or connecting is None or connecting.ports_done:
            return
        ofp = dp.ofproto
        for port in ev.msg.body:
            if port.port_no <= ofp.OFPP_MAX and _is_down(ofp, port):
                connecting.down.add(port.port_no)
        if not ev.msg.flags & ofp.OFPMPF_REPLY_MORE:
            connecting.ports_done = True
            self._connected(session)

    # OpenFlow 1.3 answers a flow-stats request, 1.5 a flow-desc request (controllers.openflow).
    @set_ev_cls(
        [ofp_event.EventOFPFlowStatsReply, ofp_event.EventOFPFlowDescStatsReply],
        [CONFIG_DISPATCHER, MAIN_DISPATCHER],
    )
    def flow_stats_reply(self, ev: Any) -> None:
        dp = ev.msg.datapath
        session = self._session_of(dp)
        connecting = session.connecting if session is not None else None
        if session is None or connecting is None or connecting.flows_done:
            return
        if ev.msg.xid != connecting.flows_xid:
            return  # another app's counters (telemetry), not the table read at connection
        connecting.flows.extend(ev.msg.body)
        if not ev.msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            connecting.flows_done = True
            self._connected(session)

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def group_desc_reply(self, ev: Any) -> None:
        dp = ev.msg.datapath
        session = self._session_of(dp)
        connecting = session.connecting if session is not None else None
        if session is None or connecting is None or connecting.groups_done:
            return
        connecting.groups.extend(ev.msg.body)
        if not ev.msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            connecting.groups_done = True
            self._connected(session)

    def _connected(self, session: SwitchSession) -> None:
        """Port states, flow and group tables known: remove what is not ours, then program."""
        connecting = session.connecting
        assert connecting is not None  # only the replies it waits for get here
        if not (connecting.ports_done and connecting.flows_done and connecting.groups_done):
            return
        session.connecting = None
        dp = session.datapath
        dpid = session.dpid
        name = self.switch_names[dpid]
        ofp, parser = dp.ofproto, dp.ofproto_parser
        groups: dict[int, GroupEntry] = {}
        stale_groups = []
        for stat in connecting.groups:
            group = openflow.group_from_desc(stat, ofp.OFP_VERSION, dpid, name, self.ports)
            if group is None:
                stale_groups.append(int(stat.group_id))
            else:
                groups[group.group_id] = group
        installed: dict[FlowKey, FlowEntry] = {}
        stale = []
        for stat in connecting.flows:
            entry = entry_from_flow_stats(stat, dpid, name, self.ports, COOKIE)
            if (
                entry is not None
                and entry.key not in installed
                and all(g in groups for g in _groups_used(entry))
            ):
                installed[entry.key] = entry
            elif not _is_base(stat) and not is_fault_cookie(stat.cookie):
                stale.append(stat)  # a fault's entry is the orchestrator's to remove
        for stat in stale:  # left by another controller, or by a policy that ran before
            dp.send_msg(
                parser.OFPFlowMod(
                    dp,
                    table_id=stat.table_id,
                    command=ofp.OFPFC_DELETE_STRICT,
                    priority=stat.priority,
                    out_port=ofp.OFPP_ANY,
                    out_group=ofp.OFPG_ANY,
                    match=stat.match,
                )
            )
        # Groups this controller would not have installed (their flows were just deleted;
        # ours that point at them were counted as stale above).
        for group_id in stale_groups:
            dp.send_msg(openflow.group_delete(dp, group_id))
        session.installed = installed
        session.installed_groups = groups
        session.down = {self.ports.model_port(name, p) for p in connecting.down}
        LOG.info(
            "%s: %d route entries and %d groups found, %d stale entries and %d groups "
            "removed, ports down: %s",
            name,
            len(installed),
            len(groups),
            len(stale),
            len(stale_groups),
            sorted(session.down) or "none",
        )
        self._update_failures()  # pushes to the switches already programmed, if changed
        session.ready = True
        self._push(session)
        self.write_status()

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def switch_gone(self, ev: Any) -> None:
        session = self._session_of(ev.datapath)
        if session is None:
            return
        LOG.info(
            "switch %s (dpid %d) disconnected",
            self.switch_names.get(session.dpid, "?"),
            session.dpid,
            extra=log_event("disconnect", self.switch_names.get(session.dpid)),
        )
        session.disconnect()
        st = session.status
        st.connected = st.programmed = False
        self.write_status()

    # --- failures ------------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPPortStatus, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def port_status(self, ev: Any) -> None:
        msg = ev.msg
        dp = msg.datapath
        session = self._session_of(dp)
        name = session.name if session is not None else None
        if session is None or name is None:
            return
        ofp = dp.ofproto
        if msg.desc.port_no > ofp.OFPP_MAX:
            return
        port = self.ports.model_port(name, msg.desc.port_no)
        down = msg.reason == ofp.OFPPR_DELETE or _is_down(ofp, msg.desc)
        connecting = session.connecting
        if connecting is not None:  # not programmed yet: remember for then
            (connecting.down.add if down else connecting.down.discard)(msg.desc.port_no)
            return
        ports = session.down
        if down == (port in ports):
            return
        (ports.add if down else ports.discard)(port)
        LOG.info(
            "%s port %d %s",
            name,
            port,
            "down" if down else "up",
            extra=log_event("port-down" if down else "port-up", name, port),
        )
        if self._update_failures():
            self.write_status()

    def _update_failures(self) -> bool:
        """Re-render if the failed links changed; push to every ready switch. True if so."""
        down = [
            (session.name, port)
            for session in self.sessions.values()
            if session.name is not None
            for port in session.down
        ]
        failed = failed_links_at(self.fabric, down)
        if failed == self.failed:
            return False
        self.failed = failed
        started = time.monotonic()
        self.plan = self.policy.render(self.description, failed)
        self.status.reprograms += 1
        LOG.info(
            "failed links now %s; new plan in %.1f ms",
            sorted(f"{x.a}:{x.a_port}-{x.b}:{x.b_port}" for x in failed) or "none",
            (time.monotonic() - started) * 1e3,
            extra=log_event("reprogram"),
        )
        for session in self._ready():
            self._push(session)
        self.publish_paths()
        return True

    # --- programming ---------------------------------------------------------------------

    def _push(self, session: SwitchSession) -> None:
        """Bring the switch to the current plan, then ask for a barrier (order: module doc)."""
        dp = session.datapath
        dpid = session.dpid
        name = self.switch_names[dpid]
        table = self.plan.tables.get(dpid)
        desired = {e.key: e for e in table.flows} if table else {}
        desired_groups = {g.group_id: g for g in table.groups} if table else {}
        delete, add, modify = diff_flows(session.installed, desired)
        g_delete, g_add, g_modify = diff_groups(session.installed_groups, desired_groups)
        st = session.status
        changes = delete or add or modify or g_delete or g_add or g_modify
        if not changes and (st.programmed or session.barrier is not None):
            return
        ofp, parser = dp.ofproto, dp.ofproto_parser
        if (
            ofp.OFP_VERSION < OFP15
            and not session.warned_v13
            and any(g.type is GroupType.SELECT and g.selection for g in desired_groups.values())
        ):
            session.warned_v13 = True
            LOG.warning(
                "%s speaks OpenFlow 1.3 only: its select groups use the switch's default "
                "selection method (dp_hash), not hash with a per-switch basis; allow "
                "OpenFlow15 on the bridge",
                name,
            )
        for group in g_add:
            dp.send_msg(openflow.group_mod(dp, group, ofp.OFPGC_ADD, self.ports))
        for group in g_modify:
            dp.send_msg(openflow.group_mod(dp, group, ofp.OFPGC_MODIFY, self.ports))
        if g_add or g_modify:
            dp.send_msg(parser.OFPBarrierRequest(dp))
        for entry in delete:
            dp.send_msg(openflow.flow_mod(dp, entry, ofp.OFPFC_DELETE_STRICT, self.ports, COOKIE))
        for entry in add:
            dp.send_msg(openflow.flow_mod(dp, entry, ofp.OFPFC_ADD, self.ports, COOKIE))
        for entry in modify:
            # Modify keeps the entry's counters (telemetry and adaptive policies read them).
            dp.send_msg(openflow.flow_mod(dp, entry, ofp.OFPFC_MODIFY_STRICT, self.ports, COOKIE))
        if g_delete:
            dp.send_msg(parser.OFPBarrierRequest(dp))
            for group in g_delete:
                dp.send_msg(openflow.group_delete(dp, group.group_id))
        session.installed = desired
        session.installed_groups = desired_groups
        session.generation += 1
        generation = session.generation
        barrier = parser.OFPBarrierRequest(dp)
        dp.send_msg(barrier)
        session.barrier = (barrier.xid, generation)
        st.programmed = False
        st.rules = len(desired)
        st.groups = len(desired_groups)
        st.flows = len(desired) + BASE_FLOWS
        LOG.debug(
            "%s: flows -%d +%d ~%d, groups -%d +%d ~%d (generation %d)",
            name,
            len(delete),
            len(add),
            len(modify),
            len(g_delete),
            len(g_add),
            len(g_modify),
            generation,
        )

    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def barrier_reply(self, ev: Any) -> None:
        session = self._session_of(ev.msg.datapath)
        if session is None or session.barrier is None:
            return
        xid, generation = session.barrier
        if ev.msg.xid != xid or generation != session.generation:
            return
        session.barrier = None
        st = session.status
        st.programmed, st.programmed_at = True, time.time()
        LOG.info(
            "%s programmed: %d rules (%.0f ms after connecting)",
            self.switch_names[session.dpid],
            st.rules,
            (st.programmed_at - (st.connected_at or st.programmed_at)) * 1e3,
            extra=log_event("programmed", self.switch_names[session.dpid]),
        )
        if self.status.programmed():
            LOG.info("all %d switches programmed", len(self.status.expected_dpids))
        self.write_status()

    @set_ev_cls(
        ofp_event.EventOFPErrorMsg, [HANDSHAKE_DISPATCHER, CONFIG_DISPATCHER, MAIN_DISPATCHER]
    )
    def error_msg(self, ev: Any) -> None:
        msg = ev.msg
        session = self._session_of(msg.datapath)
        LOG.warning(
            "OpenFlow error from dpid %s: type %d code %d (%s)",
            session.dpid if session is not None else None,
            msg.type,
            msg.code,
            bytes(msg.data[:64]).hex(),
            extra=log_event("error", session.name if session is not None else None),
        )
        if session is not None:
            session.status.errors += 1
            self.write_status()

    # --- packets -------------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in(self, ev: Any) -> None:
        msg = ev.msg
        dp = msg.datapath
        reply = gateway_arp_reply(bytes(msg.data))
        if reply is None:
            self._packet_to_policy(dp, msg)
            return  # dropped: the controller never floods
        in_port = msg.match["in_port"]
        dp.send_msg(openflow.packet_out(dp, in_port, reply))
        session = self._session_of(dp)
        LOG.debug(
            "answered ARP for the gateway on dpid %s port %d",
            session.dpid if session is not None else None,
            in_port,
        )

    # --- policies that react to traffic (controllers.policies.adaptive) ------------------

    def _packet_to_policy(self, dp: Any, msg: Any) -> None:
        """A TCP packet a policy's entry copied here: the policy may steer its connection."""
        react = getattr(self.policy, "on_packet_in", None)
        session = self._session_of(dp)
        if react is None or session is None or not session.ready:
            return
        found = tcp_packet(bytes(msg.data))
        if found is None:
            return
        name = self.switch_names[session.dpid]
        in_port = self.ports.model_port(name, msg.match["in_port"])
        self._routes_changed(react(name, in_port, found, time.time()))

    @set_ev_cls(EventLinkLoadUpdated)
    def link_load_updated(self, ev: EventLinkLoadUpdated) -> None:
        react = getattr(self.policy, "on_link_load", None)
        if react is not None:
            self._routes_changed(react(ev.load, time.time()))

    def _routes_changed(self, routes: Sequence[FlowRoute]) -> None:
        """The policy placed, moved or forgot connections: re-render, push the difference,
        tell the telemetry app (it writes them to the telemetry file)."""
        if not routes:
            return
        self.plan = self.policy.render(self.description, self.failed)
        for session in self._ready():
            self._push(session)
        self.send_event_to_observers(EventFlowRouted(routes))


def _is_down(ofp: Any, desc: Any) -> bool:
    return bool(desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN)


def _groups_used(entry: FlowEntry) -> tuple[int, ...]:
    return entry.group_ids


def _is_base(stat: Any) -> bool:
    """One of the entries every switch gets (table-miss, ARP), installed by us."""
    return bool(
        stat.cookie == COOKIE
        and stat.table_id == 0
        and stat.priority in (MISS_PRIORITY, ARP_PRIORITY)
    )
