"""Telemetry on a running fabric: records arrive at the configured interval and the port
counters on a flow's path grow by the bytes iperf3 sent (docs/telemetry.md); the egress
queues and the switch process's sockets account for every packet a switch received and
did not send.

Needs root and Open vSwitch (tests/conftest.py). Waits for the astral run lock like the
emulation tests.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controllers.counters import StatsRound
from controllers.routing import link_ends, shortest_path_plan
from controllers.tracer import follow
from orchestrator.diagnosis.forwarding import forwarded_series
from orchestrator.emulation.faults import FabricFaults
from orchestrator.emulation.network import Emulation
from orchestrator.results.store import QueueCounter
from orchestrator.testbed.queues import QueueSampler
from orchestrator.testbed.telemetry import (
    link_rates,
    mean_utilization,
    read_telemetry,
    summarize_periods,
)
from tests.helpers import dump_ports, nft_dropped
from topologies.addressing import GATEWAY_MAC
from topologies.model import LinkKind

pytestmark = pytest.mark.integration

INTERVAL = 0.25
LOCK_WAIT = 1200.0  # other runs (tests, benchmarks) share the machine
SECONDS = 4


def start_emulation(policy: str = "shortest", telemetry_interval: float | None = None) -> Emulation:
    """Start astral-small, waiting for the run lock if another run holds it."""
    emulation = Emulation(
        "astral-small",
        policy=policy,
        ready_timeout=120,
        telemetry_interval=telemetry_interval,
        lock_wait=LOCK_WAIT,
    )
    return emulation.start()


@pytest.fixture(scope="module")
def emulation() -> Iterator[Emulation]:
    emu = start_emulation(telemetry_interval=INTERVAL)
    try:
        yield emu
    finally:
        emu.stop()


def tx_bytes(stats: StatsRound, switch: str, port: int, rx: bool = False) -> int:
    (sample,) = [p for p in stats.switches[switch].ports if p.port == port]
    return sample.rx_bytes if rx else sample.tx_bytes


def test_records_at_the_interval_with_the_bytes_iperf3_sent_on_its_path(
    emulation: Emulation,
) -> None:
    desc = emulation.description
    controller = emulation.controller
    assert desc is not None and controller is not None
    src, dst = "p0s0g0", "p1s0g0"
    address = desc.addresses[dst].fabric_ip
    server = emulation.popen(dst, ["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    began = time.time()
    out = emulation.cmd(src, ["iperf3", "-c", address, "-t", str(SECONDS), "-J"])
    ended = time.time()
    server.wait(timeout=10)
    result = json.loads(out)["end"]
    # Written by the sender / delivered to the receiver (the sender's last writes may still
    # have been queued when iperf3 stopped).
    sent, delivered = result["sum_sent"]["bytes"], result["sum_received"]["bytes"]
    time.sleep(3 * INTERVAL)  # the rounds after the last byte
    tel = read_telemetry(controller.telemetry_path)

    # Records at the configured interval (another helper's load shares these 2 cores).
    window = [r for r in tel.rounds if began - 1 <= r.t <= ended + 2 * INTERVAL]
    assert len(window) >= 0.8 * (ended - began + 1) / INTERVAL
    tel.rounds, tel.segments = window, [0]
    periods = summarize_periods(tel)
    assert 0.9 * INTERVAL <= periods.mean <= 1.15 * INTERVAL, periods
    assert periods.p95 <= 2 * INTERVAL, periods
    assert periods.incomplete <= 0.05 * len(window), periods

    # Every port on the path (shortest: one path per destination) counted iperf3's bytes
    # plus headers (at most 3.7%: 1460-byte segments in 1514-byte frames; less where the
    # userspace datapath counts TSO super-packets); the ToR's other uplink did not.
    before = max((r for r in window if r.t < began and not r.missing), key=lambda r: r.t)
    after = max((r for r in window if not r.missing), key=lambda r: r.t)
    # The kernel picked one of the two NIC ports (multipath hash): the ToR port that
    # received the bytes is the one.
    received = {
        n.port: tx_bytes(after, n.peer, n.peer_port, rx=True)
        - tx_bytes(before, n.peer, n.peer_port, rx=True)
        for n in desc.addresses[src].nics
    }
    (nic,) = [n for n in desc.addresses[src].nics if received[n.port] >= delivered]
    plan = shortest_path_plan(desc)
    ends = link_ends(desc.fabric)
    hops = follow(desc, plan, nic.peer, address)
    counted = {}
    for here, there in itertools.pairwise(hops):
        (port,) = [
            p for (node, p), link in ends.items() if node == here and link.other(here) == there
        ]
        counted[f"{here}:{port}"] = tx_bytes(after, here, port) - tx_bytes(before, here, port)
    counted["ingress"] = tx_bytes(after, nic.peer, nic.peer_port, rx=True) - tx_bytes(
        before, nic.peer, nic.peer_port, rx=True
    )
    for where, nbytes in counted.items():
        assert delivered <= nbytes <= 1.1 * sent, (where, nbytes, delivered, sent)
    uplinks = [
        p for (node, p), link in ends.items() if node == nic.peer and link.kind is LinkKind.TOR_AGG
    ]
    idle = [p for p in uplinks if f"{nic.peer}:{p}" not in counted]
    assert len(idle) == len(uplinks) - 1
    for port in idle:
        assert tx_bytes(after, nic.peer, port) - tx_bytes(before, nic.peer, port) < 0.02 * sent

    # The reader's rates: the path's links ran near the emulated rate while iperf3 did.
    rates = link_rates(tel, desc)
    busy = [d for d in rates if f"{d.src}:{d.src_port}" in counted]
    assert len(busy) == len(hops) - 1
    for d in busy:
        util = mean_utilization(rates[d], began + 1, ended)
        assert 0.8 <= util <= 1.05, (str(d), util)


def test_the_gpus_nic_queues_are_sampled_in_their_namespaces(emulation: Emulation) -> None:
    """Every GPU's NIC ports' egress queues are read over netlink inside the GPU's
    namespace beside the switches' ports; the port iperf3 left by sent its packets through
    its queue (about a packet per 1448 payload bytes delivered), and what the sampler
    read last is what ``tc`` in that namespace reads (between tc's readings before and
    after)."""
    desc = emulation.description
    assert desc is not None
    src, dst = "p0s1g1", "p1s1g0"
    # samples are taken by hand below: one when the block starts, one after iperf3, one
    # between tc's readings; the sockets live only inside the block, and the thread's own
    # samples (every 60 s) must not land after tc's second reading
    sampler = QueueSampler.for_emulation(emulation, desc, interval=60.0)
    assert sampler.namespaces and set(sampler.nics) == set(desc.fabric.gpus)
    server = emulation.popen(dst, ["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)

    def tc_root(port: int) -> dict[str, int]:
        text = emulation.cmd(src, ["tc", "-s", "-j", "qdisc", "show", "dev", f"{src}-eth{port}"])
        (root,) = [q for q in json.loads(text) if q.get("root")]
        return root

    with sampler:
        out = emulation.cmd(src, ["iperf3", "-c", desc.addresses[dst].fabric_ip, "-t", "2", "-J"])
        server.wait(timeout=10)
        sampler.sample()
        assert sampler.nic_error is None and sampler.nic_failures == 0
        # what arrived crossed the GPU's queue before iperf3 ended, at most 1448 bytes a
        # packet (a 1500-byte MTU, TCP timestamps); what was sent may have been partly still
        # in the socket. 0.9 of that: 3,394 packets carried 4,861,800 bytes on a quiet machine
        delivered = json.loads(out)["end"]["sum_received"]["bytes"]
        rows: dict[tuple[str, int], list[QueueCounter]] = {}
        for q in sampler.snapshot():
            rows.setdefault((q.switch, q.port), []).append(q)
        nic_ports = {(g, n.port) for g in sampler.nics for n in desc.addresses[g].nics}
        assert nic_ports <= set(rows)
        moved = {port: r[-1].packets - r[0].packets for port, r in rows.items() if port[0] == src}
        assert max(moved.values()) >= 0.9 * delivered / 1448, moved
        # a late ACK or FIN may leave between any two readings: the sampler's must fall
        # between tc's, read while its socket is still open
        port = max(moved, key=lambda p: moved[p])[1]
        before = tc_root(port)
        sampler.sample()
        after = tc_root(port)
        last = [q for q in sampler.snapshot() if (q.switch, q.port) == (src, port)][-1]
    assert before["packets"] <= last.packets <= after["packets"]
    assert before["drops"] <= last.drops <= after["drops"]


# Sends one frame ``count`` times from an interface with a packet socket that bypasses
# the interface's queue (PACKET_QDISC_BYPASS): the GPU's shaper does not pace it, and the
# switch port at the other end receives it as fast as this loop sends.
BLAST = """
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
s.setsockopt(263, 20, 1)  # SOL_PACKET, PACKET_QDISC_BYPASS
frame, sent = bytes.fromhex(sys.argv[2]), 0
for _ in range(int(sys.argv[3])):
    try:
        sent += s.send(frame) > 0
    except OSError:
        pass
