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
for the switch's flow table -> the port description reply (os-ken's ofp_handler asks for
it) tells which ports are down, the flow stats reply what the switch already has -> delete
what is not ours, send the difference between the plan and what is there (after a
controller restart: nothing, so the data plane is not disturbed), then a barrier; its reply
marks the switch programmed. A port status message that changes the set of failed links
makes the policy render a new plan; every programmed switch gets the difference (delete /
add / modify-strict), then a barrier.

A link counts as failed while a switch at either end reports its port down (link down,
administratively down, or deleted). A switch that disconnects is not a failure by itself:
its neighbours' ports tell.

Handlers run on the app's one event thread (os-ken's native hub), so the state below needs no
lock; only the status file is also written from the main thread (start, stop), under a lock.

Configuration: os-ken passes keyword arguments of ``AppManager.instantiate_apps`` to every
app's constructor. ``controllers.__main__`` builds a :class:`ControllerSettings` (one typed
object, STYLE.md item 11) and passes it as ``astral_settings``; os-ken's global ``CONF``
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
from dataclasses import dataclass, field
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
from os_ken.lib.packet import arp, ether_types, ethernet, packet
from os_ken.ofproto import ofproto_v1_3

from controllers.policies import Policy
from controllers.routing import (
    ARP_PRIORITY,
    MISS_PRIORITY,
    ROUTE_PRIORITY,
    Action,
    FlowEntry,
    ForwardingPlan,
    Output,
    PortMap,
    SetField,
    failed_links_at,
    programmable_switches,
)
from controllers.status import ControllerStatus, SwitchStatus, write_status
from topologies.addressing import GATEWAY_IP, GATEWAY_MAC
from topologies.description import FabricDescription
from topologies.model import Link

LOG = logging.getLogger(__name__)

# Every entry this controller installs carries this cookie (a5 = "astral").
COOKIE = 0xA5A5_0000_0000_0001
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


def diff_flows(
    installed: dict[tuple[int, str], FlowEntry], desired: dict[tuple[int, str], FlowEntry]
) -> tuple[list[FlowEntry], list[FlowEntry], list[FlowEntry]]:
    """(to delete, to add, to modify) to turn ``installed`` into ``desired`` (keyed by match)."""
    delete = [installed[k] for k in sorted(installed.keys() - desired.keys())]
    add = [desired[k] for k in sorted(desired.keys() - installed.keys())]
    modify = [
        desired[k] for k in sorted(desired.keys() & installed.keys()) if desired[k] != installed[k]
    ]
    return delete, add, modify


