"""``host_ports`` on a real astral-small: what the kernels did with the connections.

Under ``balanced`` every rank's fabric connections leave evenly by its two NIC ports, under
a policy that does not pin paths (``ecmp``) as under one that does (``path-pinned``):
checked with ``ip route get`` for each connection's actual five-tuple (the workers report
them) and, for the ring, with the NIC interfaces' own byte counters. Under ``hash`` the
connections come from the kernel's ephemeral ports (its ``ip_local_port_range``), except
under ``path-pinned``, whose ports pin paths: there each connection leaves by the NIC port
the plan took from the kernel's hash, on the path its port selects.
"""

from __future__ import annotations

from collections import Counter

import pytest

from controllers.pinning import PortLayout, read_paths
from orchestrator.pytest_plugin import FabricFactory, FabricHandle
from orchestrator.testbed.pinning import PATHS_FILE
from orchestrator.worker.outcome import ConnectionInfo, RunResult
from tests.integration.assertions import connection_devices, nic_tx_bytes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fabric(astral_fabric: FabricFactory) -> FabricHandle:
    return astral_fabric("astral-small", policy="ecmp")


def fabric_connections(result: RunResult) -> list[ConnectionInfo]:
    result.raise_for_failure()
    connections = [c for c in result.connections if c.link == "fabric"]
    assert connections, "the collective opened no fabric connection"
    return connections


def nic_ports(fabric: FabricHandle, connections: list[ConnectionInfo]) -> dict[ConnectionInfo, int]:
    """The NIC port (model port number) each connection's kernel sends it out of."""
    description = fabric.testbed.description
    host = {w.rank: w.host for w in fabric.testbed.workers()}
    out: dict[ConnectionInfo, int] = {}
    for rank in sorted({c.src for c in connections}):
        mine = [c for c in connections if c.src == rank]
        devices = connection_devices(
            fabric.testbed.emulation, host[rank], [c.five_tuple for c in mine]
        )
        port_of = {n.intf: n.port for n in description.addresses[host[rank]].nics}
        for connection, device in zip(mine, devices, strict=True):
            assert device in port_of, f"{connection.five_tuple} leaves by {device}, not a NIC"
            out[connection] = port_of[device]
    return out


def ephemeral_range(fabric: FabricHandle, gpu: str) -> range:
    low, high = fabric.testbed.emulation.cmd(
        gpu, ["cat", "/proc/sys/net/ipv4/ip_local_port_range"]
    ).split()
    return range(int(low), int(high) + 1)


@pytest.mark.parametrize("policy", ["ecmp", "path-pinned"])
@pytest.mark.parametrize(
    ("collective", "algorithm"), [("all-reduce", "ring"), ("all-to-all", "direct")]
)
def test_balanced_spreads_every_ranks_connections_over_its_nic_ports(
    fabric: FabricHandle, policy: str, collective: str, algorithm: str
) -> None:
    fabric.use_policy(policy)
    gpus = fabric.gpus
    before = {g: nic_tx_bytes(fabric.testbed.emulation, g) for g in gpus}
    run = fabric.run(collective, algorithm, sizes=["1M"], iterations=1, host_ports="balanced")
    after = {g: nic_tx_bytes(fabric.testbed.emulation, g) for g in gpus}
    assert run.host_ports == "balanced" and run.wrong == 0
    connections = fabric_connections(run.result)
    planned = fabric.testbed.pinning
    assert planned is not None and planned.unpinned == []
    nics = nic_ports(fabric, connections)
    for c in connections:  # the workers bound the planned ports, the kernel obeyed the plan
        key = (c.src, c.dst, c.channel)
        assert c.five_tuple.src_port == planned.ports[key], c
        assert nics[c] == planned.chosen[key].nic, c
    for rank in sorted({c.src for c in connections}):
        per_port = Counter(nics[c] for c in connections if c.src == rank)
        assert set(per_port) == {1, 2}, f"rank {rank}: {per_port}"
        assert max(per_port.values()) - min(per_port.values()) <= 1, f"rank {rank}: {per_port}"
    if (collective, algorithm) == ("all-reduce", "ring"):
        # one fabric peer, two connections, one per NIC port: each port sent about half
        # (the counters also hold the ACKs of the connections the rank receives on)
        for rank in sorted({c.src for c in connections}):
            gpu = gpus[rank]
            sent = {i: after[gpu][i] - before[gpu][i] for i in after[gpu]}
            total = sum(sent.values())
            assert total > 1 << 20, f"{gpu}: its NIC ports sent {sent}"
            assert all(b > 0.3 * total for b in sent.values()), f"{gpu}: {sent}"


