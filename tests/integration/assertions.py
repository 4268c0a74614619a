"""Domain assertions on a running emulation (after IPMininet's tests/utils.py).

- :func:`assert_path`: packets from one GPU to another cross exactly the expected switches.
  It reads the controller's per-destination flow counters (every fabric switch matches
  ``ipv4_dst`` = the destination's fabric address, controllers/routing.py), so only packets
  *towards* the destination count, not the replies on their own way back.
- :func:`assert_reachable`: every pair answers (an independent pass of the readiness probe).
- :func:`leftovers`: what exists now that did not before (bridges, interfaces, processes).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.emulation.network import Emulation
from orchestrator.emulation.readiness import probe_once, probe_plan
from orchestrator.emulation.state import RunState, proc_starttime
from orchestrator.testbed.pinning import route_devices
from topologies.fivetuple import FiveTuple
from topologies.model import Tier

Hop = str | frozenset[str]  # a switch, or "exactly one of these" (ECMP)

_N_PACKETS = re.compile(r"n_packets=(\d+)")


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def flow_packets_to(switch: str, address: str) -> int:
    """Packets ``switch``'s flows for destination ``address`` have matched so far."""
    out = _run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", switch, f"ip,nw_dst={address}"])
    total = 0
    for line in out.splitlines():
        if f"nw_dst={address}" in line and not re.search(rf"nw_dst={re.escape(address)}/", line):
            match = _N_PACKETS.search(line)
            if match:
                total += int(match.group(1))
    return total


def fabric_switches(emulation: Emulation) -> list[str]:
    assert emulation.description is not None
    return sorted(
        s.name for s in emulation.description.fabric.switches.values() if s.tier is not Tier.NVLINK
    )


def switches_on_path(
    emulation: Emulation, src: str, dst: str, dev: str | None = None, count: int = 20
) -> set[str]:
    """Switches that forwarded (nearly) all of ``count`` echo requests from src to dst."""
    assert emulation.description is not None
    address = emulation.description.addresses[dst].fabric_ip
    switches = fabric_switches(emulation)
    before = {s: flow_packets_to(s, address) for s in switches}
    argv = ["ping", "-q", "-c", str(count), "-i", "0.02", "-W", "2", address]
    if dev is not None:
        argv[1:1] = ["-I", dev]
    output = emulation.cmd(src, argv)
    assert f"{count} packets transmitted" in output, output
    # OpenFlow counters lag the datapath until a revalidator pass pulls its statistics.
    _run(["ovs-appctl", "revalidator/wait"])
    after = {s: flow_packets_to(s, address) for s in switches}
    # Replies are not counted (they go to src's address); stray retransmits may add a few.
    return {s for s in switches if after[s] - before[s] >= count * 0.9}


def assert_path(
    emulation: Emulation,
    src: str,
    dst: str,
    expected_switches: Iterable[Hop],
    *,
    dev: str | None = None,
    count: int = 20,
) -> set[str]:
    """Echo requests from ``src`` to ``dst`` (out of ``dev`` if given) cross exactly
    ``expected_switches``: each item is a switch name or a frozenset meaning exactly one of
    them (an ECMP choice). Returns the switches actually crossed."""
    crossed = switches_on_path(emulation, src, dst, dev, count)
    remaining = set(crossed)
    for hop in expected_switches:
        if isinstance(hop, str):
            assert hop in crossed, f"{src} -> {dst}: expected to cross {hop}, crossed {crossed}"
            remaining.discard(hop)
        else:
            chosen = crossed & hop
            assert len(chosen) == 1, (
                f"{src} -> {dst}: expected exactly one of {sorted(hop)}, crossed {crossed}"
            )
            remaining -= chosen
    assert not remaining, f"{src} -> {dst}: crossed unexpected switches {sorted(remaining)}"
    return crossed