print(sent)
"""


def udp_frame(src_mac: str, dst_mac: str, src_ip: str, dst_ip: str, size: int = 1500) -> bytes:
    """An Ethernet frame of ``size`` bytes carrying one UDP datagram to the discard port."""
    ip_len = size - 14
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, ip_len, 0, 0, 64, 17, 0,
        socket.inet_aton(src_ip), socket.inet_aton(dst_ip),
    )  # fmt: skip
    words = sum(struct.unpack("!10H", header))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    header = header[:10] + struct.pack("!H", ~words & 0xFFFF) + header[12:]
    udp = struct.pack("!HHHH", 40000, 9, ip_len - 20, 0)
    macs = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", ""))
    return macs + b"\x08\x00" + header + udp + bytes(ip_len - 28)


def port_packets(switch: str) -> dict[int, tuple[int, int]]:
    """Each port of ``switch``'s bridge: (packets received, packets sent), as OVS counts."""
    found = re.findall(r"port\s+(\d+): rx pkts=(\d+).*?\n\s+tx pkts=(\d+)", dump_ports(switch))
    return {int(p): (int(rx), int(tx)) for p, rx, tx in found}


def test_what_a_switch_received_and_never_sent_is_its_queues_or_its_unread_sockets(
    emulation: Emulation, tmp_path: Path
) -> None:
    """A GPU sends faster than the switch process reads its ToR port (its packet socket's
    buffer overflows) and than the ToR's uplink carries (the egress queue discards): every
    packet the ToR's ports counted in and not out is one the queues discarded or one the
    switch process never read, as the sampler reads them (the balance the diagnosis keeps
    when it calls a switch's other drops a fault's, orchestrator.diagnosis.detectors)."""
    desc = emulation.description
    assert desc is not None
    src, dst = "p0s0g0", "p1s1g0"
    nic = desc.addresses[src].nics[0]
    tor = nic.peer
    frame = udp_frame(
        nic.mac, GATEWAY_MAC, desc.addresses[src].fabric_ip, desc.addresses[dst].fabric_ip
    )
    sampler = QueueSampler.for_emulation(emulation, desc, interval=60.0)
    with sampler:
        before = port_packets(tor)
        blast = tmp_path / "blast.py"
        blast.write_text(BLAST)
        sent = emulation.cmd(src, [sys.executable, str(blast), nic.intf, frame.hex(), "100000"])
        # the egress queue empties at the port's rate, then the counters stand still
        time.sleep(3.0)
        sampler.sample()
        after = port_packets(tor)
    assert int(sent.strip()) >= 90_000, sent
    received_not_sent = sum(
        (after[p][0] - before[p][0]) - (after[p][1] - before[p][1]) for p in before
    )
    ports = {(tor, p) for p in before}
    queued = dropped_over([q for q in sampler.snapshot() if (q.switch, q.port) in ports])
    unread = dropped_over([d for d in sampler.ingress_snapshot() if (d.switch, d.port) in ports])
    print(f"{tor}: {received_not_sent} received and not sent, {queued} queued, {unread} unread")
    assert unread > 0, "the switch process read every packet of the burst"
    assert queued > 0, "the uplink's queue discarded nothing of the burst"
    # a few packets of the fabric's own (the ICMP answers of the destination) may cross
    # the switch while the counters are read
    assert abs(received_not_sent - queued - unread) <= 10


