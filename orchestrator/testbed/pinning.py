"""Source ports for ``path-pinned``: every connection of a collective on a path of its own.

The controller's ``path-pinned`` policy publishes, per (src GPU, dst GPU), the paths a TCP
source port can select inside the fabric (``paths.json`` in the run directory; format and
bit layout in controllers/pinning.py): the port's low bits choose the next hop at each
switch. The first hop, which of the GPU's NIC ports a connection leaves by, is the
host's: the kernel's multipath hash over the five-tuple (hostconfig: policy 1, L4). The
controller cannot predict it, but the host can be asked: ``ip route get DST from SRC
ipproto tcp sport P dport Q`` inside the GPU's namespace names the device the kernel picks
for exactly that five-tuple (the same hash a connection bound to P uses; its seed stays
fixed while the namespace lives). So the orchestrator pins both:

1. flows: the fabric connections (src rank, dst rank, channel) the collectives open, in
   the order of the collectives (peers on one server talk over NVLink: not pinned);
2. assignment, per collective (its flows run together): greedily, each flow takes the
   (NIC port, path value) whose links (first hop included) are least loaded by the
   collective's flows placed so far: most loaded link first, then total load, then the
   smallest value;
3. ports: for each flow, candidate ports ``base + j * 2**bits + value`` (j = 0, 1, ...),
   one ``ip -batch`` of ``route get`` per GPU namespace, the first candidate whose device
   is the chosen NIC's (each candidate matches with probability 1/ports, so 32 candidates
   miss with probability 2**-32 on a dual-port NIC).

A connection whose port could not be found, or between GPUs for which the controller
published no path, keeps an ephemeral port (the kernel's choice, its path left to hashing)
and is counted in :attr:`Pinning.unpinned`; ``astral run`` reports the count per
configuration.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.pinning import PortLayout, read_paths
from orchestrator.collectives.ceilings import layout_of
from orchestrator.collectives.plans import COLLECTIVES, default_registry, element_count
from orchestrator.emulation.executor import CommandExecutor
from orchestrator.worker.spec import WorkerSpec
from topologies.description import FabricDescription
from topologies.errors import EmulationError

PATHS_FILE = "paths.json"
PATHS_TIMEOUT = 30.0
CANDIDATES = 32  # source ports tried per flow (see the module docstring)
PLAN_SIZE = 1 << 16  # any size: which peers a plan talks to does not depend on it

Flow = tuple[int, int, int]  # (src rank, dst rank, channel)
Link = tuple[str, str]


@dataclass(frozen=True)
class Candidate:
    value: int
    nic: int  # the source GPU's NIC port (model port number)
    nodes: tuple[str, ...]  # src GPU, switches..., dst GPU

    def links(self) -> list[Link]:
        return list(zip(self.nodes, self.nodes[1:], strict=False))


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
            Candidate(int(p["value"]), int(p["nic"]), (src, *(names[i] for i in p["hops"]), dst))
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
    paths: Mapping[tuple[str, str], Sequence[Candidate]],
) -> dict[Flow, Candidate]:
    """Step 2 of the module docstring: a (NIC, value) per flow, balanced per collective."""
    host = {w.rank: w.host for w in workers}
    chosen: dict[Flow, Candidate] = {}
    for flows in groups:
        load: Counter[Link] = Counter()
        for flow in flows:  # flows of this collective placed by an earlier one
            if flow in chosen:
                load.update(chosen[flow].links())
        for flow in flows:
            if flow in chosen:
                continue
            options = paths.get((host[flow[0]], host[flow[1]]), ())
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


def route_devices(
    executor: CommandExecutor, gpu: str, queries: Sequence[tuple[str, str, int, int]]
) -> list[str | None]:
    """The device the kernel of ``gpu`` picks for each (src ip, dst ip, sport, dport)."""
    lines = [
        f"route get {dst} from {src} ipproto tcp sport {sport} dport {dport}"
        for src, dst, sport, dport in queries
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


def source_ports(
    executor: CommandExecutor,
    description: FabricDescription,
    paths_file: Path,
    workers: Sequence[WorkerSpec],
    channels: int,
    dst_port: int,
    collectives: Iterable[tuple[str, str]] | None = None,
    since: float = 0.0,
    taken: Mapping[int, set[int]] | None = None,
    *,
    policy: str,
) -> Pinning:
    """Steps 1-3 of the module docstring for ``workers`` running ``collectives`` (default:
    every collective algorithm the workers know) under ``policy``, whose paths file it
    reads. ``taken``: source ports already in use, per rank, not to hand out again."""
    if collectives is None:
        collectives = [(op, alg) for op, algs in COLLECTIVES.items() for alg in algs]
    document = wait_for_paths(paths_file, since, policy=policy)
    layout = PortLayout.from_dict(document["layout"])
    paths = candidates(document)
    groups = fabric_flows(workers, collectives, channels)
    chosen = assign(groups, workers, paths)
    by_rank = {w.rank: w for w in workers}
    result = Pinning(chosen=chosen)
    per_gpu: dict[str, list[tuple[Flow, int]]] = {}
    for flow, candidate in chosen.items():
        gpu = by_rank[flow[0]].host
        per_gpu.setdefault(gpu, []).extend(
            (flow, layout.source_port(candidate.value, j)) for j in range(CANDIDATES)
        )
    for gpu, tries in per_gpu.items():
        queries = [
            (by_rank[f[0]].fabric_ip, by_rank[f[1]].fabric_ip, port, dst_port) for f, port in tries
        ]
        devices = route_devices(executor, gpu, queries)
        nic_of = {nic.intf: nic.port for nic in description.addresses[gpu].nics}
        rank = tries[0][0][0]
        used: set[int] = set((taken or {}).get(rank, set()))
        for (flow, port), device in zip(tries, devices, strict=True):
            if flow in result.ports or port in used:
                continue
            if device is not None and nic_of.get(device) == chosen[flow].nic:
                result.ports[flow] = port
                used.add(port)
    flows = {flow for group in groups for flow in group}  # a flow without paths too
    result.unpinned = sorted(f for f in flows if f not in result.ports)
    return result
