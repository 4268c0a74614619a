"""The paths a run's connections took, read back from its bundle to forecast with.

Under ECMP a connection's path is Open vSwitch's hash of its five-tuple, which the model
computes (controllers/ovshash.py), but on a GPU with two NIC ports or more the source port
the run will use is its kernel's choice, so the forecast draws salts for it
(orchestrator/forecast/paths.py). A run has no such doubt: right after each batch it
traced every fabric connection through the switches and kept the path in its bundle
(``connection_paths``, joined with ``connections`` and ``configurations``:
orchestrator/results/store.py; how each ``source`` arises: docs/monitoring.md, "Paths").
``astral forecast EXP --paths BUNDLE`` forecasts with those paths instead of drawing them.

What is taken, and what is not:

- a connection's path is used only when it is complete, GPU to GPU: every hop ``traced``
  (as the switches forward it) or ``pinned`` (the controller's published path, which the
  trace confirmed), from its source rank's GPU to its destination rank's over links of
  the fabric, none of them a link the forecast takes down (``--fail``). A
  ``trace-dropped``, ``trace-unknown`` or ``first-hop`` path stops short of the
  destination, and a connection the bundle has no path for was not traced at all: each
  is left to the policy's own routing and counted by that reason (:class:`Coverage`),
  never filled in by a guess;
- NVLink connections are (source GPU, the server's NVLink switch, destination GPU), as the
  model routes them (:meth:`ConfigurationModel._path`);
- per (policy, collective, algorithm), the configuration of the size forecast where the
  bundle ran it, else the one of another size with the most complete paths: a
  collective opens the same connections at every size, on the same source ports.

The paths mean something only on the fabric and the placement they were taken on: a
bundle whose fabric has other GPUs or links, or whose ranks ran on other GPUs, is a
:class:`~topologies.errors.ConfigError` that names the bundle and the difference. Link
rates may differ (a what-if on rates keeps the paths); :attr:`RecordedPaths.rates` says
how, for the command to print.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.forecast.paths import Lane, Routed
from orchestrator.results.store import Configuration, PathHop, ResultsBundle, StoredConnection
from orchestrator.testbed.pinning import Flow
from orchestrator.worker.spec import WorkerSpec
from topologies.description import FabricDescription
from topologies.errors import ConfigError, ResultsError
from topologies.model import Fabric, Link

#: ``connection_paths.source`` values of a whole path (orchestrator/monitor/record.py)
COMPLETE = frozenset({"traced", "pinned"})
#: why a connection the model opens has no recorded path (besides its path's source)
NOT_RECORDED = "not recorded"
NOT_GPU_TO_GPU = "not GPU to GPU"
OFF_FABRIC = "off the fabric's links"
OVER_FAILED = "over a failed link"

Key = tuple[str, str, str]  # (policy, collective, algorithm)


@dataclass(frozen=True)
class RecordedConfiguration:
    """One configuration of the bundle: the complete paths of its connections (``routed``,
    with the source ports they had) and, per connection whose path is not usable, why."""

    id: int
    size: int
    routed: Routed
    unusable: dict[Flow, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Coverage:
    """How many of a collective's fabric connections a forecast takes from the bundle, and
    why the rest fall back to the policy's routing (reason -> count)."""

    bundle: Path
    recorded: int
    connections: int
    fallbacks: Mapping[str, int]
    config_id: int | None = None

    def header(self) -> str:
        """The line a forecast table carries under its title."""
        if self.config_id is None:
            return (
                f"paths: routed by the policy ({self.bundle} recorded no configuration of it, "
                f"{self.connections} connections)"
            )
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(self.fallbacks.items()))
        rest = f"; the rest routed by the policy ({why})" if why else ""
        return (
            f"paths: recorded in {self.bundle}, {self.recorded} of {self.connections} "
            f"connections{rest}"
        )

    def record(self) -> dict[str, object]:
        return {
            "bundle": str(self.bundle),
            "configuration": self.config_id,
            "recorded": self.recorded,
            "connections": self.connections,
            "fallbacks": dict(sorted(self.fallbacks.items())),
        }