def dropped_over(rows: list[Any]) -> int:
    """Drops per port from the first sample to the last, summed."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for r in sorted(rows, key=lambda r: r.t):
        first.setdefault(r.port, r.drops)
        last[r.port] = r.drops
    return sum(last[p] - first[p] for p in last)


def test_what_a_switch_forwarded_to_an_egress_and_did_not_send_is_what_it_lost(
    emulation: Emulation,
) -> None:
    """Each ToR uplink of a GPU's two ToRs loses 3 % of what it sends (the loss fault's
    egress hook) while iperf3 crosses one of them: per egress port, what the switch's
    entries and group buckets forwarded to it (the telemetry's outputs), less what the port
    sent and its queue discarded, is what the hook dropped there, and nothing elsewhere
    (the reading that places a lossy link's drops at its egress, orchestrator/diagnosis/
    forwarding.py)."""
    desc = emulation.description
    controller = emulation.controller
    assert desc is not None and controller is not None
    src, dst = "p0s0g0", "p1s0g0"
    tors = sorted({n.peer for n in desc.addresses[src].nics})
    uplinks = [
        (tor, link)
        for tor in tors
        for link in desc.fabric.links
        if tor in (link.a, link.b) and link.kind is LinkKind.TOR_AGG
    ]
    faults = FabricFaults(emulation, desc)
    tables = {
        (tor, link.port_of(tor)): f"astral_test_egress_{i}" for i, (tor, link) in enumerate(uplinks)
    }
    sampler = QueueSampler.for_emulation(emulation, desc, interval=60.0)
    server = emulation.popen(dst, ["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
    applied = []
    with sampler:
        try:
            for tor, link in uplinks:
                end = (tor, link.port_of(tor))
                faults.add_link_loss(tables[end], link, 0.03, ends=[end])
                applied.append((tor, link))
            time.sleep(2 * INTERVAL)
            began = time.time()
            emulation.cmd(src, ["iperf3", "-c", desc.addresses[dst].fabric_ip, "-t", "2", "-J"])
            server.wait(timeout=10)
            time.sleep(1.0 + 3 * INTERVAL)  # the queues empty; the rounds after
            sampler.sample()
            dropped = {end: nft_dropped(table) for end, table in tables.items()}
        finally:
            for tor, link in applied:
                end = (tor, link.port_of(tor))
                faults.remove_link_loss(tables[end], link, ends=[end])
    tel = read_telemetry(controller.telemetry_path)
    series = forwarded_series(Path(controller.telemetry_path))
    before = max((r for r in tel.rounds if r.t < began and not r.missing), key=lambda r: r.t)
    after = max((r for r in tel.rounds if not r.missing), key=lambda r: r.t)
    assert sum(dropped.values()) > 10, dropped  # iperf3 crossed a lossy uplink
    for tor in tors:
        old, new = before.switches[tor], after.switches[tor]
        sent = {p.port: p.tx_packets for p in new.ports}
        sent = {p.port: sent[p.port] - p.tx_packets for p in old.ports}
        for port in sent:
            rows = series[(tor, port)]
            forwarded = dict(rows)[new.t] - dict(rows)[old.t]
            queue = [q for q in sampler.snapshot() if (q.switch, q.port) == (tor, port)]
            lost = forwarded - sent[port] - dropped_over(queue)
            print(f"{tor}:{port} forwarded {forwarded}, sent {sent[port]}, lost {lost}, "
                  f"the hook dropped {dropped.get((tor, port), 0)}")  # fmt: skip
            # measured: 1-3 packets more than the hook's 24-34 (9 once), 0 where none dropped
            assert abs(lost - dropped.get((tor, port), 0)) <= 3 + 0.01 * forwarded, (tor, port)
