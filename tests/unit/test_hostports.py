"""The host's choice of NIC port as data (orchestrator/testbed/hostports.py, pinning.py):
the setting's validation and the source-port plans for ``balanced`` and ``hash`` under a
policy that pins paths and one that does not. No root: the kernel's ``ip route get`` is
played by :class:`HashingKernel`, a deterministic stand-in for the multipath hash (what the
real kernel does with these ports is checked on a running fabric, in
tests/integration/test_host_ports.py)."""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from controllers.pinning import PORT_BASE, PinnedPaths, PortLayout, paths_document
from orchestrator.emulation.executor import Completed
from orchestrator.emulation.hostconfig import forwarding_ranges
from orchestrator.monitor.record import path_hops
from orchestrator.testbed.hostports import HOST_PORTS, add_host_ports_option, check_host_ports
from orchestrator.testbed.pinning import (
    CANDIDATES,
    EPHEMERAL,
    MAX_PORT,
    Candidate,
    assign,
    balance_nics,
    candidates,
    fabric_flows,
    held_ports,
    own_ranges,
    pick_ports,
    plan_ports,
    source_ports,
)
from orchestrator.worker.spec import WorkerSpec, workers_from_description
from tests.helpers import parallel_links_description, preset_description
from topologies.description import FabricDescription
from topologies.errors import ConfigError, EmulationError
from topologies.generators import build_fabric
from topologies.model import Tier
from topologies.spec import parse_fabric_spec

PORT = 47000  # the workers' listening port
RING = [("all-reduce", "ring")]
DIRECT = [("all-to-all", "direct")]


class HashingKernel:
    """A CommandExecutor answering ``ip -json -batch -`` of ``route get`` as a multipath
    route would: the device is a hash of the five-tuple over the GPU's ``up`` NIC ports. On
    a rail-only fabric, a destination on another rail is routed to the NVLink port (the
    server-mate forwards), unless the packet arrives on it (``iif``: the mate's view), where
    the forwarding rules of orchestrator/emulation/hostconfig.py choose by source port."""

    def __init__(self, description: FabricDescription, down: set[str] | None = None) -> None:
        self.description = description
        self.down = down or set()
        #: gpu, src, dst, sport, dport, iif
        self.queries: list[tuple[str, str, str, int, int, str | None]] = []
        self.gpu_at = {a.fabric_ip: gpu for gpu, a in description.addresses.items()}

    def device(self, gpu: str, src: str, dst: str, sport: int, dport: int) -> str:
        nics = [n.intf for n in self.description.addresses[gpu].nics if n.intf not in self.down]
        digest = hashlib.blake2b(f"{src} {dst} {sport} {dport}".encode(), digest_size=4)
        return nics[int.from_bytes(digest.digest(), "big") % len(nics)]

    def run(self, node: str | None, argv: Sequence[str], **options: Any) -> Completed:
        assert node is not None and list(argv) == ["ip", "-json", "-batch", "-"]
        answers = []
        for line in options["input"].splitlines():
            # route get DST from SRC [iif DEV] ipproto tcp sport P dport Q
            words = line.split()
            value = dict(zip(words[3::2], words[4::2], strict=False)) | {"get": words[2]}
            dst, src = value["get"], value["from"]
            sport, dport, iif = int(value["sport"]), int(value["dport"]), value.get("iif")
            self.queries.append((node, src, dst, sport, dport, iif))
            fabric = self.description.fabric
            nics = sorted(self.description.addresses[node].nics, key=lambda n: n.port)
            ranges = forwarding_ranges(len(nics)) if iif is not None else []
            ruled = [n.intf for n, (lo, hi) in zip(nics, ranges, strict=False) if lo <= sport <= hi]
            if iif is None and fabric.wire_source(node, self.gpu_at[dst]) != node:
                dev = self.description.addresses[node].nvlink.intf  # to the mate
            elif ruled and ruled[0] not in self.down:
                dev = ruled[0]
            else:
                dev = self.device(node, src, dst, sport, dport)
            answers.append(json.dumps([{"dst": dst, "dev": dev, "prefsrc": src}]))
        return Completed(tuple(argv), 0, "\n".join(answers) + "\n", "")

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        raise AssertionError("planning starts no process")


@pytest.fixture(scope="module")
def description() -> FabricDescription:
    return preset_description("astral-small")


