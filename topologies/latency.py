"""One-way latencies between GPUs: the fabric spec's real-world figures along each path.

The spec's ``latency`` section (:class:`~topologies.fabricspec.LatencySpec`) gives what one
switch, one NIC, one message of the collective library, one NVLink message and one
collective operation cost in the real world. This module adds them up along the path a
message takes, as the alpha of NCCL's alpha-beta cost model (docs/latency.md):

    same server (NVLink)     nvlink
    other server (fabric)    library + nics x nic + switches x switch_hop + nvlinks x nvlink

A fabric message crosses two NICs and the switches of a shortest path (every policy routes
on one, :func:`topologies.properties.routes_from`); on a rail-only fabric a cross-rail
message also crosses its server's NVLink switch to the GPU that forwards it. The emulation
applies every figure divided by the emulation scale, as it divides the bandwidth: a real
5.1 us is 85 ms at scale 0.6e-4.

Pure and computed once: the launch hands each worker its row of :func:`applied_latency`
(emulated seconds per peer), fabric.json and run.json keep :func:`latency_record`, and the
nccl-tests tables print :func:`latency_title` of that record. The routes come from a
:class:`~topologies.routetable.RouteTable`, which finds them per class of interchangeable
GPUs, and :func:`latency_record` counts the pairs of each kind of path by the fabric's
structure rather than pair by pair: ``astral topo show`` sums the 2.7 x 10^11 pairs of a
full-size Astral fabric in about ten seconds, where routing every pair took a minute for
2,048 GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from topologies.fabricspec import LatencySpec
from topologies.model import Fabric
from topologies.properties import Route
from topologies.routetable import RouteTable
from topologies.units import format_duration

NICS_PER_MESSAGE = 2  # the sender's and the receiver's


@dataclass(frozen=True)
class PathLatency:
    """The real one-way latency of a message on one path, and what it is made of."""

    medium: str  # "nvlink" (same server) or "fabric"
    switches: int = 0
    nvlink_hops: int = 0
    seconds: float = 0.0  # real

    @property
    def label(self) -> str:
        """``NVLink``, ``1 switch``, ``5 switches``, ``3 switches + NVLink``."""
        if self.medium == "nvlink":
            return "NVLink"
        text = f"{self.switches} switch" + ("" if self.switches == 1 else "es")
        return text + (" + NVLink" if self.nvlink_hops else "")


def nvlink_latency(spec: LatencySpec) -> PathLatency:
    """A message between two GPUs of one server."""
    return PathLatency("nvlink", nvlink_hops=1, seconds=spec.nvlink)


def fabric_latency(spec: LatencySpec, route: Route) -> PathLatency:
    """A message between GPUs of two servers along ``route``."""
    seconds = (
        spec.library
        + NICS_PER_MESSAGE * spec.nic
        + route.switches * spec.switch_hop
        + route.nvlink_hops * spec.nvlink
    )
    return PathLatency("fabric", route.switches, route.nvlink_hops, seconds)


def pair_latencies(
    fabric: Fabric, gpus: Sequence[str] | None = None
) -> dict[tuple[str, str], PathLatency]:
    """(src, dst) -> PathLatency for every ordered pair of ``gpus`` (default: all GPUs).

    Raises ValueError for a pair of different servers with no path (a fabric that cannot
    connect them would not carry the run either).
    """
    names = _names(fabric, gpus)
    table = RouteTable(fabric)
    spec = fabric.spec.latency
    return {
        (src, dst): _pair_latency(fabric, table, spec, src, dst)
        for src in names
        for dst in names
        if src != dst
    }


def path_census(fabric: Fabric, gpus: Sequence[str] | None = None) -> list[tuple[PathLatency, int]]:
    """Each kind of path among ``gpus`` (default: all GPUs) with its number of ordered
    pairs, by latency, ties in the order of their first pairs (source, then destination,
    in ``gpus``' order): what sorting :func:`pair_latencies` gives, counted by the
    fabric's structure instead of pair by pair (topologies/routetable.py), so that a
    fabric of any size is summed in about the time it takes to build. Raises ValueError
    as :func:`pair_latencies` does."""
    names = _names(fabric, gpus)
    table = RouteTable(fabric)
    spec = fabric.spec.latency
    census = table.census(names)
    if census.unreachable:
        first = _first_pairs(fabric, table, names, {None})
        src, dst = (names[i] for i in first[None])
        raise ValueError(f"no network path from {src} to {dst}")
    kinds: dict[str, list[Any]] = {}  # label -> [path, pairs]
    if census.same_server:
        kinds["NVLink"] = [nvlink_latency(spec), census.same_server]
    for route, pairs in census.routes.items():
        path = fabric_latency(spec, route)
        kinds.setdefault(path.label, [path, 0])[1] += pairs
    seconds = Counter(path.seconds for path, _ in kinds.values())
    tied = {label for label, (path, _) in kinds.items() if seconds[path.seconds] > 1}
    first = _first_pairs(fabric, table, names, tied) if tied else {}
    order = sorted(kinds, key=lambda label: (kinds[label][0].seconds, first.get(label, (0, 0))))
    return [(kinds[label][0], kinds[label][1]) for label in order]


def _names(fabric: Fabric, gpus: Sequence[str] | None) -> list[str]:
    """``gpus`` once each, in order (a pair is counted once), else every GPU by rank."""
    return (
        list(dict.fromkeys(gpus)) if gpus is not None else [g.name for g in fabric.gpus_by_rank()]
    )


def _pair_latency(
    fabric: Fabric, table: RouteTable, spec: LatencySpec, src: str, dst: str
) -> PathLatency:
    if fabric.gpus[src].server == fabric.gpus[dst].server:
        return nvlink_latency(spec)
    route = table.route(src, dst)
    if route is None:
        raise ValueError(f"no network path from {src} to {dst}")
    return fabric_latency(spec, route)


def _first_pairs(
    fabric: Fabric, table: RouteTable, names: Sequence[str], labels: AbstractSet[str | None]
) -> dict[str | None, tuple[int, int]]:
    """Where each of ``labels`` (None: no path) first occurs among the ordered pairs of
    ``names``, as (source, destination) positions. Pair by pair, but only until all are
    found, and only asked where two kinds of path cost the same (or one is missing):
    usually within the first source's pairs."""
    spec = fabric.spec.latency
    found: dict[str | None, tuple[int, int]] = {}
    for i, src in enumerate(names):
        for j, dst in enumerate(names):
            if i == j:
                continue
            try:
                label: str | None = _pair_latency(fabric, table, spec, src, dst).label
            except ValueError:
                label = None
            if label in labels and label not in found:
                found[label] = (i, j)
                if len(found) == len(labels):
                    return found
    return found


@dataclass(frozen=True)
class AppliedLatency:
    """What a launch of ranks on ``gpus`` applies, in emulated seconds (0 when off)."""

    one_way: tuple[tuple[float, ...], ...]  # [sender rank][receiver rank]
    operation: float

    @property
    def enabled(self) -> bool:
        return self.operation > 0 or any(any(row) for row in self.one_way)


def applied_latency(fabric: Fabric, gpus: Sequence[str]) -> AppliedLatency:
    """Rank i plays ``gpus[i]``: the one-way latency from every rank to every other and the
    per-operation latency, divided by the emulation scale; all zero with ``latency: off``."""
    spec, scale = fabric.spec.latency, fabric.spec.emulation.scale
    if not spec.enabled:
        return AppliedLatency(tuple(tuple(0.0 for _ in gpus) for _ in gpus), 0.0)
    pairs = pair_latencies(fabric, gpus)
    one_way = tuple(
        tuple(0.0 if src == dst else pairs[(src, dst)].seconds / scale for dst in gpus)
        for src in gpus
    )
    return AppliedLatency(one_way, spec.operation / scale)


def latency_record(fabric: Fabric, gpus: Sequence[str] | None = None) -> dict[str, Any]:
    """The latencies as fabric.json and run.json keep them: the spec's components, then one
    entry per kind of path among ``gpus`` (default: all) with its number of ordered pairs,
    each real (us) and emulated (ms, = real / scale)."""
    spec, scale = fabric.spec.latency, fabric.spec.emulation.scale
    paths = [
        {
            "path": path.label,
            "pairs": pairs,
            "one_way_real_us": round(path.seconds * 1e6, 6),
            "one_way_emulated_ms": round(path.seconds / scale * 1e3, 6),
        }
        for path, pairs in path_census(fabric, gpus)
    ]
    return {
        "enabled": spec.enabled,
        "scale": scale,
        "components_real_us": {k: round(v * 1e6, 6) for k, v in spec.components().items()},
        "operation": {
            "real_us": round(spec.operation * 1e6, 6),
            "emulated_ms": round(spec.operation / scale * 1e3, 6),
        },
        "paths": paths,
    }


def latency_title(record: Mapping[str, Any] | None) -> str | None:
    """One header line for an nccl-tests table from a :func:`latency_record` (None for a
    bundle written before latencies were modelled)."""
    if not record:
        return None
    if not record.get("enabled"):
        return "latency: off (no real-world latency added; `latency:` in the fabric or experiment)"
    paths = ", ".join(
        f"{p['path']} {_us(p['one_way_real_us'])} -> {_ms(p['one_way_emulated_ms'])}"
        for p in record.get("paths", ())
    )
    operation = record["operation"]
    return (
        f"latency one way, real -> emulated (/ scale): {paths}; "
        f"per operation {_us(operation['real_us'])} -> {_ms(operation['emulated_ms'])}"
    )


def _us(value: float) -> str:
    return format_duration(value * 1e-6)


def _ms(value: float) -> str:
    return format_duration(value * 1e-3)