class RecordedPaths:
    """A bundle's recorded paths per (policy, collective, algorithm), checked to belong to
    the experiment's fabric and placement."""

    def __init__(
        self,
        bundle: Path,
        configurations: Mapping[Key, list[RecordedConfiguration]],
        rates: str = "",
    ) -> None:
        self.bundle = bundle
        self.configurations = dict(configurations)
        #: how the bundle's link rates differ from the experiment's ('' where they do not)
        self.rates = rates

    @classmethod
    def read(
        cls,
        bundle: str | Path,
        description: FabricDescription,
        workers: Sequence[WorkerSpec],
        failed: Iterable[Link] = (),
    ) -> RecordedPaths:
        """The paths of ``bundle`` for a forecast of ``workers`` on ``description`` (with
        ``failed`` down). A foreign fabric or placement is a ConfigError; a bundle that
        cannot be read, a ResultsError."""
        path = Path(bundle)
        with ResultsBundle.open(path) as opened:
            try:
                theirs = FabricDescription.from_dict(opened.fabric)
            except (ValueError, KeyError, TypeError) as err:
                raise ResultsError(path, "a fabric description it can read", err) from None
            difference = fabric_difference(description.fabric, theirs.fabric)
            if difference:
                raise ConfigError(
                    f"--paths {path}",
                    "fabric",
                    f"the experiment's fabric ({description.fabric.name}: the same GPUs and "
                    "links), since its paths were taken there",
                    detail=difference,
                )
            configurations = opened.configurations()
            connections = opened.connections()
            hops = opened.paths()
        if not any(c.src_rank is not None for c in connections):
            raise ConfigError(
                f"--paths {path}",
                "connection_paths",
                "a bundle that recorded its connections and their paths (results schema 3)",
                "none",
            )
        _check_placement(path, description, workers, connections, configurations)
        host = {w.rank: w.host for w in workers}
        links = _directed(description.fabric.links)
        down = _directed(failed)
        by_config: dict[int, list[StoredConnection]] = {}
        for c in connections:
            by_config.setdefault(c.config_id, []).append(c)
        out: dict[Key, list[RecordedConfiguration]] = {}
        for config in configurations:
            recorded = _configuration(
                config.id, config.size, by_config.get(config.id, []), hops, host,
                description.fabric, links, down,
            )  # fmt: skip
            out.setdefault((config.policy, config.collective, config.algorithm), []).append(
                recorded
            )
        return cls(path, out, rate_difference(description.fabric, theirs.fabric))

    def choose(self, key: Key, size: int) -> RecordedConfiguration | None:
        """The configuration whose paths a forecast of ``key`` at ``size`` takes: the one
        of that size, else the one with the most complete paths (the first among equals)."""
        candidates = self.configurations.get(key, [])
        for c in candidates:
            if c.size == size:
                return c
        return max(candidates, key=lambda c: (len(c.routed.paths), -c.id), default=None)

    def routes(self, size: int) -> dict[Key, Routed]:
        """Per (policy, collective, algorithm), the recorded paths a forecast at ``size``
        takes (what :class:`~orchestrator.forecast.model.ConfigurationModel` overrides its
        routing with)."""
        out = {}
        for key in self.configurations:
            chosen = self.choose(key, size)
            if chosen is not None:
                out[key] = chosen.routed
        return out

    def coverage(self, key: Key, size: int, flows: Iterable[Flow]) -> Coverage:
        """How many of ``flows`` (the fabric connections the model opens for ``key``) take
        a recorded path at ``size``, and why the others do not."""
        wanted = list(dict.fromkeys(flows))
        chosen = self.choose(key, size)
        if chosen is None:
            return Coverage(self.bundle, 0, len(wanted), {NOT_RECORDED: len(wanted)})
        fallbacks: Counter[str] = Counter()
        recorded = 0
        for flow in wanted:
            if flow in chosen.routed.paths:
                recorded += 1
            else:
                fallbacks[chosen.unusable.get(flow, NOT_RECORDED)] += 1
        return Coverage(self.bundle, recorded, len(wanted), dict(fallbacks), chosen.id)


def _configuration(
    config_id: int,
    size: int,
    connections: Sequence[StoredConnection],
    hops: Mapping[int, list[PathHop]],
    host: Mapping[int, str],
    fabric: Fabric,
    links: set[tuple[str, str]],
    down: set[tuple[str, str]],
) -> RecordedConfiguration:
    """One configuration's usable paths. Both ends of a connection have a row; its path
    hangs off the sender's."""
    ends: dict[Flow, list[StoredConnection]] = {}
    for c in connections:
        if c.src_rank is None or c.dst_rank is None or c.channel is None:
            continue
        ends.setdefault((c.src_rank, c.dst_rank, c.channel), []).append(c)
    routed = Routed()
    unusable: dict[Flow, str] = {}
    for flow, rows in ends.items():
        src, dst = host.get(flow[0]), host.get(flow[1])
        if src is None or dst is None:
            continue
        if rows[0].link == "nvlink":
            if fabric.gpus[src].server == fabric.gpus[dst].server:
                nvswitch = fabric.servers[fabric.gpus[src].server].nvswitch
                routed.paths[flow] = (src, nvswitch, dst)
            continue
        path = next((hops[r.id] for r in rows if r.id in hops), None)
        # a rail-only mate's forwarding is recorded from the mate's NIC on
        wire = fabric.wire_source(src, dst)
        why = NOT_RECORDED if path is None else _unusable(path, wire, dst, links, down)
        if why:
            unusable[flow] = why
            continue
        assert path is not None
        nodes = tuple(h.node for h in path)
        if wire != src:
            nodes = (src, fabric.servers[fabric.gpus[src].server].nvswitch, *nodes)
        routed.paths[flow] = nodes
        routed.source_ports[flow] = rows[0].five_tuple.src_port
        lanes = _lanes(fabric, path)
        if lanes:
            routed.lanes[flow] = lanes
    return RecordedConfiguration(config_id, size, routed, unusable)


