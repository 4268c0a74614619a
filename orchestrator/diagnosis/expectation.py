"""The forecast as the expectation: a replayed training iteration (workload.json) against
its forecast timeline, slot by slot, pointing at the links its late communication crossed.

The forecast (orchestrator/forecast/program.py) says how long each rank should spend in
each slot of the iteration on a healthy fabric; the replay says how long it did. A slot
that ran well beyond its forecast — by more than :data:`SLOT_SLACK_REL` of the slot and
:data:`SLOT_SLACK_ITERATION` of the whole iteration, margins chosen above what healthy
replays showed (up to 2.4 % of the iteration on one slot: docs/workloads.md) — was waiting
on its communication: its excess counts against every link that the fabric connections
between the rank and the peers of its ops in that slot cross (their traced paths; one of
them held the slot up: :func:`holding`, by their bytes' last progress). The link whose late
slots cover the largest share of the excess, and that little traffic which ran on time
crossed, is the suspect (a slow link, or one whose failure rerouted traffic: the
expectation sees the slowness, not its mechanism).

Only an iteration behind its forecast as a whole (by :data:`BEHIND_GATE`) is judged: the
forecast's own error is a few percent (docs/workloads.md), and a fault that does not slow
the iteration is the other detectors' to find. What it cannot do: blame NVLink (tensor
parallelism inside a server has no fabric connection) or tell a late peer from a slow
link when a rank waits on a peer that was itself late (that excess is spread too, over
the links to the peer).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from orchestrator.diagnosis.evidence import ConnectionView, Observations
from orchestrator.diagnosis.model import Suspect

SLOT_SLACK_REL = 0.5  # a slot is late beyond 1.5x its forecast ...
SLOT_SLACK_ITERATION = 0.03  # ... and 3 % of the forecast iteration
BEHIND_GATE = 0.10  # the iteration at least 10 % behind its forecast
MIN_SHARE = 0.5  # a suspect link carries at least half of the late excess
HOLD_SHARE = 0.1  # connections done within 10 % of the slot of the last one held it too
MAX_LINKS = 2  # links named per policy
BASE_SCORE = 0.3  # + share x specificity x SPAN_SCORE: a link on all late traffic and
SPAN_SCORE = 0.5  # on none that ran on time scores 0.8


def behind_forecast(obs: Observations) -> list[Suspect]:
    """Links blamed by the replay's excess over its forecast (see the module docstring)."""
    workload = obs.workload
    if not workload or not workload.get("slots"):
        return []
    out: list[Suspect] = []
    for policy, record in workload.get("policies", {}).items():
        forecast = record.get("forecast")
        configs = [cid for cid, p in obs.config_policies.items() if p == policy]
        if not forecast or not configs:
            continue
        behind = record["iteration_s"] / forecast["iteration_s"] - 1
        if behind < BEHIND_GATE:
            continue
        connections = _by_pair([c for c in obs.connections if c.config_id in configs])
        out += _blame(policy, record, forecast, workload["slots"], connections, behind)
    return out


def _by_pair(connections: list[ConnectionView]) -> dict[tuple[int, int], list[ConnectionView]]:
    """(rank, rank) -> the connections between them with a known path (either way)."""
    pairs: dict[tuple[int, int], list[ConnectionView]] = defaultdict(list)
    for c in connections:
        if c.full_path:
            pairs[(c.src_rank, c.dst_rank)].append(c)
            pairs[(c.dst_rank, c.src_rank)].append(c)
    return pairs


def _links(c: ConnectionView) -> set[str]:
    return {"-".join(sorted(d.split(">", 1))) for d in c.directions()}


def holding(connections: list[ConnectionView], start: float, end: float) -> list[ConnectionView]:
    """Of the connections a rank's slot waited on, those that moved their last bytes last
    in the slot's window (within :data:`HOLD_SHARE` of the window of the latest): the ones
    that held it up. All of them when none moved bytes in the window (no samples)."""
    last: dict[int, float] = {}
    for c in connections:
        moved = [t for t, nbytes in c.samples if start <= t <= end and nbytes > 0]
        if moved:
            last[c.id] = max(moved)
    if not last:
        return connections
    latest = max(last.values())
    return [c for c in connections if last.get(c.id, -1.0) >= latest - HOLD_SHARE * (end - start)]


