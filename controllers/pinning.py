"""Path pinning by source port: the bit layout, the paths it yields, and path assignment.

Pure Python over the fabric description (no os-ken): the ``path-pinned`` policy renders its
rules from it, the controller publishes the paths file from it, and the orchestrator
imports it to choose the source port of every connection of a collective.

How a source port picks a path (HPN/RePaC-style, but with rules instead of hash linearity):
at a switch with ``k`` equal-cost next hops towards a destination GPU, ``2**w`` entries
(``w = ceil(log2 k)``) match ``ipv4_dst`` plus a ``w``-bit field of ``tcp_src`` and send
the packet to next hop ``field % k`` (hops in port order). Which bits a switch looks at
depends on its *distance* to the destination (hops to the GPU): along any path the distance
drops by one per hop, so every switch on a path reads a different bit field, and the
choices of the tiers are independent (no polarization). Rules grow with destinations x
next hops, never with flows::

    tcp_src = base + j * 2**bits + value      value = sum(choice_d << shift_d)
                                              choice_d: the next-hop index at distance d

    astral-small: distance 5 (src ToR -> agg) 1 bit, 4 (agg -> core) 1 bit,
                  3 (core -> agg) 0 bits, 2 (agg -> dst ToR) 1 bit, 1 (ToR -> GPU) 0 bits

The layout is computed on the intact fabric and kept when links fail (a port keeps its
meaning; where a failure leaves fewer hops, ``field % k`` picks among the survivors).

The first hop, GPU -> ToR, is the host's choice (dual-ToR: the kernel's multipath hash over
the two NIC ports), which the controller cannot predict. Pinning is therefore *inside the
fabric*: the paths file lists the path for each NIC port, and :func:`assign_paths` picks
values whose paths are link-disjoint whichever NIC port the kernel takes (the two ToRs of a
pair reach the same aggregation switches, so from there on the paths coincide). The hosts
can pick the first hop themselves, by a source port the kernel's hash sends out of the NIC
port they want: that is the orchestrator's ``host_ports`` setting, not the controller's
(orchestrator/testbed/hostports.py; the workers do not bind to a device).

Paths file (``python -m controllers --paths FILE``; default ``paths.json`` next to the status
file; rewritten atomically whenever the controller re-renders, for example after a failure)::

    {"version": 1, "policy": "path-pinned", "fabric": "astral-small",
     "updated_at": 1732900000.1,
     "failed_links": [["p0r0t0", 3, "p0r0a0", 1]],
     "layout": {"base": 16384, "bits": 3,
                "fields": [{"distance": 2, "shift": 0, "width": 1}, ...]},
     "switches": ["p0r0t0", "p0r0t1", ...],       # index -> name, for "hops" below
     "pairs": [
        {"src": "p0s0g0", "dst": "p1s0g0", "src_ip": "10.0.0.1", "dst_ip": "10.0.1.1",
         "paths": [
            {"value": 0, "nic": 1, "hops": [0, 8, 20, 12, 4],    # switch indexes, in order
             "ports": [3, 5, 2, 1, 3]},  # the port each switch sends it out of
            {"value": 0, "nic": 2, "hops": [1, 8, 20, 12, 4], "ports": [...]},
            {"value": 1, ...}, ...]}, ...]}

``ports`` tells parallel links apart: two switches joined by several links (a generated
fabric can have them) are one hop in ``hops`` and several ports, and the source port
picks one of them as it picks among other next hops.

A source port ``p`` takes path ``value == (p - base) % 2**bits`` (equivalently: ``p``'s bit
fields); ``source_port(value, j) = base + j * 2**bits + value`` gives distinct ports with the
same path. Every port with the same low ``bits`` bits takes the same path, so a port outside
``base..`` works too. Only TCP is pinned; other traffic takes the default route.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controllers.routing import Adjacency, RoutingError, RoutingGraph, programmable_switches
from topologies.description import FabricDescription
from topologies.model import Link

VERSION = 1
PORT_BASE = 16384  # below Linux's ephemeral range (32768-60999): bound ports do not clash
MAX_PORT = 65535

DirectedLink = tuple[str, str]
#: A directed link told apart from its parallel twins (two switches joined by several
#: links, which a generated fabric can have): from, to, and the port it leaves ``from`` by.
Lane = tuple[str, str, int]


@dataclass(frozen=True)
class BitField:
    distance: int
    shift: int
    width: int


@dataclass(frozen=True)
class PortLayout:
    """Which bits of the TCP source port each distance reads (see the module docstring)."""

    fields: tuple[BitField, ...]
    base: int = PORT_BASE

    @property
    def bits(self) -> int:
        return sum(f.width for f in self.fields)

    def field(self, distance: int) -> BitField | None:
        for f in self.fields:
            if f.distance == distance:
                return f
        return None

    def choice(self, port: int, distance: int, count: int) -> int:
        """The next-hop index (of ``count``) a switch at ``distance`` picks for ``port``."""
        f = self.field(distance)
        if f is None or count <= 1:
            return 0
        return ((port >> f.shift) & ((1 << f.width) - 1)) % count

    def value(self, port: int) -> int:
        return port & ((1 << self.bits) - 1)

    def source_port(self, value: int, index: int = 0) -> int:
        """The ``index``-th port (from ``base``) whose bits are ``value``."""
        if not 0 <= value < 1 << self.bits:
            raise ValueError(f"value {value} does not fit in {self.bits} bits")
        base = self.base - self.base % (1 << self.bits)
        port = base + index * (1 << self.bits) + value
        if port > MAX_PORT:
            raise ValueError(f"no source port left for value {value} (index {index})")
        return port

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base - self.base % (1 << self.bits),
            "bits": self.bits,
            "fields": [
                {"distance": f.distance, "shift": f.shift, "width": f.width} for f in self.fields
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PortLayout:
        fields = tuple(BitField(f["distance"], f["shift"], f["width"]) for f in data["fields"])
        return cls(fields, int(data["base"]))


def port_layout(description: FabricDescription, base: int = PORT_BASE) -> PortLayout:
    """The layout for ``description``'s intact fabric: per distance, enough bits for the
    most next hops any switch at that distance from any GPU has; low bits for small
    distances.
    """
    graph = RoutingGraph(description.fabric)
    widest: Counter[int] = Counter()
    for gpu in description.fabric.gpus:
        dist = graph.distances_to(gpu)
        for switch, d in dist.items():
            if switch in graph.switches:
                widest[d] = max(widest[d], len(graph.next_hops(switch, gpu, dist)))
    fields = []
    shift = 0
    for distance in sorted(widest):
        width = math.ceil(math.log2(widest[distance])) if widest[distance] > 1 else 0
        if width:
            fields.append(BitField(distance, shift, width))
            shift += width
    if shift > 14:
        raise ValueError(f"the fabric needs {shift} source-port bits for pinning; at most 14")
    return PortLayout(tuple(fields), base)


class PinnedPaths:
    """The paths the path-pinned rules give, computed from the layout (not by walking flow
    tables), for the fabric with ``failed_links`` down.
    """

    def __init__(
        self,
        description: FabricDescription,
        failed_links: Iterable[Link] = (),
        layout: PortLayout | None = None,
    ) -> None:
        self.description = description
        self.graph = RoutingGraph(description.fabric, failed_links)
        self.layout = layout or port_layout(description)
        self._dist: dict[str, dict[str, int]] = {}
        self._next: dict[tuple[str, str], list[Adjacency]] = {}

    def distances(self, gpu: str) -> dict[str, int]:
        if gpu not in self._dist:
            self._dist[gpu] = self.graph.distances_to(gpu)
        return self._dist[gpu]

    def hops(self, node: str, dst: str) -> list[str]:
        """The next hops (neighbour names, in port order) of ``node`` towards ``dst``; a
        neighbour joined by parallel links is listed once per link."""
        return [h.neighbor for h in self.next_links(node, dst)]

    def next_links(self, node: str, dst: str) -> list[Adjacency]:
        """The links out of ``node`` on a shortest path to ``dst``, in port order."""
        key = (node, dst)
        if key not in self._next:
            self._next[key] = self.graph.next_hops(node, dst, self.distances(dst))
        return self._next[key]

    def nic_ports(self, gpu: str) -> list[int]:
        """The GPU's NIC ports whose link is up."""
        up = []
        for nic in self.description.addresses[gpu].nics:
            if any(adj.port == nic.port for adj in self.graph.neighbors(gpu)):
                up.append(nic.port)
        return up

    def path(self, src: str, dst: str, nic_port: int, src_port: int) -> list[str]:
        """The nodes a TCP packet from ``src`` (leaving by ``nic_port``) to ``dst`` with
        source port ``src_port`` visits: ``[src, ToR, ..., dst]``.
        """
        return [src, *(lane[1] for lane in self.lanes(src, dst, nic_port, src_port))]

    def lanes(self, src: str, dst: str, nic_port: int, src_port: int) -> list[Lane]:
        """The links of :meth:`path`, each with the port it leaves its node by: where two
        switches are joined by parallel links, the source port picks one of them as it
        picks among other next hops."""
        first = next((adj for adj in self.graph.neighbors(src) if adj.port == nic_port), None)
        if first is None:
            raise RoutingError(f"{src} port {nic_port} has no live link")
        dist = self.distances(dst)
        lanes = [(src, first.neighbor, nic_port)]
        node = first.neighbor
        while node != dst:
            hops = self.next_links(node, dst)
            if not hops:
                path = [src, *(lane[1] for lane in lanes)]
                raise RoutingError(f"{node} cannot reach {dst} (path {path})")
            hop = hops[self.layout.choice(src_port, dist[node], len(hops))]
            lanes.append((node, hop.neighbor, hop.port))
            node = hop.neighbor
        return lanes

    def paths(self, src: str, dst: str, nic_port: int) -> list[tuple[int, list[str]]]:
        """Every distinct path from ``src`` by ``nic_port`` to ``dst``, with the smallest
        value (see :class:`PortLayout`) that takes it, by value.
        """
        first = next((adj for adj in self.graph.neighbors(src) if adj.port == nic_port), None)
        if first is None:
            return []
        dist = self.distances(dst)
        found = []
        stack: list[tuple[int, list[str]]] = [(0, [src, first.neighbor])]
        while stack:
            value, path = stack.pop()
            node = path[-1]
            if node == dst:
                found.append((value, path))
                continue
            if node not in dist:  # no way on to dst from here (another rail, rail-only)
                continue
            hops = self.hops(node, dst)
            f = self.layout.field(dist[node])
            if f is None or len(hops) <= 1:
                if hops:
                    stack.append((value, [*path, hops[0]]))
                continue
            for index, hop in enumerate(hops):
                stack.append((value | index << f.shift, [*path, hop]))
        return sorted(found)

    def values(self, src: str, dst: str) -> list[int]:
        """The values that give distinct paths from ``src`` to ``dst`` (any NIC port)."""
        return sorted({v for nic in self.nic_ports(src) for v, _ in self.paths(src, dst, nic)})