def _lanes(fabric: Fabric, path: Sequence[PathHop]) -> tuple[Lane, ...]:
    """The links of ``path`` that have parallel twins, each with the port the path left
    its node by (the forecast shares that one alone: orchestrator/forecast/model.py)."""
    out = []
    for hop, after in itertools.pairwise(path):
        if hop.out_port is None:
            continue
        if len(fabric.links_between(hop.node, after.node)) > 1:
            out.append((hop.node, after.node, hop.out_port))
    return tuple(out)


def _unusable(
    path: Sequence[PathHop],
    src: str,
    dst: str,
    links: set[tuple[str, str]],
    down: set[tuple[str, str]],
) -> str:
    """Why ``path`` cannot stand for a connection from ``src`` to ``dst`` ('' if it can)."""
    partial = sorted({h.source for h in path} - COMPLETE)
    if partial:
        return partial[0]
    nodes = [h.node for h in path]
    if len(nodes) < 2 or nodes[0] != src or nodes[-1] != dst:
        return NOT_GPU_TO_GPU
    pairs = set(itertools.pairwise(nodes))
    if pairs - links:
        return OFF_FABRIC
    if pairs & down:
        return OVER_FAILED
    return ""


def _directed(links: Iterable[Link]) -> set[tuple[str, str]]:
    return {pair for x in links for pair in ((x.a, x.b), (x.b, x.a))}


def fabric_difference(ours: Fabric, theirs: Fabric) -> str:
    """What makes ``theirs`` (a bundle's) another fabric than ``ours`` (the experiment's):
    its GPUs or its links (ends and ports, not rates); '' when they are the same."""
    counts = (
        f"the bundle's {theirs.name} has {len(theirs.gpus)} GPUs and {len(theirs.links)} "
        f"links, the experiment's {ours.name} {len(ours.gpus)} and {len(ours.links)}"
    )
    only_ours, only_theirs = (
        sorted(set(ours.gpus) - set(theirs.gpus)),
        sorted(set(theirs.gpus) - set(ours.gpus)),
    )
    if only_ours:
        return f"{counts}; GPU {only_ours[0]} is not in the bundle's"
    if only_theirs:
        return f"{counts}; GPU {only_theirs[0]} is not in the experiment's"
    mine, yours = _link_set(ours.links), _link_set(theirs.links)
    if mine != yours:
        missing = sorted(mine - yours)
        extra = sorted(yours - mine)
        if missing:
            return f"{counts}; link {_link_text(missing[0])} is not in the bundle's"
        return f"{counts}; link {_link_text(extra[0])} is not in the experiment's"
    return ""


def rate_difference(ours: Fabric, theirs: Fabric) -> str:
    """How many of the (same) links run at another rate in ``theirs``, the first named
    ('' when none): the paths still apply, the times they were measured at do not."""
    rate = {_ends(x): x.capacity for x in theirs.links}
    other = [x for x in ours.links if rate.get(_ends(x), x.capacity) != x.capacity]
    if not other:
        return ""
    x = other[0]
    return (
        f"{len(other)} of its {len(ours.links)} links at other rates than the experiment's "
        f"{ours.name} (e.g. {x.a}-{x.b}: {rate[_ends(x)] / 1e9:g} Gbit/s, here "
        f"{x.capacity / 1e9:g})"
    )


LinkEnds = tuple[tuple[str, int], tuple[str, int], str]


def _ends(x: Link) -> LinkEnds:
    a, b = sorted([(x.a, x.a_port), (x.b, x.b_port)])
    return (a, b, x.kind.value)


def _link_set(links: Iterable[Link]) -> set[LinkEnds]:
    return {_ends(x) for x in links}


def _link_text(link: LinkEnds) -> str:
    (a, a_port), (b, b_port), kind = link
    return f"{a}:{a_port}-{b}:{b_port} ({kind})"


def _check_placement(
    bundle: Path,
    description: FabricDescription,
    workers: Sequence[WorkerSpec],
    connections: Sequence[StoredConnection],
    configurations: Sequence[Configuration],
) -> None:
    """The ranks played the same GPUs in the bundle as in the experiment: each connection's
    addresses name the GPUs its two ranks ran on."""
    gpu_of: dict[str, str] = {}
    for name, a in description.addresses.items():
        for ip in (a.fabric_ip, a.nvlink.ip, *(n.ip for n in a.nics)):
            gpu_of[ip] = name
    played: dict[int, str] = {}
    for c in connections:
        for rank, ip in ((c.src_rank, c.five_tuple.src_ip), (c.dst_rank, c.five_tuple.dst_ip)):
            if rank is not None and ip in gpu_of:
                played.setdefault(rank, gpu_of[ip])
    ranks = {c.ranks for c in configurations}
    if ranks - {len(workers)}:
        raise ConfigError(
            f"--paths {bundle}",
            "placement",
            f"the experiment's {len(workers)} ranks, since its paths were taken between them",
            f"{sorted(ranks)[0]} ranks",
        )
    for w in workers:
        if played.get(w.rank, w.host) != w.host:
            raise ConfigError(
                f"--paths {bundle}",
                "placement",
                f"rank {w.rank} on {w.host}, as the experiment places it",
                f"rank {w.rank} on {played[w.rank]}",
            )
