"""Source ports: the NIC port every fabric connection leaves by and, under path-pinned, its path.

Which of a GPU's NIC ports a connection leaves by is the host's choice: the kernel's
multipath hash over the five-tuple (hostconfig: policy 1, L4). The orchestrator can ask the
kernel in advance: ``ip route get DST from SRC ipproto tcp sport P dport Q`` inside the
GPU's namespace names the device the kernel picks for exactly that five-tuple (the same hash
a connection bound to P uses; its seed stays fixed while the namespace lives). A source port
chosen before the connection opens therefore decides its first hop, and under ``path-pinned``
its path through the fabric too: the controller publishes, per (src GPU, dst GPU), the paths
a source port selects (``paths.json`` in the run directory; format and bit layout in
controllers/pinning.py). What the host does is the experiment's ``host_ports`` setting
(orchestrator/testbed/hostports.py, which says why); this module carries it out.

The NIC port is chosen first, the same way whatever the policy (so that two policies under
one setting differ by their switches only), then, under a policy that pins paths, the path
among those leaving by it:

                 NIC port of each connection            then, under path-pinned
    balanced     spread over the rank's NIC ports       the least loaded of the paths
                 by the orchestrator                    leaving by that NIC port
    hash         the kernel's hash: ephemeral ports;    (the same, from the NIC port the
                 nothing to plan unless path-pinned     hash gives a random ephemeral port)

In steps (:func:`plan_ports`):

1. flows: the fabric connections (src rank, dst rank, channel) the collectives open, in the
   order of the collectives (peers on one server talk over NVLink: not planned);
2. live NIC ports per flow: those the controller publishes paths for (path-pinned), or those
   the kernel routes some of the flow's candidate ports out of (step 5's, asked first);
3. the NIC port per flow: ``balanced`` (:func:`balance_nics`), per collective (its flows run
   together), the port with the fewest of the rank's flows so far, then the one whose ToR
   carries the fewest, then the lowest; ``hash`` (:func:`probe_nics`), the port the kernel
   routes one random port of its ephemeral range out of;
4. path-pinned: per collective, greedily, each flow takes the published path from its NIC
   port whose links are least loaded by the collective's flows placed so far (most loaded
   link first, then total load, then the smallest value; :func:`assign`);
5. ports: per flow, candidate source ports (path-pinned: ``base + j * 2**bits + value``;
   otherwise a range of :data:`CANDIDATES` ports of the flow's own, :func:`own_ranges`),
   one ``ip -batch`` of ``route get`` per GPU namespace, and the first candidate the kernel
   routes out of the chosen NIC port (each candidate matches with probability 1/ports, so
   32 candidates miss with probability 2**-32 on a dual-port NIC).

On a fabric whose GPUs forward between rails (rail-only), a connection to another rail
leaves by the NIC of its source's server-mate on the destination's rail
(``Fabric.wire_source``): its packets cross NVLink first, and the mate forwards them out of
the NIC port its source port's range names (orchestrator/emulation/hostconfig.py,
:func:`~orchestrator.emulation.hostconfig.forwarding_ranges`; the mate's hash could not be
planned). Such a connection is balanced among the mate's flows, pinned to the paths
published from the mate, its candidate ports drawn from the range of the NIC port chosen
for it (:func:`forwarded_tries`) and asked of the mate's kernel as a packet arriving on its
NVLink port (``ip route get ... iif``): the mate's NIC port is chosen, as NCCL's PXN
chooses the NIC a forwarded transfer leaves by.

A connection whose port could not be found, or between GPUs for which the controller
published no path, keeps an ephemeral port (the kernel's choice, its path left to hashing)
and is counted in :attr:`Pinning.unpinned`; ``astral run`` reports the count per
configuration.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.pinning import PORT_BASE, PortLayout, read_paths
from orchestrator.collectives.ceilings import layout_of
from orchestrator.collectives.plans import COLLECTIVES, default_registry, element_count
from orchestrator.emulation.executor import CommandExecutor
from orchestrator.emulation.hostconfig import forwarding_ranges
from orchestrator.testbed.hostports import HASH, check_host_ports
from orchestrator.worker.spec import WorkerSpec
from topologies.description import FabricDescription
from topologies.errors import EmulationError

PATHS_FILE = "paths.json"
PATHS_TIMEOUT = 30.0
CANDIDATES = 32  # source ports tried per flow (see the module docstring)
PLAN_SIZE = 1 << 16  # any size: which peers a plan talks to does not depend on it
EPHEMERAL = (32768, 60999)  # Linux's default ip_local_port_range, where probes come from
MAX_PORT = 65535

Flow = tuple[int, int, int]  # (src rank, dst rank, channel)
Lane = tuple[str, str, int]  # a directed link and the port it leaves its first node by


@dataclass(frozen=True)
class Candidate:
    """One way a flow can go: a path value (0 where the switches choose) and the NIC port
    it leaves by; ``nodes`` is what is known of its path (the first hop at least);
    ``ports``: the port each switch of ``nodes`` sends it out of, where the controller
    published them (they tell parallel links between two switches apart)."""

    value: int
    nic: int  # the source GPU's NIC port (model port number)
    nodes: tuple[str, ...]  # src GPU, switches..., dst GPU (or src GPU, ToR)
    ports: tuple[int, ...] = ()  # out ports of nodes[1:-1], in order

    def links(self) -> list[Lane]:
        """Its links, each with the port it leaves its node by (-1: not published)."""
        out = (self.nic, *self.ports)
        return [
            (a, b, out[i] if i < len(out) else -1)
            for i, (a, b) in enumerate(zip(self.nodes, self.nodes[1:], strict=False))
        ]

    def out_port(self, index: int) -> int | None:
        """The port ``nodes[index]`` sends it out of, None where not known."""
        out = (self.nic, *self.ports)
        return out[index] if index < len(out) else None


Options = Mapping[tuple[str, str], Sequence[Candidate]]  # (src GPU, dst GPU) -> options


@dataclass
class Pinning:
    """The result: source port per flow, and what was chosen for it."""

    ports: dict[Flow, int] = field(default_factory=dict)
    chosen: dict[Flow, Candidate] = field(default_factory=dict)
    unpinned: list[Flow] = field(default_factory=list)  # fabric flows left ephemeral

    @property
    def flows(self) -> int:
        """Fabric connections the pinning was for: pinned plus unpinned."""
        return len(self.ports) + len(self.unpinned)


def wait_for_paths(
    path: Path, since: float, timeout: float = PATHS_TIMEOUT, *, policy: str
) -> dict[str, Any]:
    """The paths file once the controller (started at ``since``, epoch s) wrote it under
    ``policy`` (the one that pins source ports)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            document = read_paths(path)
            if document.get("policy") == policy and document["updated_at"] >= since:
                return document
        except (OSError, ValueError, KeyError) as error:
            last = error
        time.sleep(0.05)
    raise EmulationError(
        f"the controller published no {policy} paths file {path} in {timeout:g} s"
        + (f" ({last})" if last else "")
    )


