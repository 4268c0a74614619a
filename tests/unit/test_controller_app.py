"""Pieces of the controller that need no switch: status, flow diff, flow stats, gateway ARP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from os_ken.lib.packet import arp, ether_types, ethernet, packet
from os_ken.ofproto import ofproto_v1_3
from os_ken.ofproto import ofproto_v1_3_parser as parser

from controllers.app import (
    COOKIE,
    diff_flows,
    diff_groups,
    entry_from_flow_stats,
    gateway_arp_reply,
)
from controllers.plan import Bucket, FlowEntry, GroupEntry, GroupType, Output, SetField
from controllers.ports import PortMap
from controllers.status import ControllerStatus, SwitchStatus, read_status, write_status
from topologies.addressing import GATEWAY_IP, GATEWAY_MAC

HOST_MAC = "02:a5:00:00:00:01"


def test_status_round_trips_and_reports_missing_switches(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    assert read_status(path) is None
    status = ControllerStatus(
        pid=1,
        fabric="f",
        policy="shortest",
        listen_host="127.0.0.1",
        listen_port=6653,
        started_at=1.0,
        updated_at=2.0,
        expected_dpids=[1, 2, 3],
        failed_links=[("a", 1, "b", 2)],
        switches={
            1: SwitchStatus(1, "a", connected=True, programmed=True, rules=4, flows=6),
            2: SwitchStatus(2, "b", connected=True, programmed=False),
        },
    )
    write_status(path, status)
    again = read_status(path)
    assert again == status
    assert again.missing() == [2, 3]
    assert again.programmed([1])
    assert not again.programmed()
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"], "no temporary left behind"


def entry(ip: str, port: int) -> FlowEntry:
    return FlowEntry(1, "s", ip, (Output(port),))


def test_diff_flows_deletes_adds_and_modifies_by_match() -> None:
    installed = {e.key: e for e in [entry("10.0.0.1", 1), entry("10.0.0.2", 2)]}
    desired = {e.key: e for e in [entry("10.0.0.2", 3), entry("10.0.0.3", 1)]}
    delete, add, modify = diff_flows(installed, desired)
    assert delete == [entry("10.0.0.1", 1)]
    assert add == [entry("10.0.0.3", 1)]
    assert modify == [entry("10.0.0.2", 3)]
    assert diff_flows(desired, desired) == ([], [], [])


def group(gid: int, *ports: int) -> GroupEntry:
    buckets = tuple(Bucket((Output(p),), watch_port=p) for p in ports)
    return GroupEntry(1, "s", gid, GroupType.FAST_FAILOVER, buckets)


def test_diff_groups_by_id() -> None:
    installed = {g.group_id: g for g in [group(1, 1, 2), group(2, 3, 4)]}
    desired = {g.group_id: g for g in [group(2, 4, 3), group(3, 1, 2)]}
    assert diff_groups(installed, desired) == ([group(1, 1, 2)], [group(3, 1, 2)], [group(2, 4, 3)])
    assert diff_groups(desired, desired) == ([], [], [])


def arp_request(target: str) -> bytes:
    pkt = packet.Packet()
    pkt.add_protocol(
        ethernet.ethernet(dst="ff:ff:ff:ff:ff:ff", src=HOST_MAC, ethertype=ether_types.ETH_TYPE_ARP)
    )
    pkt.add_protocol(
        arp.arp(
            opcode=arp.ARP_REQUEST,
            src_mac=HOST_MAC,
            src_ip="10.0.0.1",
            dst_mac="00:00:00:00:00:00",
            dst_ip=target,
        )
    )
    pkt.serialize()
    return bytes(pkt.data)


def test_gateway_answers_arp_for_itself_only() -> None:
    reply = gateway_arp_reply(arp_request(GATEWAY_IP))
    assert reply is not None
    pkt = packet.Packet(reply)
    eth = pkt.get_protocol(ethernet.ethernet)
    ans = pkt.get_protocol(arp.arp)
    assert (eth.src, eth.dst) == (GATEWAY_MAC, HOST_MAC)
    assert ans.opcode == arp.ARP_REPLY
    assert (ans.src_mac, ans.src_ip, ans.dst_mac, ans.dst_ip) == (
        GATEWAY_MAC,
        GATEWAY_IP,
        HOST_MAC,
        "10.0.0.1",
    )
    assert gateway_arp_reply(arp_request("10.0.0.2")) is None


def wire(obj: Any) -> Any:
    """``obj`` serialized and parsed back, as a switch's reply would carry it."""
    buf = bytearray()
    obj.serialize(buf, 0)
    return type(obj).parser(bytes(buf), 0)


def flow_stats(entry: FlowEntry, *, cookie: int = COOKIE, priority: int | None = None) -> Any:
    actions: list[Any] = []
    for action in entry.actions:
        if isinstance(action, SetField):
            actions.append(wire(parser.OFPActionSetField(**{action.field: action.value})))
        else:
            assert isinstance(action, Output)
            actions.append(wire(parser.OFPActionOutput(action.port + 10)))
    return parser.OFPFlowStats(
        table_id=0,
        priority=entry.priority if priority is None else priority,
        cookie=cookie,
        match=wire(parser.OFPMatch(eth_type=0x0800, ipv4_dst=entry.ipv4_dst)),
        instructions=[parser.OFPInstructionActions(ofproto_v1_3.OFPIT_APPLY_ACTIONS, actions)],
    )


def test_flow_stats_are_read_back_into_entries_through_the_port_map() -> None:
    ports = PortMap({"s": {str(p): p + 10 for p in range(1, 5)}})
    last_hop = FlowEntry(
        1,
        "s",
        "10.0.0.1",
        (SetField("eth_src", GATEWAY_MAC), SetField("eth_dst", HOST_MAC), Output(2)),
    )
    for entry in (last_hop, entry_at("10.0.0.2", 3)):
        assert entry_from_flow_stats(flow_stats(entry), 1, "s", ports) == entry
    assert entry_from_flow_stats(flow_stats(last_hop, cookie=7), 1, "s", ports) is None
    assert entry_from_flow_stats(flow_stats(last_hop, priority=5), 1, "s", ports) is None


def entry_at(ip: str, port: int) -> FlowEntry:
    return FlowEntry(1, "s", ip, (Output(port),))