class FabricController(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(
        self, *args: Any, astral_settings: ControllerSettings | None = None, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        if astral_settings is None:
            raise RuntimeError(
                "FabricController needs astral_settings; start it with python -m controllers"
            )
        self.settings = astral_settings
        self.description = astral_settings.description
        self.fabric = self.description.fabric
        self.policy = astral_settings.policy
        self.ports = PortMap.of(self.description)
        self.switch_names = {s.dpid: s.name for s in programmable_switches(self.fabric)}
        self.datapaths: dict[int, Any] = {}
        self.ready: set[int] = set()  # port states known, plan pushed at least once
        self.down: dict[str, set[int]] = {}  # switch -> model ports that are down
        self._connecting: dict[int, _Connecting] = {}  # switches not programmed yet
        self.installed: dict[int, dict[tuple[int, str], FlowEntry]] = {}
        self.generation: dict[int, int] = {}  # bumped on every push to a switch
        self.barriers: dict[int, tuple[int, int]] = {}  # dpid -> (xid, generation)
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
        self.write_status()

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

    def _switch_status(self, dpid: int) -> SwitchStatus:
        if dpid not in self.status.switches:
            self.status.switches[dpid] = SwitchStatus(dpid, self.switch_names.get(dpid))
        return self.status.switches[dpid]

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
        self.datapaths[dpid] = dp
        self.ready.discard(dpid)
        self.barriers.pop(dpid, None)
        self.installed[dpid] = {}
        st = self._switch_status(dpid)
        st.connected, st.programmed, st.connected_at = True, False, time.time()
        st.programmed_at, st.rules = None, 0
        ofp, parser = dp.ofproto, dp.ofproto_parser
        if name is None:
            LOG.warning("switch with unknown dpid %d connected; it only gets a drop rule", dpid)
            self._send_wipe(dp)
            self._send_base(dp, arp_to_controller=False)
            st.flows = 1
            self.write_status()
            return
        LOG.info("switch %s (dpid %d) connected from %s", name, dpid, dp.address)
        # Base entries first: adding an identical entry replaces it without a gap.
        self._send_base(dp, arp_to_controller=True)
        st.flows = BASE_FLOWS
        # Before programming: which ports are down (os-ken's ofp_handler asks for the port
        # descriptions) and what the switch already has (kept across a controller restart:
        # only the difference is sent, so a restart does not disturb the data plane).
        self._connecting[dpid] = _Connecting()
        dp.send_msg(
            parser.OFPFlowStatsRequest(
                dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch()
            )
        )
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
        dp.send_msg(
            parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, type_=0, group_id=ofp.OFPG_ALL)
        )

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
        dpid = self._dpid_of(dp)
        connecting = self._connecting.get(dpid) if dpid is not None else None
        if dpid is None or connecting is None or connecting.ports_done:
            return
        ofp = dp.ofproto
        for port in ev.msg.body:
            if port.port_no <= ofp.OFPP_MAX and _is_down(ofp, port):
                connecting.down.add(port.port_no)
        if not ev.msg.flags & ofp.OFPMPF_REPLY_MORE:
            connecting.ports_done = True
            self._connected(dpid)

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def flow_stats_reply(self, ev: Any) -> None:
        dp = ev.msg.datapath
        dpid = self._dpid_of(dp)
        connecting = self._connecting.get(dpid) if dpid is not None else None
        if dpid is None or connecting is None or connecting.flows_done:
            return
        connecting.flows.extend(ev.msg.body)
        if not ev.msg.flags & dp.ofproto.OFPMPF_REPLY_MORE:
            connecting.flows_done = True
            self._connected(dpid)

    def _connected(self, dpid: int) -> None:
        """Port states and flow table known: remove what is not ours, then program."""
        connecting = self._connecting[dpid]
        if not (connecting.ports_done and connecting.flows_done):
            return
        del self._connecting[dpid]
        dp = self.datapaths[dpid]
        name = self.switch_names[dpid]
        ofp, parser = dp.ofproto, dp.ofproto_parser
        installed: dict[tuple[int, str], FlowEntry] = {}
        stale = []
        for stat in connecting.flows:
            entry = entry_from_flow_stats(stat, dpid, name, self.ports)
            if entry is not None and entry.key not in installed:
                installed[entry.key] = entry
            elif not _is_base(stat):
                stale.append(stat)
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
        # No policy uses groups yet: any group is stale (the flows using one are gone).
        dp.send_msg(
            parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, type_=0, group_id=ofp.OFPG_ALL)
        )
        self.installed[dpid] = installed
        self.down[name] = {self.ports.model_port(name, p) for p in connecting.down}
        LOG.info(
            "%s: %d route entries found, %d stale entries removed, ports down: %s",
            name,
            len(installed),
            len(stale),
            sorted(self.down[name]) or "none",
        )
        self._update_failures()  # pushes to the switches already programmed, if changed
        self.ready.add(dpid)
        self._push(dpid)
        self.write_status()

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def switch_gone(self, ev: Any) -> None:
        dp = ev.datapath
        dpid = self._dpid_of(dp)
        if dpid is None:
            return
        LOG.info("switch %s (dpid %d) disconnected", self.switch_names.get(dpid, "?"), dpid)
        del self.datapaths[dpid]
        self._connecting.pop(dpid, None)
        self.ready.discard(dpid)
        self.barriers.pop(dpid, None)
        self.installed.pop(dpid, None)
        st = self._switch_status(dpid)
        st.connected = st.programmed = False
        self.write_status()

    def _dpid_of(self, dp: Any) -> int | None:
        """The dpid of ``dp`` if it is the current connection for it (else stale: ignore)."""
        for dpid, known in self.datapaths.items():
            if known is dp:
                return dpid
        return None

    # --- failures ------------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPPortStatus, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def port_status(self, ev: Any) -> None:
        msg = ev.msg
        dp = msg.datapath
        dpid = self._dpid_of(dp)
        name = self.switch_names.get(dpid) if dpid is not None else None
        if dpid is None or name is None:
            return
        ofp = dp.ofproto
        if msg.desc.port_no > ofp.OFPP_MAX:
            return
        port = self.ports.model_port(name, msg.desc.port_no)
        down = msg.reason == ofp.OFPPR_DELETE or _is_down(ofp, msg.desc)
        connecting = self._connecting.get(dpid)
        if connecting is not None:  # not programmed yet: remember for then
            (connecting.down.add if down else connecting.down.discard)(msg.desc.port_no)
            return
        ports = self.down.setdefault(name, set())
        if down == (port in ports):
            return
        (ports.add if down else ports.discard)(port)
        LOG.info("%s port %d %s", name, port, "down" if down else "up")
        if self._update_failures():
            self.write_status()

    def _update_failures(self) -> bool:
        """Re-render if the failed links changed; push to every ready switch. True if so."""
        down = [(switch, port) for switch, ports in self.down.items() for port in ports]
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
        )
        for dpid in sorted(self.ready):
            self._push(dpid)
        return True

    # --- programming ---------------------------------------------------------------------

    def _push(self, dpid: int) -> None:
        """Bring ``dpid`` to the current plan, then ask for a barrier."""
        dp = self.datapaths[dpid]
        name = self.switch_names[dpid]
        table = self.plan.tables.get(dpid)
        desired = {e.key: e for e in table.flows} if table else {}
        installed = self.installed.setdefault(dpid, {})
        delete, add, modify = diff_flows(installed, desired)
        st = self._switch_status(dpid)
        if not (delete or add or modify) and (st.programmed or dpid in self.barriers):
            return
        ofp = dp.ofproto
        for entry in delete:
            dp.send_msg(self._flow_mod(dp, entry, ofp.OFPFC_DELETE_STRICT))
        for entry in add:
            dp.send_msg(self._flow_mod(dp, entry, ofp.OFPFC_ADD))
        for entry in modify:
            # Modify keeps the entry's counters (later policies read them).
            dp.send_msg(self._flow_mod(dp, entry, ofp.OFPFC_MODIFY_STRICT))
        self.installed[dpid] = desired
        generation = self.generation.get(dpid, 0) + 1
        self.generation[dpid] = generation
        barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
        dp.send_msg(barrier)
        self.barriers[dpid] = (barrier.xid, generation)
        st.programmed = False
        st.rules = len(desired)
        st.flows = len(desired) + BASE_FLOWS
        LOG.debug(
            "%s: -%d +%d ~%d entries (generation %d)",
            name,
            len(delete),
            len(add),
            len(modify),
            generation,
        )

    def _flow_mod(self, dp: Any, entry: FlowEntry, command: int) -> Any:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        match = parser.OFPMatch(eth_type=ether_types.ETH_TYPE_IP, ipv4_dst=entry.ipv4_dst)
        if command == ofp.OFPFC_DELETE_STRICT:
            return parser.OFPFlowMod(
                dp,
                cookie=COOKIE,
                cookie_mask=0xFFFF_FFFF_FFFF_FFFF,
                command=command,
                priority=entry.priority,
                out_port=ofp.OFPP_ANY,
                out_group=ofp.OFPG_ANY,
                match=match,
            )
        actions: list[Any] = []
        for action in entry.actions:
            if isinstance(action, SetField):
                actions.append(parser.OFPActionSetField(**{action.field: action.value}))
            elif isinstance(action, Output):
                actions.append(parser.OFPActionOutput(self.ports.ofport(entry.switch, action.port)))
            else:  # pragma: no cover - a new action type without support here
                raise TypeError(f"cannot install action {action!r}")
        return parser.OFPFlowMod(
            dp,
            cookie=COOKIE,
            command=command,
            priority=entry.priority,
            match=match,
            instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)],
        )

    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def barrier_reply(self, ev: Any) -> None:
        dp = ev.msg.datapath
        dpid = self._dpid_of(dp)
        if dpid is None or dpid not in self.barriers:
            return
        xid, generation = self.barriers[dpid]
        if ev.msg.xid != xid or generation != self.generation.get(dpid):
            return
        del self.barriers[dpid]
        st = self._switch_status(dpid)
        st.programmed, st.programmed_at = True, time.time()
        LOG.info(
            "%s programmed: %d rules (%.0f ms after connecting)",
            self.switch_names[dpid],
            st.rules,
            (st.programmed_at - (st.connected_at or st.programmed_at)) * 1e3,
        )
        if self.status.programmed():
            LOG.info("all %d switches programmed", len(self.status.expected_dpids))
        self.write_status()

    @set_ev_cls(
        ofp_event.EventOFPErrorMsg, [HANDSHAKE_DISPATCHER, CONFIG_DISPATCHER, MAIN_DISPATCHER]
    )
    def error_msg(self, ev: Any) -> None:
        msg = ev.msg
        dpid = self._dpid_of(msg.datapath)
        LOG.warning(
            "OpenFlow error from dpid %s: type %d code %d (%s)",
            dpid,
            msg.type,
            msg.code,
            bytes(msg.data[:64]).hex(),
        )
        if dpid is not None:
            self._switch_status(dpid).errors += 1
            self.write_status()

    # --- packets -------------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in(self, ev: Any) -> None:
        msg = ev.msg
        dp = msg.datapath
        reply = gateway_arp_reply(bytes(msg.data))
        if reply is None:
            return  # dropped: the controller never floods
        ofp, parser = dp.ofproto, dp.ofproto_parser
        in_port = msg.match["in_port"]
        dp.send_msg(
            parser.OFPPacketOut(
                dp,
                buffer_id=ofp.OFP_NO_BUFFER,
                in_port=ofp.OFPP_CONTROLLER,
                actions=[parser.OFPActionOutput(in_port)],
                data=reply,
            )
        )
        LOG.debug("answered ARP for the gateway on dpid %s port %d", self._dpid_of(dp), in_port)