def candidates(document: Mapping[str, Any]) -> dict[tuple[str, str], list[Candidate]]:
    """Per (src GPU, dst GPU), the published paths."""
    names = list(document["switches"])
    out: dict[tuple[str, str], list[Candidate]] = {}
    for pair in document["pairs"]:
        src, dst = pair["src"], pair["dst"]
        out[(src, dst)] = [
            Candidate(
                int(p["value"]),
                int(p["nic"]),
                (src, *(names[i] for i in p["hops"]), dst),
                tuple(int(x) for x in p.get("ports", ())),
            )
            for p in pair["paths"]
        ]
    return out


def fabric_flows(
    workers: Sequence[WorkerSpec], collectives: Iterable[tuple[str, str]], channels: int
) -> list[list[Flow]]:
    """Per collective (op, algorithm), the fabric connections its plans open."""
    layout = layout_of(workers)
    registry = default_registry()
    n = layout.size
    groups = []
    for op, algorithm in collectives:
        algo = registry.get(op, algorithm)
        count = element_count(op, PLAN_SIZE * n, n)
        flows = []
        for rank in range(n):
            plan = algo.plan(layout, rank, count)
            for peer in sorted(plan.send_peers()):
                if not layout.same_server(rank, peer):
                    flows += [(rank, peer, c) for c in range(channels)]
        groups.append(flows)
    return groups