def directed_links(path: Sequence[str]) -> list[DirectedLink]:
    return list(itertools.pairwise(path))


@dataclass(frozen=True)
class Assignment:
    """The path chosen for one flow: its value, source port and path per NIC port."""

    src: str
    dst: str
    value: int
    source_port: int
    paths: Mapping[int, tuple[str, ...]]  # NIC port -> nodes

    #: the links of those paths told apart from their parallel twins (:data:`Lane`)
    lanes: frozenset[Lane] = frozenset()

    def links(self) -> set[DirectedLink]:
        """The directed links of the flow's paths for every NIC port the host may take."""
        return {x for p in self.paths.values() for x in directed_links(p)}


def assign_paths(
    pinned: PinnedPaths, flows: Sequence[tuple[str, str]], taken: Iterable[int] = ()
) -> list[Assignment]:
    """A path and source port for each (src GPU, dst GPU) flow, in order, link-disjoint
    where the fabric allows: greedy, each flow takes the value whose paths' most loaded
    link is least loaded (then the smallest total load, then the smallest value). A flow's
    links are those of its paths for *every* NIC port of its source (the host picks one),
    parallel links counted apart (:data:`Lane`): two values that differ only in which of
    two parallel links they take are different paths, and the load is spread over both.

    Repeated (src, dst) flows (several connections) get distinct source ports; ``taken``
    lists source ports not to hand out. Deterministic.
    """
    load: Counter[Lane] = Counter()
    used = set(taken)
    result = []
    for src, dst in flows:
        best: tuple[tuple[int, int, int], int, frozenset[Lane]] | None = None
        for value in pinned.values(src, dst):
            lanes = frozenset(
                x for nic in pinned.nic_ports(src) for x in pinned.lanes(src, dst, nic, value)
            )
            cost = (max((load[x] for x in lanes), default=0), sum(load[x] for x in lanes), value)
            if best is None or cost < best[0]:
                best = (cost, value, lanes)
        if best is None:
            raise RoutingError(f"no path from {src} to {dst}")
        _, value, lanes = best
        index = 0
        while pinned.layout.source_port(value, index) in used:
            index += 1
        port = pinned.layout.source_port(value, index)
        used.add(port)
        variants = {nic: tuple(pinned.path(src, dst, nic, value)) for nic in pinned.nic_ports(src)}
        load.update(lanes)
        result.append(Assignment(src, dst, value, port, variants, lanes))
    return result