@pytest.fixture(scope="module")
def workers(description: FabricDescription) -> list[WorkerSpec]:
    return workers_from_description(description)


@pytest.fixture(scope="module")
def paths(description: FabricDescription) -> dict[str, Any]:
    return paths_document(PinnedPaths(description))


def nic_of(description: FabricDescription, kernel: HashingKernel, w: list[WorkerSpec]) -> Any:
    """What the kernel does with a planned port: the NIC port (model number) it leaves by."""

    def nic(flow: tuple[int, int, int], port: int) -> int:
        src, dst = w[flow[0]], w[flow[1]]
        dev = kernel.device(src.host, src.fabric_ip, dst.fabric_ip, port, PORT)
        return next(n.port for n in description.addresses[src.host].nics if n.intf == dev)

    return nic


# --- the setting -----------------------------------------------------------------------------


def test_the_setting_names_its_key_and_values() -> None:
    assert HOST_PORTS == ("balanced", "hash")
    assert check_host_ports("hash") == "hash"
    for wrong in ("random", "", None, ["hash"]):
        with pytest.raises(ConfigError) as error:
            check_host_ports(wrong, "bench")
        assert error.value.key == "host_ports"
        assert "one of balanced, hash" in str(error.value) and "bench" in str(error.value)


def test_the_benchmarks_option_takes_both_by_default_and_refuses_a_wrong_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="bench")
    add_host_ports_option(parser)
    assert parser.parse_args([]).host_ports == ["hash", "balanced"]
    assert parser.parse_args(["--host-ports", "balanced"]).host_ports == ["balanced"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--host-ports", "hash,bonded"])
    assert "one of balanced, hash, found 'bonded'" in capsys.readouterr().err


# --- balanced, a policy that does not pin paths ----------------------------------------------


@pytest.mark.parametrize(("collectives", "channels"), [(RING, 2), (DIRECT, 1), (DIRECT, 2)])
def test_balanced_spreads_every_ranks_connections_evenly_over_its_nic_ports(
    description: FabricDescription,
    workers: list[WorkerSpec],
    collectives: list[tuple[str, str]],
    channels: int,
) -> None:
    kernel = HashingKernel(description)
    plan = source_ports(
        kernel, description, workers, channels, PORT, collectives, host_ports="balanced"
    )
    flows = fabric_flows(workers, collectives, channels)[0]
    assert set(plan.ports) == set(flows) and plan.unpinned == []
    nic = nic_of(description, kernel, workers)
    for rank in {f[0] for f in flows}:
        mine = [f for f in flows if f[0] == rank]
        per_nic = Counter(nic(f, plan.ports[f]) for f in mine)
        assert set(per_nic) == {1, 2}, (rank, per_nic)  # both NIC ports carry some
        assert max(per_nic.values()) - min(per_nic.values()) <= 1, (rank, per_nic)
        ports = [plan.ports[f] for f in mine]
        assert len(set(ports)) == len(ports)  # no port twice on one rank
        assert all(PORT_BASE <= p <= MAX_PORT for p in ports)
    for flow, candidate in plan.chosen.items():  # the chosen port leaves by the chosen NIC
        assert nic(flow, plan.ports[flow]) == candidate.nic
        assert candidate.nodes[1] == next(
            n.peer
            for n in description.addresses[workers[flow[0]].host].nics
            if n.port == candidate.nic
        )


def test_balanced_uses_only_the_nic_ports_the_kernel_routes_out_of(
    description: FabricDescription, workers: list[WorkerSpec]
) -> None:
    down = {n.intf for n in description.addresses[workers[1].host].nics if n.port == 2}
    kernel = HashingKernel(description, down)  # rank 1's second NIC link is down
    plan = source_ports(kernel, description, workers, 2, PORT, RING, host_ports="balanced")
    assert plan.unpinned == []
    assert {plan.chosen[f].nic for f in plan.chosen if f[0] == 1} == {1}
    assert {plan.chosen[f].nic for f in plan.chosen if f[0] == 3} == {1, 2}


def test_balanced_avoids_ports_already_taken(
    description: FabricDescription, workers: list[WorkerSpec]
) -> None:
    kernel = HashingKernel(description)
    first = source_ports(kernel, description, workers, 2, PORT, RING, host_ports="balanced")
    taken = {f[0]: {p} for f, p in first.ports.items()}
    again = source_ports(
        kernel, description, workers, 2, PORT, RING, host_ports="balanced", taken=taken
    )
    assert set(again.ports) == set(first.ports)
    for flow, port in again.ports.items():
        assert port not in taken[flow[0]]
        assert again.chosen[flow].nic == first.chosen[flow].nic


# --- hash, a policy that does not pin paths --------------------------------------------------


def test_hash_without_pinned_paths_plans_nothing_and_asks_the_kernel_nothing(
    description: FabricDescription, workers: list[WorkerSpec]
) -> None:
    kernel = HashingKernel(description)
    plan = source_ports(kernel, description, workers, 2, PORT, RING, host_ports="hash")
    assert plan.ports == {} and plan.chosen == {} and plan.unpinned == []
    assert kernel.queries == []


# --- path-pinned: balanced and hash ----------------------------------------------------------


def test_path_pinned_balanced_picks_both_the_nic_port_and_a_disjoint_path(
    description: FabricDescription, workers: list[WorkerSpec], paths: dict[str, Any]
) -> None:
    kernel = HashingKernel(description)
    plan = source_ports(
        kernel, description, workers, 2, PORT, RING, host_ports="balanced", paths=paths
    )
    layout = PortLayout.from_dict(paths["layout"])
    nic = nic_of(description, kernel, workers)
    assert plan.unpinned == [] and set(plan.ports) == set(fabric_flows(workers, RING, 2)[0])
    links = [x for c in plan.chosen.values() for x in c.links()]
    assert len(links) == len(set(links))  # the ring's connections share no link
    for flow, port in plan.ports.items():
        assert layout.value(port) == plan.chosen[flow].value  # the port selects the path
        assert nic(flow, port) == plan.chosen[flow].nic  # and the kernel the NIC port
    for rank in {f[0] for f in plan.ports}:
        assert {plan.chosen[(rank, d, c)].nic for (r, d, c) in plan.ports if r == rank} == {1, 2}


def test_path_pinned_hash_keeps_the_nic_port_the_kernels_hash_gives_an_ephemeral_port(
    description: FabricDescription, workers: list[WorkerSpec], paths: dict[str, Any]
) -> None:
    flows = fabric_flows(workers, DIRECT, 2)
    kernel = HashingKernel(description)
    plan = plan_ports(
        kernel,
        description,
        workers,
        flows,
        PORT,
        host_ports="hash",
        paths=paths,
        rng=random.Random(7),
    )
    # the probes: one port of the ephemeral range per flow, in flow order, from the rng
    rng = random.Random(7)
    probes = {f: rng.randint(*EPHEMERAL) for f in flows[0]}
    nic = nic_of(description, kernel, workers)
    layout = PortLayout.from_dict(paths["layout"])
    assert plan.unpinned == []
    for flow, port in plan.ports.items():
        assert plan.chosen[flow].nic == nic(flow, probes[flow])  # the hash's NIC port
        assert nic(flow, port) == plan.chosen[flow].nic
        assert layout.value(port) == plan.chosen[flow].value
    # not balanced: with 12 connections per rank, some rank's hash is uneven
    spread = [Counter(plan.chosen[f].nic for f in plan.ports if f[0] == rank) for rank in range(8)]
    assert any(max(s.values()) - min(s.values(), default=0) > 1 or len(s) < 2 for s in spread)


# --- the pure steps --------------------------------------------------------------------------


def test_own_ranges_give_every_flow_of_a_rank_ports_of_its_own() -> None:
    groups = [[(0, 1, 0), (0, 1, 1), (1, 0, 0)], [(0, 1, 0), (0, 2, 0)]]
    tries = own_ranges(groups)
    assert list(tries) == [(0, 1, 0), (0, 1, 1), (1, 0, 0), (0, 2, 0)]
    assert tries[(0, 1, 0)] == list(range(PORT_BASE, PORT_BASE + CANDIDATES))
    assert tries[(0, 1, 1)][0] == PORT_BASE + CANDIDATES
    assert tries[(1, 0, 0)][0] == PORT_BASE  # another rank, another source address
    assert tries[(0, 2, 0)][0] == PORT_BASE + 2 * CANDIDATES
    fit = (MAX_PORT + 1 - PORT_BASE) // CANDIDATES  # flows whose ranges fit below 65536
    assert own_ranges([[(0, 1, c) for c in range(fit)]])[(0, 1, fit - 1)][-1] == MAX_PORT
    many = [[(0, 1, c) for c in range(fit + 1)]]
    with pytest.raises(EmulationError, match="more fabric connections than there are"):
        own_ranges(many)


def test_pick_ports_takes_the_first_free_try_on_the_chosen_nic() -> None:
    a, b = (0, 1, 0), (0, 1, 1)
    chosen = {a: Candidate(0, 2, ("g0", "t1")), b: Candidate(0, 2, ("g0", "t1"))}
    tries = {a: [10, 11, 12], b: [11, 12, 13]}
    nics: dict[tuple[int, int, int], list[int | None]] = {a: [1, 2, 2], b: [2, 2, None]}
    assert pick_ports(chosen, tries, nics) == {a: 11, b: 12}
    assert pick_ports(chosen, tries, nics, taken={0: {11}}) == {a: 12}  # b finds none


def test_balance_nics_spreads_each_rank_then_each_tor(
    description: FabricDescription, workers: list[WorkerSpec]
) -> None:
    everywhere = {1, 2}
    one = [[(1, 2, 0), (3, 4, 0)]]  # ranks 1 and 3: one flow each, behind one ToR pair
    tor = {
        (w.rank, n.port): n.peer for w in workers[:4] for n in description.addresses[w.host].nics
    }
    assert tor[(1, 1)] == tor[(3, 1)] and tor[(1, 2)] == tor[(3, 2)]
    chosen = balance_nics(one, workers, description, dict.fromkeys(one[0], everywhere))
    assert chosen == {(1, 2, 0): 1, (3, 4, 0): 2}  # the second takes the other ToR
    ring = [[(1, 2, 0), (1, 2, 1), (3, 4, 0), (3, 4, 1)]]
    chosen = balance_nics(ring, workers, description, dict.fromkeys(ring[0], everywhere))
    assert [chosen[f] for f in ring[0]] == [1, 2, 1, 2]  # per rank first: one on each port
    live = {(1, 2, 0): {2}, (1, 2, 1): {2}, (3, 4, 0): set(), (3, 4, 1): everywhere}
    chosen = balance_nics(ring, workers, description, live)
    assert chosen == {(1, 2, 0): 2, (1, 2, 1): 2, (3, 4, 1): 1}  # only live ports, or none
    later = [[(1, 2, 1), (1, 5, 0)]]  # a second collective: flows placed before count
    chosen = balance_nics(
        [*ring, *later], workers, description, dict.fromkeys([*ring[0], *later[0]], everywhere)
    )
    assert chosen[(1, 5, 0)] == 1 and chosen[(1, 2, 1)] == 2


class SocketTable:
    """A CommandExecutor answering ``ss -Htan`` per GPU with the given lines."""

    def __init__(self, lines: dict[str, list[str]]) -> None:
        self.lines = lines

    def run(self, node: str | None, argv: Sequence[str], **options: Any) -> Completed:
        assert list(argv) == ["ss", "-Htan"] and node is not None
        return Completed(tuple(argv), 0, "\n".join(self.lines.get(node, [])) + "\n", "")

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        raise AssertionError("ss only")


def test_held_ports_are_those_of_either_end_of_a_connection_from_the_rank(
    workers: list[WorkerSpec],
) -> None:
    a, b = workers[3], workers[4]
    table = SocketTable(
        {
            a.host: [
                f"TIME-WAIT 0 0 {a.fabric_ip}:16384 {b.fabric_ip}:47000",  # a's own end
                f"LISTEN 0 256 {a.fabric_ip}:47000 0.0.0.0:*",
                f"ESTAB 0 0 {a.nvlink_ip}:34465 {workers[2].nvlink_ip}:47000",  # NVLink
            ],
            b.host: [f"FIN-WAIT-2 0 0 {b.fabric_ip}:47000 {a.fabric_ip}:16416"],  # b's end
        }
    )
    held = held_ports(table, workers)
    assert held[a.rank] == {16384, 47000, 16416}
    assert held[b.rank] == {47000}
    assert held[workers[2].rank] == set()


# --- rail-only: a connection to another rail leaves by its server-mate's NIC ------------------


@pytest.fixture(scope="module")
def rail_only() -> FabricDescription:
    return preset_description("rail-only-small")


@pytest.mark.parametrize("pinned", [True, False], ids=["path-pinned", "not-pinned"])
@pytest.mark.parametrize("collectives", [RING, DIRECT], ids=["ring", "direct"])
def test_a_forwarded_connection_is_planned_at_the_mate_that_forwards_it(
    rail_only: FabricDescription, collectives: list[tuple[str, str]], pinned: bool
) -> None:
    """The mate forwards by the source port's range: the planned port lies in the range of
    the NIC port chosen for it among the mate's, and is asked of the mate, as arriving on
    its NVLink port; the mate's NIC ports stay balanced over everything they carry, its own
    connections and those it forwards. Before, such a connection was asked of its source,
    whose kernel routes it to NVLink: it was left unpinned, to the mate's hash."""
    workers = workers_from_description(rail_only)
    paths = paths_document(PinnedPaths(rail_only)) if pinned else None
    kernel = HashingKernel(rail_only)
    plan = source_ports(
        kernel, rail_only, workers, 2, PORT, collectives, host_ports="balanced", paths=paths
    )
    flows = fabric_flows(workers, collectives, 2)[0]
    fabric = rail_only.fabric
    forwarded = {
        f: fabric.wire_source(workers[f[0]].host, workers[f[1]].host)
        for f in flows
        if fabric.wire_source(workers[f[0]].host, workers[f[1]].host) != workers[f[0]].host
    }
    assert forwarded, "rail-only-small's collectives cross rails"
    assert plan.unpinned == [] and set(plan.ports) == set(flows)
    asked = {(q[0], q[1], q[2], q[3]): q[5] for q in kernel.queries}
    per_wire: dict[str, Counter[int]] = {}
    for flow, port in plan.ports.items():
        src, dst = workers[flow[0]], workers[flow[1]]
        wire = forwarded.get(flow, src.host)
        chosen = plan.chosen[flow]
        assert chosen.nodes[0] == wire  # the path starts at the GPU that sends it out
        iif = asked[(wire, src.fabric_ip, dst.fabric_ip, port)]
        assert iif == (rail_only.addresses[wire].nvlink.intf if flow in forwarded else None)
        if flow in forwarded:  # the port's range names the NIC port
            low, high = forwarding_ranges(2)[chosen.nic - 1]
            assert low <= port <= high, (flow, port, chosen.nic)
        else:  # the source's own hash
            dev = kernel.device(wire, src.fabric_ip, dst.fabric_ip, port, PORT)
            assert dev == next(n.intf for n in rail_only.addresses[src.host].nics
                               if n.port == chosen.nic)  # fmt: skip
        if paths is not None:
            assert PortLayout.from_dict(paths["layout"]).value(port) == chosen.value
        per_wire.setdefault(wire, Counter())[chosen.nic] += 1
    for wire, per_nic in per_wire.items():
        assert max(per_nic.values()) - min(per_nic.values(), default=0) <= 1, (wire, per_nic)
        assert set(per_nic) == {1, 2} or sum(per_nic.values()) == 1, (wire, per_nic)


def test_the_forecast_routes_a_forwarded_connection_as_the_run_pins_it(
    rail_only: FabricDescription,
) -> None:
    """The forecast's router (orchestrator/forecast/paths.py) takes each connection of a
    rail-only ring under path-pinned through the mate's NIC port and path the orchestrator
    plans for it: the same functions, so the same choice (NVLink to the mate first)."""
    from orchestrator.forecast.paths import PolicyRouter

    workers = workers_from_description(rail_only)
    paths = paths_document(PinnedPaths(rail_only))
    groups = fabric_flows(workers, RING, 2)
    plan = source_ports(
        HashingKernel(rail_only), rail_only, workers, 2, PORT, RING, host_ports="balanced",
        paths=paths,
    )  # fmt: skip
    routed = PolicyRouter(rail_only, "path-pinned").route(workers, groups, "balanced")
    fabric = rail_only.fabric
    forwarded = 0
    for flow in groups[0]:
        src = workers[flow[0]].host
        chosen = plan.chosen[flow].nodes
        if chosen[0] != src:
            forwarded += 1
            nvlink = fabric.servers[fabric.gpus[src].server].nvswitch
            chosen = (src, nvlink, *chosen)
        assert routed.paths[flow] == chosen, flow
    assert forwarded > 0


def test_a_forwarded_connection_is_traced_from_the_mate_that_forwards_it(
    rail_only: FabricDescription,
) -> None:
    """orchestrator/testbed/tracing.py asks the mate (as arriving on NVLink) which NIC port
    a forwarded connection leaves by, and starts its walk there; a connection on its own
    rail is asked of its source."""
    from orchestrator.testbed.tracing import flow_requests
    from topologies.fivetuple import FiveTuple

    kernel = HashingKernel(rail_only)
    a = rail_only.addresses
    across = FiveTuple(a["p0s0g1"].fabric_ip, 17000, a["p0s1g0"].fabric_ip, PORT)
    low, _ = forwarding_ranges(2)[1]
    ruled = FiveTuple(a["p0s0g1"].fabric_ip, low + 5, a["p1s0g0"].fabric_ip, PORT)
    own = FiveTuple(a["p0s0g0"].fabric_ip, 17001, a["p0s1g0"].fabric_ip, PORT)
    flows = [(across, "p0s0g1", "p0s1g0"), (ruled, "p0s0g1", "p1s0g0"), (own, "p0s0g0", "p0s1g0")]
    requests = flow_requests(kernel, rail_only, flows)
    assert [r.src for r in requests] == ["p0s0g0", "p0s0g0", "p0s0g0"]  # the mate, twice
    assert [r.nic for r in requests[:2]] == [1, 2]  # by the source port's range
    nvlink = a["p0s0g0"].nvlink.intf
    assert [q[5] for q in kernel.queries] == [nvlink, nvlink, None]
    assert requests[2].nic in (1, 2) and requests[2].why_not == ""


@pytest.mark.parametrize("pinned", [True, False], ids=["path-pinned", "not-pinned"])
def test_a_single_port_mate_forwards_every_planned_port(pinned: bool) -> None:
    """A rail-only fabric with one NIC port per GPU has no forwarding ranges (nothing to
    choose): a forwarded connection's port is any that selects its path, still asked of
    the mate, and none is left unpinned."""
    import yaml

    from topologies.catalog import resolve_fabric

    document = yaml.safe_load(resolve_fabric("rail-only-small").read_text())
    document |= {"name": "rail-only-1nic", "nic_ports": 1}
    one = FabricDescription.of(build_fabric(parse_fabric_spec(document)))
    assert one.fabric.gpu_forwarding and forwarding_ranges(1) == []
    workers = workers_from_description(one)
    paths = paths_document(PinnedPaths(one)) if pinned else None
    kernel = HashingKernel(one)
    plan = source_ports(kernel, one, workers, 2, PORT, RING, host_ports="balanced", paths=paths)
    flows = fabric_flows(workers, RING, 2)[0]
    assert plan.unpinned == [] and set(plan.ports) == set(flows)
    mates = {q[0] for q in kernel.queries if q[5] is not None}
    assert mates and all(plan.chosen[f].nic == 1 for f in flows)


def test_a_run_spreads_pinned_connections_over_parallel_links() -> None:
    """On a fabric whose leaves reach their spine by parallel links, the run's own
    assignment (from the published paths) spreads a collective's connections over them,
    and records the link each takes: the paths file names its port."""
    description = parallel_links_description()
    fabric = description.fabric
    workers = workers_from_description(description)
    rank = {w.host: w.rank for w in workers}
    rail = {w.rank: fabric.gpus[w.host].rail for w in workers}
    ranks = sorted(rank.values())
    flows = [(a, b, 0) for a in ranks for b in ranks if rail[a] != rail[b]]
    chosen = assign([flows], workers, candidates(paths_document(PinnedPaths(description))))
    assert set(chosen) == set(flows)
    (spine,) = [s.name for s in fabric.switches_in(Tier.AGG)]
    up = Counter(lane for c in chosen.values() for lane in c.links() if lane[1] == spine)
    # 16 cross-rail connections out of each leaf over its 4 uplinks: 4 each
    per_leaf = Counter(lane[0] for lane in up)
    assert set(per_leaf.values()) == {4} and set(up.values()) == {4}, up
    for c in chosen.values():
        hops = path_hops(fabric, c)
        at_leaf = next(h for h in hops if h.node in fabric.switches)
        assert at_leaf.out_port == c.links()[1][2]  # recorded as taken, not the first twin
