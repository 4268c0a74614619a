"""Pieces of the controller that need no switch: status file, flow diff, gateway ARP."""

from __future__ import annotations

from pathlib import Path

from os_ken.lib.packet import arp, ether_types, ethernet, packet

from controllers.app import diff_flows, gateway_arp_reply
from controllers.routing import FlowEntry, Output
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