def assert_reachable(emulation: Emulation, timeout: float = 30.0) -> None:
    """Every GPU reaches every other through each NIC port, and its server-mates, within
    ``timeout`` seconds (after a change the controller may still be reprogramming)."""
    assert emulation.description is not None
    plan = probe_plan(emulation.description)
    deadline = time.monotonic() + timeout
    while True:
        failed = probe_once(plan, emulation.netns_paths())
        missing = [t.describe() for targets in failed.values() for t in targets]
        if not missing:
            return
        assert time.monotonic() < deadline, f"{len(missing)} unanswered: {missing[:10]}"
        plan = failed


def nic_tx_packets(emulation: Emulation, gpu: str) -> dict[str, int]:
    """Packets sent so far by each of ``gpu``'s NIC ports (its namespace's /proc/net/dev)."""
    return _nic_tx(emulation, gpu, 9)


def nic_tx_bytes(emulation: Emulation, gpu: str) -> dict[str, int]:
    """Bytes sent so far by each of ``gpu``'s NIC ports (its namespace's /proc/net/dev)."""
    return _nic_tx(emulation, gpu, 8)


def _nic_tx(emulation: Emulation, gpu: str, column: int) -> dict[str, int]:
    assert emulation.description is not None
    text = emulation.cmd(gpu, ["cat", "/proc/net/dev"])
    counts = {}
    nics = {n.intf for n in emulation.description.addresses[gpu].nics}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() in nics:
            counts[name.strip()] = int(rest.split()[column])
    return counts


def connection_devices(
    emulation: Emulation, gpu: str, connections: Sequence[FiveTuple]
) -> list[str | None]:
    """The interface ``gpu``'s kernel sends each TCP five-tuple out of (``ip route get``
    for exactly that five-tuple: its multipath hash)."""
    queries = [(c.src_ip, c.dst_ip, c.src_port, c.dst_port) for c in connections]
    return route_devices(emulation, gpu, queries)


def send_udp_flows(emulation: Emulation, src: str, dst: str, flows: int = 64) -> None:
    """One datagram from each of ``flows`` source ports: different five-tuples."""
    assert emulation.description is not None
    address = emulation.description.addresses[dst].fabric_ip
    code = (
        "import socket\n"
        f"for _ in range({flows}):\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"    s.sendto(b'x' * 100, ({address!r}, 9))\n"
        "    s.close()\n"
    )
    emulation.cmd(src, ["python3", "-c", code])


# -- leftovers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    bridges: frozenset[str]
    links: frozenset[str]


def snapshot() -> Snapshot:
    bridges = frozenset(_run(["ovs-vsctl", "list-br"]).split())
    links = frozenset(
        line.split(":", 2)[1].strip().split("@", 1)[0]
        for line in _run(["ip", "-o", "link", "show"]).splitlines()
        if line.count(":") >= 2
    )
    return Snapshot(bridges, links)


def recorded_processes_alive(state: RunState) -> list[str]:
    """Recorded processes (pid with its recorded start time) still running."""
    alive = []
    for process in state.processes:
        if proc_starttime(process.pid) == process.starttime:
            alive.append(f"{process.name} ({process.pid})")
    for host in state.hosts.values():
        if host.pid is not None and proc_starttime(host.pid) == host.starttime:
            alive.append(f"{host.name} ({host.pid})")
    return alive


def leftovers(before: Snapshot, state: RunState, nodes: Iterable[str]) -> list[str]:
    """What the run left: its recorded bridges, interfaces and processes, and any new bridge
    or interface named after one of the fabric's ``nodes`` (other experiments on the same
    machine may add and remove their own meanwhile: those are not counted)."""
    after = snapshot()
    names = set(nodes)

    def fabric_name(name: str) -> bool:
        return name in names or name.split("-eth", 1)[0] in names

    recorded_bridges = {b["name"] for b in state.bridges}
    recorded_links = set(state.interfaces) | recorded_bridges
    found = [f"bridge {b}" for b in after.bridges - before.bridges if fabric_name(b)]
    found += [f"interface {n}" for n in after.links - before.links if fabric_name(n)]
    found += [f"recorded bridge {b}" for b in recorded_bridges & after.bridges]
    found += [f"recorded interface {n}" for n in recorded_links & after.links]
    found += [f"process {p}" for p in recorded_processes_alive(state)]
    return sorted(set(found))