# --- the paths file --------------------------------------------------------------------------


def paths_document(pinned: PinnedPaths, policy: str = "path-pinned") -> dict[str, Any]:
    """Every (src, dst) pair's paths, in the paths-file format (module docstring)."""
    description = pinned.description
    fabric = description.fabric
    names = [s.name for s in programmable_switches(fabric)]
    index = {name: i for i, name in enumerate(names)}
    gpus = [g.name for g in fabric.gpus_by_rank()]
    pairs = []
    for src in gpus:
        for dst in gpus:
            if src == dst:
                continue
            paths = []
            for nic in pinned.nic_ports(src):
                try:
                    found = pinned.paths(src, dst, nic)
                except RoutingError:
                    continue
                for value, path in found:
                    hops = [index[n] for n in path[1:-1]]
                    ports = [lane[2] for lane in pinned.lanes(src, dst, nic, value)[1:]]
                    paths.append({"value": value, "nic": nic, "hops": hops, "ports": ports})
            paths.sort(key=lambda p: (p["value"], p["nic"]))
            pairs.append(
                {
                    "src": src,
                    "dst": dst,
                    "src_ip": description.addresses[src].fabric_ip,
                    "dst_ip": description.addresses[dst].fabric_ip,
                    "paths": paths,
                }
            )
    return {
        "version": VERSION,
        "policy": policy,
        "fabric": fabric.name,
        "updated_at": time.time(),
        "failed_links": sorted([x.a, x.a_port, x.b, x.b_port] for x in pinned.graph.failed),
        "layout": pinned.layout.to_dict(),
        "switches": names,
        "pairs": pairs,
    }


def write_json(path: str | Path, document: Mapping[str, Any]) -> None:
    """Replace ``path`` atomically (readers never see half a file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".paths-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            # dumps, not dump: dump streams through the pure-Python encoder (astral-64's
            # 11 MB took 1.7 s; dumps uses the C one)
            out.write(json.dumps(document, separators=(",", ":")))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_paths(path: str | Path) -> dict[str, Any]:
    """A paths file, checked for its version."""
    with open(path, encoding="utf-8") as src:
        data: dict[str, Any] = json.load(src)
    if data.get("version") != VERSION:
        raise ValueError(f"unsupported paths file version {data.get('version')!r}")
    return data
