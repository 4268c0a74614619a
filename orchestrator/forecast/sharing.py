"""Max-min fair sharing of links by flows: progressive filling, and a step's completion time.

TCP flows that share a bottleneck converge to about equal shares of it, and a flow held
back elsewhere leaves its unused share to the others: the max-min fair allocation, which
progressive filling computes (Bertsekas and Gallager, Data Networks, 6.5.2). Every
unfrozen flow's rate rises together until some link is full; the flows crossing it freeze
at that rate; repeat until every flow is frozen.

The same algorithm runs on aggregated flows (orchestrator/forecast/aggregate.py): a
:class:`FlowClass` stands for ``count`` identical flows and says, per link class, how many
of its flows cross each link of that class (``per_link``; a fraction where the flows spread
evenly over more links than there are flows). A single flow over single links is the
special case ``count = 1``, ``per_link = 1`` for every link on its path, so one
implementation serves both, and the tests check they agree.

:func:`completion_time` then plays a step out: every flow has bytes to move; the flows run
at their max-min rates until the first finishes; the rest are re-shared without it, and so
on (a fluid model: TCP's slow start and losses are the calibration's business).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LinkKey = Hashable

#: relative tolerance when deciding which links a filling round saturated
TOLERANCE = 1e-9


@dataclass(frozen=True)
class FlowClass:
    """``count`` identical flows, each moving ``nbytes``; ``per_link[l]``: how many of
    them cross each link of class ``l`` (1.0 for a lone flow on its own path)."""

    count: float
    nbytes: float
    per_link: Mapping[Any, float]


def max_min_rates(flows: Sequence[FlowClass], capacity: Mapping[Any, float]) -> list[float]:
    """Each flow class's per-flow rate (capacity units) under max-min fairness. A class
    that crosses no link of finite capacity gets ``inf``.

    Each round costs one pass over the links (the active weight on every link is kept up
    to date as classes freeze), so a step of thousands of flows shares in milliseconds."""
    rates = [math.inf] * len(flows)
    users: dict[LinkKey, list[tuple[int, float]]] = {}
    for i, f in enumerate(flows):
        for link, share in f.per_link.items():
            if share > 0:
                users.setdefault(link, []).append((i, share))
    active = {i for members in users.values() for i, _ in members}
    weight: dict[LinkKey, float] = {
        link: sum(w for _, w in members) for link, members in users.items()
    }
    residual = {link: float(capacity[link]) for link in users}
    level = 0.0
    while active:
        best = min(
            (residual[link] / w for link, w in weight.items() if w > TOLERANCE),
            default=math.inf,
        )
        if not math.isfinite(best):
            break
        level += best
        saturated = []
        for link, w in weight.items():
            if w <= TOLERANCE:
                continue
            residual[link] -= best * w
            if residual[link] <= TOLERANCE * capacity[link]:
                saturated.append(link)
        for link in saturated:
            for i, _ in users[link]:
                if i not in active:
                    continue
                active.discard(i)
                rates[i] = level
                for other, w in flows[i].per_link.items():
                    if w > 0:
                        weight[other] -= w
    return rates


def completion_time(flows: Sequence[FlowClass], capacity: Mapping[Any, float]) -> float:
    """Seconds until every flow has moved its bytes (capacities in bytes/s), re-sharing the
    links each time a flow class finishes."""
    remaining = {i: float(f.nbytes) for i, f in enumerate(flows) if f.nbytes > 0}
    elapsed = 0.0
    while remaining:
        ids = sorted(remaining)
        rates = max_min_rates([flows[i] for i in ids], capacity)
        if any(r <= 0 for r in rates):
            return math.inf
        finite = [remaining[i] / r for i, r in zip(ids, rates, strict=True) if math.isfinite(r)]
        if not finite:
            break
        dt = min(finite)
        elapsed += dt
        for i, r in zip(ids, rates, strict=True):
            if not math.isfinite(r):
                del remaining[i]
                continue
            remaining[i] -= r * dt
            if remaining[i] <= TOLERANCE * max(1.0, flows[i].nbytes):
                del remaining[i]
    return elapsed