def _is_down(ofp: Any, desc: Any) -> bool:
    return bool(desc.state & ofp.OFPPS_LINK_DOWN or desc.config & ofp.OFPPC_PORT_DOWN)


@dataclass
class _Connecting:
    """What the controller learns about a switch between connecting and programming it."""

    down: set[int] = field(default_factory=set)  # OpenFlow port numbers
    flows: list[Any] = field(default_factory=list)  # OFPFlowStats
    ports_done: bool = False
    flows_done: bool = False


def _is_base(stat: Any) -> bool:
    """One of the entries every switch gets (table-miss, ARP), installed by us."""
    return bool(
        stat.cookie == COOKIE
        and stat.table_id == 0
        and stat.priority in (MISS_PRIORITY, ARP_PRIORITY)
    )


def entry_from_flow_stats(stat: Any, dpid: int, switch: str, ports: PortMap) -> FlowEntry | None:
    """The route entry an OFPFlowStats describes, if it is exactly one we would install."""
    match = dict(stat.match.items())
    if (
        stat.cookie != COOKIE
        or stat.table_id != 0
        or stat.priority != ROUTE_PRIORITY
        or set(match) != {"eth_type", "ipv4_dst"}
        or match["eth_type"] != ether_types.ETH_TYPE_IP
        or not isinstance(match["ipv4_dst"], str)  # a (value, mask) pair is not ours
        or len(stat.instructions) != 1
        or not hasattr(stat.instructions[0], "actions")
    ):
        return None
    actions: list[Action] = []
    for action in stat.instructions[0].actions:
        if getattr(action, "key", None) in ("eth_src", "eth_dst"):
            actions.append(SetField(action.key, str(action.value)))
        elif hasattr(action, "port") and hasattr(action, "max_len"):
            actions.append(Output(ports.model_port(switch, action.port)))
        else:
            return None
    return FlowEntry(dpid, switch, match["ipv4_dst"], tuple(actions), stat.priority)