def hashed_all_to_all(fabric: FabricHandle, policy: str) -> list[ConnectionInfo]:
    """Direct all-to-all under ``policy`` with ``hash`` host ports: its fabric connections."""
    fabric.use_policy(policy)
    run = fabric.run("all-to-all", "direct", sizes=["64K"], iterations=1, host_ports="hash")
    assert run.host_ports == "hash" and run.wrong == 0
    return fabric_connections(run.result)


def test_hash_leaves_the_nic_port_to_the_kernel_with_ephemeral_ports(
    fabric: FabricHandle,
) -> None:
    connections = hashed_all_to_all(fabric, "ecmp")
    ephemeral = ephemeral_range(fabric, fabric.gpus[0])
    for c in connections:
        assert c.five_tuple.src_port in ephemeral, c.five_tuple
    nic_ports(fabric, connections)  # and each leaves by a NIC port of its GPU


def test_path_pinned_under_hash_pins_the_path_from_the_nic_port_the_hash_gives(
    fabric: FabricHandle,
) -> None:
    connections = hashed_all_to_all(fabric, "path-pinned")
    planned = fabric.testbed.pinning
    assert planned is not None and planned.unpinned == []
    layout = PortLayout.from_dict(read_paths(fabric.testbed.run_dir / PATHS_FILE)["layout"])
    nics = nic_ports(fabric, connections)
    for c in connections:
        key = (c.src, c.dst, c.channel)
        assert c.five_tuple.src_port == planned.ports[key], c
        assert layout.value(c.five_tuple.src_port) == planned.chosen[key].value, c
        assert nics[c] == planned.chosen[key].nic, c


def test_rail_only_mates_forward_by_the_nic_port_planned_for_each_connection(
    astral_fabric: FabricFactory,
) -> None:
    """On rail-only-small every fabric connection of the ring crosses NVLink to a server-mate
    first, which forwards it out of the NIC port its source port's range names
    (orchestrator/emulation/hostconfig.py): the plan balanced the two channels of each
    forwarded connection over the mate's two ports, and the mate's NIC counters show each
    port sent about half. Left to the mate's hash (the sending socket's random hash), both
    channels often left by one port."""
    fabric = astral_fabric("rail-only-small", policy="path-pinned")
    description = fabric.testbed.description
    before = {g: nic_tx_bytes(fabric.testbed.emulation, g) for g in fabric.gpus}
    run = fabric.run("all-reduce", "ring", sizes=["1M"], iterations=1, host_ports="balanced")
    after = {g: nic_tx_bytes(fabric.testbed.emulation, g) for g in fabric.gpus}
    connections = fabric_connections(run.result)
    planned = fabric.testbed.pinning
    assert planned is not None and planned.unpinned == []
    host = {w.rank: w.host for w in fabric.testbed.workers()}
    forwarded = {
        description.fabric.wire_source(host[c.src], host[c.dst])
        for c in connections
        if description.fabric.wire_source(host[c.src], host[c.dst]) != host[c.src]
    }
    assert forwarded, "the ring's connections cross rails"
    for c in connections:
        key = (c.src, c.dst, c.channel)
        assert c.five_tuple.src_port == planned.ports[key], c
        assert planned.chosen[key].nodes[0] in forwarded | {host[c.src]}
    for mate in sorted(forwarded):
        sent = {i: after[mate][i] - before[mate][i] for i in after[mate]}
        total = sum(sent.values())
        assert total > 1 << 20, f"{mate}: its NIC ports sent {sent}"
        assert all(b > 0.3 * total for b in sent.values()), f"{mate}: {sent}"