@dataclass(frozen=True)
class LateSlot:
    """A rank's slot that ran beyond its forecast, and the links its holders crossed."""

    rank: int
    kind: str
    excess: float  # seconds beyond the forecast and the slack
    crossed: frozenset[str]


def _blame(
    policy: str,
    record: dict[str, Any],
    forecast: dict[str, Any],
    slots: list[list[list[Any]]],
    pairs: dict[tuple[int, int], list[ConnectionView]],
    behind: float,
) -> list[Suspect]:
    late, timely_on = _late_slots(record, forecast, slots, pairs)
    total = sum(x.excess for x in late)
    if total <= 0:
        return []
    late_on: dict[str, int] = defaultdict(int)  # link -> late slots crossing it
    for x in late:
        for link in x.crossed:
            late_on[link] += 1
    kinds: dict[str, float] = defaultdict(float)
    for x in late:
        kinds[x.kind] += x.excess
    worst = ", ".join(f"{k} {s:.1f} s" for k, s in sorted(kinds.items(), key=lambda x: -x[1]))
    context = [
        f"expectation: under {policy} the iteration took {record['iteration_s']:.1f} s, "
        f"{behind:+.0%} over its forecast {forecast['iteration_s']:.1f} s (emulated)",
        f"expectation: {len(late)} slot(s) of ranks {_ranks({x.rank for x in late})} ran "
        f"late, {total:.1f} s beyond their forecast ({worst})",
    ]
    out: list[Suspect] = []
    left = list(late)
    # greedy cover: the best link explains its late slots away, and a second link is
    # named only for a large share of the excess the first does not explain
    while left and len(out) < MAX_LINKS:
        blame: dict[str, float] = defaultdict(float)
        for x in left:
            for link in x.crossed:
                blame[link] += x.excess
        if not blame:
            break
        best = max(blame, key=lambda k: (blame[k] * _specificity(k, late_on, timely_on), k))
        share = blame[best] / total
        if share < (MIN_SHARE if not out else MIN_SHARE / 2):
            break
        specificity = _specificity(best, late_on, timely_on)
        evidence = [
            *context,
            f"expectation: {share:.0%} of that excess waited on connections crossing {best} "
            f"(those that moved their last bytes last in each late slot); "
            f"{timely_on.get(best, 0)} on-time slot(s) crossed it against {late_on[best]} late",
        ]
        score = BASE_SCORE + SPAN_SCORE * share * specificity
        out.append(Suspect("link", best, "slow", score, evidence))
        left = [x for x in left if best not in x.crossed]
    return out


def _late_slots(
    record: dict[str, Any],
    forecast: dict[str, Any],
    slots: list[list[list[Any]]],
    pairs: dict[tuple[int, int], list[ConnectionView]],
) -> tuple[list[LateSlot], dict[str, int]]:
    """Every rank's slots that ran late (with fabric connections to wait on), and per
    link how many slots that ran on time crossed it."""
    slack = SLOT_SLACK_ITERATION * forecast["iteration_s"]
    origin = record.get("timeline_origin", 0.0)  # epoch s of the timeline's zero
    late: list[LateSlot] = []
    timely_on: dict[str, int] = defaultdict(int)
    for key, spans in record["timeline"].items():
        rank = int(key)
        expected = {s[0]: s for s in forecast["timeline"].get(key, [])}
        for slot, start, end, _, kind in spans:
            planned = expected.get(slot)
            if planned is None or not kind:
                continue
            peers = {p for _, group in slots[slot] if rank in group for p in group} - {rank}
            waited = [c for peer in sorted(peers) for c in pairs.get((rank, peer), [])]
            if not waited:  # NVLink only: no fabric link to blame
                continue
            excess = (end - start) - (planned[2] - planned[1]) * (1 + SLOT_SLACK_REL) - slack
            if excess <= 0:
                for link in set().union(*(_links(c) for c in waited)):
                    timely_on[link] += 1
                continue
            held = holding(waited, origin + start, origin + end)
            late.append(LateSlot(rank, kind, excess, frozenset().union(*map(_links, held))))
    return late, timely_on


def _specificity(link: str, late_on: dict[str, int], timely_on: dict[str, int]) -> float:
    """The share of the slots whose traffic crossed ``link`` that ran late."""
    late, timely = late_on.get(link, 0), timely_on.get(link, 0)
    return late / (late + timely) if late + timely else 0.0


def _ranks(ranks: set[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))