def assign(
    groups: Sequence[Sequence[Flow]],
    workers: Sequence[WorkerSpec],
    paths: Options,
    allowed: Mapping[Flow, Collection[int]] | None = None,
    sender: Mapping[Flow, str] | None = None,
) -> dict[Flow, Candidate]:
    """Step 4 of the module docstring: an option per flow, balanced per collective.
    ``allowed``: per flow, the NIC ports it may leave by (default: any, the NIC port then
    chosen with the path); a flow with no option left is not assigned. ``sender``: per
    flow, the GPU whose NIC it leaves by, where not its source (its options are the
    paths published from that GPU)."""
    host = {w.rank: w.host for w in workers}
    by = sender or {}
    chosen: dict[Flow, Candidate] = {}
    for flows in groups:
        load: Counter[Lane] = Counter()
        for flow in flows:  # flows of this collective placed by an earlier one
            if flow in chosen:
                load.update(chosen[flow].links())
        for flow in flows:
            if flow in chosen:
                continue
            options = paths.get((by.get(flow, host[flow[0]]), host[flow[1]]), ())
            if allowed is not None:
                options = [c for c in options if c.nic in allowed.get(flow, ())]
            if not options:
                continue
            best = min(
                options,
                key=lambda c: (
                    max(load[x] for x in c.links()),
                    sum(load[x] for x in c.links()),
                    c.value,
                    c.nic,
                ),
            )
            chosen[flow] = best
            load.update(best.links())
    return chosen


def own_ranges(groups: Iterable[Iterable[Flow]], base: int = PORT_BASE) -> dict[Flow, list[int]]:
    """Candidate source ports where any port does (the switches do not read it): per source
    rank, its k-th flow gets ``base + k * CANDIDATES ...`` (CANDIDATES ports), so no two
    flows of a rank share a candidate."""
    tries: dict[Flow, list[int]] = {}
    per_rank: Counter[int] = Counter()
    for flows in groups:
        for flow in flows:
            if flow in tries:
                continue
            start = base + per_rank[flow[0]] * CANDIDATES
            if start + CANDIDATES - 1 > MAX_PORT:
                raise EmulationError(
                    f"rank {flow[0]} opens more fabric connections than there are source "
                    f"ports between {base} and {MAX_PORT} ({CANDIDATES} tried for each)"
                )
            tries[flow] = list(range(start, start + CANDIDATES))
            per_rank[flow[0]] += 1
    return tries


def pick_ports(
    chosen: Mapping[Flow, Candidate],
    tries: Mapping[Flow, Sequence[int]],
    nics: Mapping[Flow, Sequence[int | None]],
    taken: Mapping[int, Collection[int]] | None = None,
) -> dict[Flow, int]:
    """Step 5's choice: per flow (in ``chosen``'s order), the first of its ``tries`` whose
    NIC port (``nics``, what the kernel answered for each try) is the chosen one, that no
    flow of the same rank got before and that is not ``taken`` (per rank)."""
    ports: dict[Flow, int] = {}
    used: dict[int, set[int]] = {}
    for flow, candidate in chosen.items():
        mine = used.setdefault(flow[0], set((taken or {}).get(flow[0], ())))
        for port, nic in zip(tries[flow], nics[flow], strict=True):
            if port not in mine and nic == candidate.nic:
                ports[flow] = port
                mine.add(port)
                break
    return ports


def route_devices(
    executor: CommandExecutor,
    gpu: str,
    queries: Sequence[tuple[str, str, int, int]],
    iif: Sequence[str | None] | None = None,
) -> list[str | None]:
    """The device the kernel of ``gpu`` picks for each (src ip, dst ip, sport, dport).
    ``iif``: per query, the device the packet arrives on when ``gpu`` forwards it (None:
    ``gpu`` sends it itself); the answer then applies the forwarding rules by source port
    (orchestrator/emulation/hostconfig.py), as the kernel does to the packets."""
    arrives = list(iif) if iif is not None else [None] * len(queries)
    lines = [
        f"route get {dst} from {src}"
        + (f" iif {dev}" if dev else "")
        + f" ipproto tcp sport {sport} dport {dport}"
        for (src, dst, sport, dport), dev in zip(queries, arrives, strict=True)
    ]
    done = executor.run(gpu, ["ip", "-json", "-batch", "-"], input="\n".join(lines) + "\n")
    devices: list[str | None] = []
    for line in done.stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            routes = json.loads(line)
        except ValueError:
            continue
        devices.append(str(routes[0].get("dev")) if routes else None)
    if len(devices) != len(queries):
        raise EmulationError(
            f"ip route get in {gpu} answered {len(devices)} of {len(queries)} queries: "
            f"{done.stderr.strip()[:200]}"
        )
    return devices


