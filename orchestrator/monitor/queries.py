"""The two questions the monitor's indexes are for, over a results bundle.

- :func:`link_traffic`: what crossed link L between t0 and t1: per direction, the bytes
  its switch counter counted, and every connection whose path crosses it with the bytes
  its samples carried in the interval (``connection_paths_by_node``,
  ``connection_samples_by_connection``, ``port_counters_by_port``);
- :func:`step_links`: which links rank r's slow step used: the step (the slowest timed one
  of the rank unless named), its connections to and from the step's peers, and every link
  on their paths with what the counters and the samples say of it during the step
  (``steps_by_rank``).

Links are named as faults name them: ``A-B`` (both directions, either order) or ``A>B``
(one direction); :func:`target_directions` also takes a switch or GPU name (every link of
it). Times are Unix epoch seconds, the bundle's one clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.results.plots import LinkDirection, link_directions
from orchestrator.results.store import ResultsBundle, StepRecord
from topologies.errors import ResultsError
from topologies.fivetuple import FiveTuple


@dataclass(frozen=True)
class Direction:
    """One direction of a link, ``src`` -> ``dst``, and the counter that measures it."""

    src: str
    dst: str
    measured: LinkDirection

    @property
    def label(self) -> str:
        return f"{self.src}>{self.dst}"


@dataclass(frozen=True)
class ConnectionUse:
    """A connection (its sending end's row) and the bytes its samples carried."""

    connection_id: int
    config_id: int
    src_rank: int | None
    dst_rank: int | None
    five_tuple: FiveTuple
    bytes: int


@dataclass(frozen=True)
class LinkTraffic:
    """What crossed one direction of a link in [start, end]: ``counter_bytes`` by the
    switch counter (None: no counter samples around the interval), ``connections``: those
    whose recorded path crosses it, with their bytes in the interval."""

    direction: Direction
    start: float
    end: float
    counter_bytes: int | None
    connections: list[ConnectionUse] = field(default_factory=list)

    @property
    def utilization(self) -> float | None:
        """The counter's rate over the direction's emulated capacity."""
        seconds = self.end - self.start
        if self.counter_bytes is None or seconds <= 0:
            return None
        return self.counter_bytes * 8 / seconds / self.direction.measured.capacity


@dataclass(frozen=True)
class StepLinks:
    """The links one step of one rank used: per direction, what crossed it meanwhile."""

    step: StepRecord
    connections: list[ConnectionUse]
    links: list[LinkTraffic]


def directions(fabric: dict[str, Any]) -> dict[tuple[str, str], Direction]:
    """Every measured direction of the bundle's fabric, by (src, dst)."""
    out = {}
    for d in link_directions(fabric):
        src, dst = d.label.split(" > ")
        out[(src, dst)] = Direction(src, dst, d)
    return out


def target_directions(bundle: ResultsBundle, target: str) -> list[Direction]:
    """The directions a fault's target names: ``A-B`` both, ``A>B`` one, a node name all
    of its links' directions. Unknown names are a ResultsError listing what exists."""
    known = directions(bundle.fabric)
    if ">" in target:
        pair = tuple(target.split(">", 1))
        found = [known[pair]] if pair in known else []
    elif "-" in target:
        a, b = target.split("-", 1)
        found = [known[k] for k in ((a, b), (b, a)) if k in known]
    else:
        found = [d for (src, dst), d in known.items() if target in (src, dst)]
    if found:
        return found
    raise ResultsError(
        bundle.path,
        "a link 'A-B' or 'A>B', a switch or a GPU of the fabric",
        f"{target!r}" + (f" (a link looks like {'-'.join(next(iter(known)))})" if known else ""),
    )


def crossing(bundle: ResultsBundle, direction: Direction) -> list[int]:
    """The connections (sending-end rows) whose recorded path goes ``src`` -> ``dst``."""
    rows = bundle.sql(
        "SELECT DISTINCT p.connection_id FROM connection_paths AS p"
        " JOIN connection_paths AS n ON n.connection_id = p.connection_id AND n.hop = p.hop + 1"
        " WHERE p.node = ? AND n.node = ? ORDER BY p.connection_id",
        (direction.src, direction.dst),
    )
    return [int(r[0]) for r in rows]


def through_node(bundle: ResultsBundle, node: str) -> list[int]:
    """The connections whose recorded path visits ``node``."""
    rows = bundle.sql(
        "SELECT DISTINCT connection_id FROM connection_paths WHERE node = ? ORDER BY connection_id",
        (node,),
    )
    return [int(r[0]) for r in rows]


def connection_uses(
    bundle: ResultsBundle, ids: Sequence[int], start: float, end: float
) -> list[ConnectionUse]:
    """The connections ``ids`` with the bytes their samples carried in (start, end]."""
    out = []
    for connection_id in ids:
        row = bundle.sql(
            "SELECT c.config_id, c.src_rank, c.dst_rank, c.src_ip, c.src_port, c.dst_ip,"
            " c.dst_port, c.protocol, (SELECT COALESCE(SUM(bytes), 0) FROM connection_samples"
            " WHERE connection_id = c.id AND t > ? AND t <= ?) FROM connections AS c"
            " WHERE c.id = ?",
            (start, end, connection_id),
        )
        if row:
            r = row[0]
            five = FiveTuple(r[3], r[4], r[5], r[6], r[7])
            out.append(ConnectionUse(connection_id, r[0], r[1], r[2], five, int(r[8])))
    return out


def counter_bytes(
    bundle: ResultsBundle, direction: Direction, start: float, end: float
) -> int | None:
    """Bytes the direction's counter counted from its last sample at or before ``start``
    to its first at or after ``end`` (None without both, or across a counter reset)."""
    m = direction.measured
    column = "tx_bytes" if m.counter == "tx" else "rx_bytes"
    return bundle.counter_delta(m.switch, m.port, column, start, end)


def link_traffic(bundle: ResultsBundle, link: str, start: float, end: float) -> list[LinkTraffic]:
    """What crossed ``link`` (``A-B``, ``A>B``, or a node: all its links) in [start, end]."""
    if end < start:
        raise ResultsError(bundle.path, "an interval with start <= end", f"{start} > {end}")
    return [
        LinkTraffic(
            d,
            start,
            end,
            counter_bytes(bundle, d, start, end),
            connection_uses(bundle, crossing(bundle, d), start, end),
        )
        for d in target_directions(bundle, link)
    ]


def slowest_step(bundle: ResultsBundle, config_id: int, rank: int) -> StepRecord | None:
    """The rank's longest timed step of the configuration (None: no steps recorded)."""
    steps = [s for s in bundle.steps(config_id) if s.rank == rank and not s.warmup]
    return max(steps, key=lambda s: s.end - s.start, default=None)


def step_links(
    bundle: ResultsBundle,
    config_id: int,
    rank: int,
    iteration: int | None = None,
    step: int | None = None,
) -> StepLinks | None:
    """The links rank ``rank``'s step used: ``iteration``/``step`` if given, else its
    slowest timed step. Its connections are those it sent on to the step's send peers and
    received on from its receive peers; the links those of their recorded paths, each with
    what crossed it during the step. None when the bundle has no such step."""
    if iteration is None or step is None:
        chosen = slowest_step(bundle, config_id, rank)
    else:
        chosen = next(
            (
                s
                for s in bundle.steps(config_id)
                if s.rank == rank and s.iteration == iteration and s.step == step
            ),
            None,
        )
    if chosen is None:
        return None
    ids = []
    for c in bundle.connections(config_id):
        if c.rank != c.src_rank:  # the sending end holds the path
            continue
        if (c.src_rank == rank and c.dst_rank in chosen.send_peers) or (
            c.dst_rank == rank and c.src_rank in chosen.recv_peers
        ):
            ids.append(c.id)
    paths = bundle.paths()
    known = directions(bundle.fabric)
    used: dict[tuple[str, str], list[int]] = {}
    for connection_id in ids:
        nodes = [h.node for h in paths.get(connection_id, [])]
        for pair in itertools.pairwise(nodes):
            if pair in known:
                used.setdefault(pair, []).append(connection_id)
    links = [
        LinkTraffic(
            known[pair],
            chosen.start,
            chosen.end,
            counter_bytes(bundle, known[pair], chosen.start, chosen.end),
            connection_uses(bundle, members, chosen.start, chosen.end),
        )
        for pair, members in used.items()
    ]
    return StepLinks(chosen, connection_uses(bundle, ids, chosen.start, chosen.end), links)


def touched_connections(bundle: ResultsBundle, target: str) -> list[int]:
    """The connections (sending-end rows) a fault on ``target`` touches: those whose
    recorded path crosses the link (either direction of ``A-B``, the one of ``A>B``) or
    visits the node. Empty for no target (controller-crash) or a target that is not
    in the fabric (the fault validated its own names)."""
    if not target:
        return []
    if ">" not in target and "-" not in target:
        return through_node(bundle, target)
    try:
        found = target_directions(bundle, target)
    except ResultsError:
        return []
    return sorted({c for d in found for c in crossing(bundle, d)})
