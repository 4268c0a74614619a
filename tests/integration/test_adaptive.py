"""The adaptive policy on a running fabric: every GPU pair connects over TCP, and two long
flows that start on the same ToR uplink end up on different uplinks at near full rate.

The move is asserted from the switch's own port counters (``ovs-ofctl dump-ports``, read by
this test, not by the controller) and from what iperf3 measured; the controller's telemetry
file only has to agree that it moved the flow.

Needs root and Open vSwitch (tests/conftest.py); waits for the astral run lock.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controllers.policies.adaptive import AdaptivePolicy, placement_index
from orchestrator.emulation.network import Emulation
from orchestrator.testbed.telemetry import read_telemetry
from tests.helpers import dump_ports
from tests.integration.test_telemetry import start_emulation
from topologies.addressing import FABRIC_PREFIX, GATEWAY_IP
from topologies.fivetuple import FiveTuple
from topologies.model import LinkKind

pytestmark = pytest.mark.integration

TCP_PAIRS = Path(__file__).with_name("tcp_pairs.py")
PAIRS_PORT = 5400
SECONDS = 14
RATE = 20e6  # astral-small's emulated link rate
SPLIT = 0.6  # of RATE: one flow per uplink, not two sharing one (the test says why)
_TX_BYTES = re.compile(r"port\s+(\d+):.*?tx pkts=\d+, bytes=(\d+)", re.S)


@pytest.fixture(scope="module")
def emulation() -> Iterator[Emulation]:
    emu = start_emulation(policy="adaptive", telemetry_interval=0.5)
    try:
        yield emu
    finally:
        emu.stop()


def test_adaptive_connects_every_pair_over_tcp(emulation: Emulation) -> None:
    desc = emulation.description
    assert desc is not None
    gpus = [g.name for g in desc.fabric.gpus_by_rank()]
    python = sys.executable
    servers = [
        emulation.popen(g, [python, str(TCP_PAIRS), "serve", str(PAIRS_PORT)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for g in gpus
    ]  # fmt: skip
    try:
        time.sleep(1.0)
        clients = {}
        for g in gpus:
            targets = [desc.addresses[d].fabric_ip for d in gpus if d != g]
            clients[g] = emulation.popen(
                g,
                [python, str(TCP_PAIRS), "connect", str(PAIRS_PORT), "200000", *targets],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        failed = {}
        for g, client in clients.items():
            out, err = client.communicate(timeout=60)
            assert client.returncode == 0, err.decode()
            if json.loads(out):
                failed[g] = json.loads(out)
        assert failed == {}
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)
    # The connections across the fabric were placed by the policy (route records).
    assert emulation.controller is not None
    time.sleep(1.0)
    tel = read_telemetry(emulation.controller.telemetry_path)
    placed = {(r.flow.src_ip, r.flow.dst_ip) for r in tel.routes if r.event == "placed"}
    pod = {desc.addresses[g].fabric_ip: desc.fabric.gpus[g].pod for g in gpus}
    cross = {(a, b) for a in pod for b in pod if pod[a] != pod[b]}
    assert cross <= placed, sorted(cross - placed)[:5]


def leave_by(emulation: Emulation, gpu: str, port: int, sport: int) -> None:
    """Make ``gpu``'s TCP connections from ``sport`` leave by NIC ``port`` (a policy-routing
    rule in its namespace). Binding the socket to the device (iperf3 --bind-dev) would not
    do: the reply may come in on the other NIC port, and a bound socket ignores it."""
    desc = emulation.description
    assert desc is not None
    addr = desc.addresses[gpu]
    (nic,) = [n for n in addr.nics if n.port == port]
    table = str(100 + port)
    dev = nic.intf
    for argv in (
        ["ip", "route", "replace", FABRIC_PREFIX, "via", GATEWAY_IP, "dev", dev, "onlink",
         "src", addr.fabric_ip, "table", table],
        ["ip", "rule", "add", "ipproto", "tcp", "sport", str(sport), "lookup", table],
    ):  # fmt: skip
        process = emulation.popen(gpu, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output = process.communicate(timeout=10)[0].decode()
        assert process.returncode == 0, f"{gpu}: {' '.join(argv)}: {output}"
    assert nic.port == port


def tx_bytes(bridge: str) -> dict[int, int]:
    return {int(port): int(nbytes) for port, nbytes in _TX_BYTES.findall(dump_ports(bridge))}


def test_two_flows_on_one_uplink_are_split_by_the_counters(emulation: Emulation) -> None:
    desc, controller = emulation.description, emulation.controller
    assert desc is not None and controller is not None
    sources, destinations = ["p0s0g0", "p0s1g0"], ["p1s0g0", "p1s1g0"]
    # Both senders use their NIC port 1, which goes to the same ToR.
    nics = [next(n for n in desc.addresses[s].nics if n.port == 1) for s in sources]
    tor = nics[0].peer
    assert nics[1].peer == tor
    uplinks = sorted(
        x.port_of(tor)
        for x in desc.fabric.links
        if x.kind is LinkKind.TOR_AGG and tor in (x.a, x.b)
    )
    assert len(uplinks) == 2
    # Client ports whose placement (the policy's hash of the five-tuple) is the same uplink.
    policy = AdaptivePolicy()
    policy.render(desc, frozenset())
    dst_ips = [desc.addresses[d].fabric_ip for d in destinations]
    src_ips = [desc.addresses[s].fabric_ip for s in sources]

    def uplink(i: int, cport: int, sport: int) -> int:
        paths = policy.paths(tor, destinations[i])
        flow = FiveTuple(src_ips[i], cport, dst_ips[i], sport, "tcp")
        return paths[placement_index(flow, len(paths))].hops[0][1]

    ports = [5301, 5302]
    first = 41000
    shared = uplink(0, first, ports[0])
    second = next(c for c in range(41001, 42000) if uplink(1, c, ports[1]) == shared)
    cports = [first, second]
    for gpu, cport in zip(sources, cports, strict=True):
        leave_by(emulation, gpu, 1, cport)

    servers = [
        emulation.popen(d, ["iperf3", "-s", "-1", "-p", str(p)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for d, p in zip(destinations, ports, strict=True)
    ]  # fmt: skip
    time.sleep(0.5)
    samples: list[tuple[float, dict[int, int]]] = []
    stop = threading.Event()

    def sample() -> None:
        while True:
            samples.append((time.monotonic(), tx_bytes(tor)))
            if stop.wait(0.5):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    began, began_wall = time.monotonic(), time.time()
    sampler.start()
    clients = [
        emulation.popen(
            s,
            ["iperf3", "-c", ip, "-p", str(p), "--cport", str(c), "-t", str(SECONDS), "-J"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for s, ip, p, c in zip(sources, dst_ips, ports, cports, strict=True)
    ]  # fmt: skip
    try:
        results = [json.loads(c.communicate(timeout=SECONDS + 30)[0]) for c in clients]
    finally:
        stop.set()
        sampler.join()
    for server in servers:
        server.wait(timeout=10)

    def rates(start: float, end: float) -> dict[int, float]:
        window = [(t, b) for t, b in samples if began + start <= t <= began + end]
        (t0, b0), (t1, b1) = window[0], window[-1]
        return {p: 8 * (b1[p] - b0[p]) / (t1 - t0) for p in uplinks}

    other = next(p for p in uplinks if p != shared)
    early, late = rates(0.3, 1.3), rates(SECONDS - 6, SECONDS - 0.5)
    # At first both flows leave the ToR by the same uplink (the other one idles) ...
    assert early[shared] > 0.7 * RATE and early[other] < 0.2 * RATE, early
    # ... in the end each has its own. What tells a split from none is each uplink's
    # share: split, each carries one flow (measured 18.5 and 17.2 Mbit/s of 20 with other
    # experiments on the 2 cores, 14.8 and 15.5 on a slower machine, 2026-12-04); not
    # split, the other uplink idles and each flow gets under half (0.48 of the rate). The
    # line between them, 0.6, asserts the split and not the machine's speed (benchmarks/).
    assert late[shared] > SPLIT * RATE and late[other] > SPLIT * RATE, late
    # iperf3 agrees: both flows at near full rate over their last 6 seconds.
    for result in results:
        tail = result["intervals"][-6:]
        mean = sum(i["sum"]["bits_per_second"] for i in tail) / len(tail)
        assert mean > SPLIT * RATE, mean
    # The controller says it moved one of them, once.
    time.sleep(1.0)
    tel = read_telemetry(controller.telemetry_path)
    mine = {(src_ips[i], cports[i]) for i in range(2)}
    moves = [
        r for r in tel.routes if r.event == "moved" and (r.flow.src_ip, r.flow.src_port) in mine
    ]
    assert len(moves) == 1, moves
    print(
        f"\nadaptive: moved {moves[0].t - began_wall:.1f} s after the start ({moves[0].detail});"
        f" uplink Mbit/s early {[round(early[p] / 1e6, 1) for p in uplinks]},"
        f" late {[round(late[p] / 1e6, 1) for p in uplinks]}"
    )