def held_ports(executor: CommandExecutor, workers: Sequence[WorkerSpec]) -> dict[int, set[int]]:
    """Per rank, the source ports a TCP socket still holds on either end of a connection from
    its fabric address (its own namespace's sockets, and the peers' sockets towards it),
    TIME_WAIT included: not to hand out again. The workers close with a reset (no
    TIME_WAIT), but a worker that was killed, or a program that closes normally (iperf3),
    leaves its connections lingering for a minute at one end or the other, and a new
    connection on the same five-tuple would be refused (EADDRNOTAVAIL, or a SYN the other
    end does not take: without TCP timestamps the kernel cannot reuse the tuple)."""
    rank_of = {w.fabric_ip: w.rank for w in workers}
    held: dict[int, set[int]] = {w.rank: set() for w in workers}
    for worker in workers:
        for line in executor.run(worker.host, ["ss", "-Htan"]).stdout.splitlines():
            fields = line.split()  # State Recv-Q Send-Q Local:Port Peer:Port
            if len(fields) < 5:
                continue
            for address in fields[3:5]:  # the source's end, or a peer's end towards it
                ip, _, port = address.rpartition(":")
                if ip in rank_of and port.isdigit():
                    held[rank_of[ip]].add(int(port))
    return held


def kernel_nics(
    executor: CommandExecutor,
    description: FabricDescription,
    workers: Sequence[WorkerSpec],
    tries: Mapping[Flow, Sequence[int]],
    dst_ports: Mapping[Flow, int],
    sender: Mapping[Flow, str] | None = None,
) -> dict[Flow, list[int | None]]:
    """Per flow, the NIC port (model port number; None: not a NIC) the kernel of the GPU
    it leaves by routes each of its ``tries`` (source ports) out of: one ``ip -batch`` per
    GPU. ``sender``: per flow, that GPU where not the source (a rail-only mate, asked as
    for a packet arriving on its NVLink port)."""
    by_rank = {w.rank: w for w in workers}
    by = sender or {}
    per_gpu: dict[str, list[Flow]] = {}
    for flow in tries:
        per_gpu.setdefault(by.get(flow, by_rank[flow[0]].host), []).append(flow)
    answers: dict[Flow, list[int | None]] = {}
    for gpu, flows in per_gpu.items():
        addresses = description.addresses[gpu]
        queries = [
            (by_rank[f[0]].fabric_ip, by_rank[f[1]].fabric_ip, port, dst_ports[f])
            for f in flows
            for port in tries[f]
        ]
        iif = [addresses.nvlink.intf if f in by else None for f in flows for _ in tries[f]]
        devices = route_devices(executor, gpu, queries, iif)
        nic_of = {nic.intf: nic.port for nic in addresses.nics}
        at = 0
        for f in flows:
            answers[f] = [nic_of.get(d) if d else None for d in devices[at : at + len(tries[f])]]
            at += len(tries[f])
    return answers


def plan_ports(
    executor: CommandExecutor,
    description: FabricDescription,
    workers: Sequence[WorkerSpec],
    groups: Sequence[Sequence[Flow]],
    dst_ports: int | Mapping[Flow, int],
    *,
    host_ports: str,
    paths: Mapping[str, Any] | None = None,
    taken: Mapping[int, Collection[int]] | None = None,
    rng: random.Random | None = None,
) -> Pinning:
    """Steps 2-5 of the module docstring for the flows of ``groups`` (one group per set of
    flows that run together), to ``dst_ports`` (one for all, or per flow). ``paths``: the
    controller's paths document when the policy pins paths, else None. ``taken``: source
    ports already in use, per rank, not to hand out again. ``rng``: where the probes of
    ``hash`` under path-pinned come from (default: a fresh, unseeded one, as ephemeral
    ports are)."""
    check_host_ports(host_ports)
    flows = list(dict.fromkeys(f for group in groups for f in group))
    if isinstance(dst_ports, int):
        dst_ports = dict.fromkeys(flows, dst_ports)
    if paths is None and host_ports == HASH:
        return Pinning()  # ephemeral ports: the kernel's hash, nothing to plan
    host = {w.rank: w.host for w in workers}
    sender = senders(description, workers, flows)
    wire = {f: sender.get(f, host[f[0]]) for f in flows}
    if paths is None:  # any port will do for the switches: a range of each flow's own
        tries = own_ranges(groups)
        tries.update(forwarded_tries(description, groups, sender))
        nics = kernel_nics(executor, description, workers, tries, dst_ports, sender)
        live = {f: {n for n in nics[f] if n is not None} for f in flows}
    else:
        options = candidates(paths)  # the controller publishes paths for live NIC ports
        live = {f: {c.nic for c in options.get((wire[f], host[f[1]]), ())} for f in flows}
    if host_ports == HASH:
        first = probe_nics(executor, description, workers, flows, dst_ports, rng, sender)
    else:
        first = balance_nics(groups, workers, description, live, sender)
    if paths is None:
        peer = nic_peers(description)
        chosen = {f: Candidate(0, nic, (wire[f], peer[(wire[f], nic)])) for f, nic in first.items()}
    else:
        layout = PortLayout.from_dict(paths["layout"])
        allowed = {f: {nic} for f, nic in first.items()}
        chosen = assign(groups, workers, options, allowed, sender)
        tries = {
            f: pinned_forwarded_tries(layout, c, description, sender[f])
            if f in sender
            else [layout.source_port(c.value, j) for j in range(CANDIDATES)]
            for f, c in chosen.items()
        }
        nics = kernel_nics(executor, description, workers, tries, dst_ports, sender)
    ports = pick_ports(chosen, tries, nics, taken)
    return Pinning(ports, chosen, sorted(f for f in flows if f not in ports))


def forwarded_tries(
    description: FabricDescription, groups: Iterable[Iterable[Flow]], sender: Mapping[Flow, str]
) -> dict[Flow, list[int]]:
    """Candidate source ports of the forwarded flows (``sender``) where the switches do
    not read the port: CANDIDATES of each of the mate's NIC port ranges, so that the kernel
    answers for every NIC port; a source rank's k-th forwarded flow takes the k-th block of
    each range (no two flows of a rank share a candidate)."""
    tries: dict[Flow, list[int]] = {}
    per_rank: Counter[int] = Counter()
    for flows in groups:
        for flow in flows:
            if flow in tries or flow not in sender:
                continue
            ranges = forwarding_ranges(len(description.addresses[sender[flow]].nics))
            if not ranges:  # one NIC port at the mate: any port will do (own_ranges)
                continue
            start = per_rank[flow[0]] * CANDIDATES
            ports = [p for low, high in ranges for p in range(low + start, low + start + CANDIDATES)
                     if p <= high]  # fmt: skip
            if not ports:
                raise EmulationError(
                    f"rank {flow[0]} forwards more connections through a server-mate than "
                    f"its NIC ranges hold source ports for ({CANDIDATES} tried for each)"
                )
            tries[flow] = ports
            per_rank[flow[0]] += 1
    return tries


def pinned_forwarded_tries(
    layout: PortLayout, chosen: Candidate, description: FabricDescription, mate: str
) -> list[int]:
    """Candidate source ports of a forwarded flow under path-pinned: ports whose bits select
    ``chosen``'s path and that lie in the range of its NIC port at ``mate`` (every port of
    the layout where the mate has a single NIC port, which needs no range)."""
    nics = sorted(n.port for n in description.addresses[mate].nics)
    ranges = forwarding_ranges(len(nics))
    if not ranges:
        return [layout.source_port(chosen.value, j) for j in range(CANDIDATES)]
    low, high = ranges[nics.index(chosen.nic)]
    step = 1 << layout.bits
    first = max(0, -(-(low - layout.source_port(chosen.value, 0)) // step))
    ports = [layout.source_port(chosen.value, first + j) for j in range(CANDIDATES)]
    return [p for p in ports if p <= high]


def senders(
    description: FabricDescription, workers: Sequence[WorkerSpec], flows: Iterable[Flow]
) -> dict[Flow, str]:
    """The flows that leave by another GPU's NIC than their source's, with that GPU:
    on a fabric whose GPUs forward between rails, the source's server-mate on the
    destination's rail (``Fabric.wire_source``); empty elsewhere."""
    fabric = description.fabric
    if not fabric.gpu_forwarding:
        return {}
    host = {w.rank: w.host for w in workers}
    out = {}
    for flow in flows:
        wire = fabric.wire_source(host[flow[0]], host[flow[1]])
        if wire != host[flow[0]]:
            out[flow] = wire
    return out


def nic_peers(description: FabricDescription) -> dict[tuple[str, int], str]:
    """(GPU, NIC port) -> the ToR at the other end, for every GPU of the fabric (a flow may
    leave by a rail-only mate that runs no rank)."""
    return {(gpu, n.port): n.peer for gpu, a in description.addresses.items() for n in a.nics}


def balance_nics(
    groups: Sequence[Sequence[Flow]],
    workers: Sequence[WorkerSpec],
    description: FabricDescription,
    live: Mapping[Flow, Collection[int]],
    sender: Mapping[Flow, str] | None = None,
) -> dict[Flow, int]:
    """``balanced``: a NIC port per flow, among its ``live`` ones, per collective (flows
    placed by an earlier one count): the one with the fewest of the collective's flows of
    the same rank so far, then the one whose ToR carries the fewest of them (so that the
    ranks behind one ToR pair do not all take the same ToR), then the lowest port.
    ``sender``: per flow, the GPU whose NIC ports it leaves by, where not its source
    (:func:`senders`)."""
    tor = nic_peers(description)
    host = {w.rank: w.host for w in workers}
    by = sender or {}
    chosen: dict[Flow, int] = {}
    for flows in groups:
        per_port: Counter[tuple[str, int]] = Counter()
        per_tor: Counter[str] = Counter()
        for flow in flows:
            if flow in chosen:
                gpu = by.get(flow, host[flow[0]])
                per_port[(gpu, chosen[flow])] += 1
                per_tor[tor[(gpu, chosen[flow])]] += 1
        for flow in flows:
            if flow in chosen or not live.get(flow):
                continue
            gpu = by.get(flow, host[flow[0]])
            nic = min(live[flow], key=lambda n: (per_port[(gpu, n)], per_tor[tor[(gpu, n)]], n))
            chosen[flow] = nic
            per_port[(gpu, nic)] += 1
            per_tor[tor[(gpu, nic)]] += 1
    return chosen


def probe_nics(
    executor: CommandExecutor,
    description: FabricDescription,
    workers: Sequence[WorkerSpec],
    flows: Sequence[Flow],
    dst_ports: Mapping[Flow, int],
    rng: random.Random | None = None,
    sender: Mapping[Flow, str] | None = None,
) -> dict[Flow, int]:
    """``hash`` under path-pinned: per flow, the NIC port the kernel's hash gives one random
    port of the ephemeral range (what the flow would get from an ephemeral port); asked of
    the GPU it leaves by (``sender``, where not its source)."""
    rng = rng or random.Random()
    probes = {f: [rng.randint(*EPHEMERAL)] for f in flows}
    nics = kernel_nics(executor, description, workers, probes, dst_ports, sender)
    return {f: nic for f, (nic,) in nics.items() if nic is not None}


def source_ports(
    executor: CommandExecutor,
    description: FabricDescription,
    workers: Sequence[WorkerSpec],
    channels: int,
    dst_port: int,
    collectives: Iterable[tuple[str, str]] | None = None,
    *,
    host_ports: str,
    paths: Mapping[str, Any] | None = None,
    taken: Mapping[int, Collection[int]] | None = None,
) -> Pinning:
    """:func:`plan_ports` for ``workers`` running ``collectives`` (default: every collective
    algorithm the workers know) with ``channels`` connections per peer, to the workers'
    listening port ``dst_port``."""
    if collectives is None:
        collectives = [(op, alg) for op, algs in COLLECTIVES.items() for alg in algs]
    groups = fabric_flows(workers, collectives, channels)
    return plan_ports(
        executor,
        description,
        workers,
        groups,
        dst_port,
        host_ports=host_ports,
        paths=paths,
        taken=taken,
    )
