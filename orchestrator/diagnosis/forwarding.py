"""What each switch forwarded to each egress, from its flow and group counters.

A switch's port counters say what each port received and sent, and its egress queues what
they discarded; the sum over its ports of received minus sent minus discarded is what it
dropped silently (:func:`orchestrator.diagnosis.detectors.switch_leaks`), but not where. A
lossy link's drops happen at its sending switch's egress, after the switch forwarded the
packet there and before the port counts it sent; so per egress port,

    forwarded to it - sent by it - discarded by its full queue = lost at that egress

where "forwarded to it" is what the switch's flow entries that output to the port counted,
plus the packets of each group bucket that outputs to it (the controller's telemetry
records, per entry and per bucket, the ports their actions output to: controllers.counters).
The flow, group and port counters of one switch come in one poll round, their replies a
few milliseconds apart, and the queues are sampled apart: a window whose ends are not
quiet reads what crossed the switch meanwhile as lost or as more than sent (a busy ToR:
-175 to +146 packets per 0.5 s poll, seed 68 run 34). A whole run's ends are quiet, and
over it the count is off only by the entries' counters running a little ahead of the
ports' (0.3-0.5 % at a busy switch: orchestrator/diagnosis/egress.py reads shares).

What it does not count: entries with no output (a drop rule's packets are received and not
forwarded anywhere, so they stay in the switch's balance and out of every egress's), the
controller's own packets (output to the controller, or sent by it: a few per run, read as
negative), and an entry removed between two polls (its last increment is lost: read as
fewer forwarded, never as lost). Bundles written before 2026-12-07 have no outputs: no
egress is known there, and the readings that use this fall back to the probes.
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

Port = tuple[str, int]
TELEMETRY_FILE = "telemetry.jsonl"
#: the columns of a flow row and of a group row that say where they output (docs/telemetry.md)
FLOW_OUT, GROUP_PORTS = 6, 5
MAX_ROTATED = 99  # FILE.1 .. FILE.99, as the controller rotates them


def forwarded_series(file: Path) -> dict[Port, list[tuple[float, int]]]:
    """Per (switch, model port): (t, packets forwarded to it so far), one row per poll
    round of the switch, oldest first, from the telemetry ``file`` (a bundle's
    :data:`TELEMETRY_FILE`, and the files it was rotated to); empty when it does not say
    where the entries output (files before 2026-12-07) or there is none. Read here from
    the file's documented rows, not through the controller's own decoder: the diagnosis
    reads a bundle's files, whatever wrote them."""
    switches = list(_switch_samples(file))
    if not any(_says_where(s) for _, s in switches):
        return {}
    out: dict[Port, list[tuple[float, int]]] = defaultdict(list)
    totals: dict[Port, int] = defaultdict(int)
    last_flow: dict[str, dict[str, int]] = defaultdict(dict)
    last_bucket: dict[str, dict[tuple[int, int], int]] = defaultdict(dict)
    for name, s in switches:
        seen_flows: dict[str, int] = {}
        for row in s.get("flows", []):
            key = json.dumps(row[:3], sort_keys=True)  # table, priority, match
            packets = int(row[3])
            seen_flows[key] = packets
            ports = [int(x) for x in _out(row) if not isinstance(x, str)]
            if not ports:
                continue  # no egress (a drop entry), or a group's (its buckets count)
            grown = _grown(last_flow[name].get(key), packets)
            for port in ports:
                totals[(name, port)] += grown
        seen_buckets: dict[tuple[int, int], int] = {}
        for row in s.get("groups", []):
            group, buckets = int(row[0]), row[4]
            where = row[GROUP_PORTS] if len(row) > GROUP_PORTS else []
            for i, (packets, _) in enumerate(buckets):
                seen_buckets[(group, i)] = int(packets)
                grown = _grown(last_bucket[name].get((group, i)), int(packets))
                for port in where[i] if i < len(where) else []:
                    totals[(name, int(port))] += grown
        last_flow[name], last_bucket[name] = seen_flows, seen_buckets
        for port_row in s.get("ports", []):
            port = int(port_row[0])
            out[(name, port)].append((float(s["t"]), totals[(name, port)]))
    return dict(out)


def _switch_samples(file: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(switch, its sample) of every poll round, oldest file and round first; lines that
    are not JSON (a last line cut short) are skipped."""
    rotated = [file.with_name(f"{file.name}.{i}") for i in range(MAX_ROTATED, 0, -1)]
    for path in [*rotated, file]:
        if not path.exists():
            continue
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("type") == "stats":
                    yield from sorted(record.get("switches", {}).items())


def _out(row: Sequence[Any]) -> Sequence[Any]:
    return row[FLOW_OUT] if len(row) > FLOW_OUT else ()


def _says_where(s: Mapping[str, Any]) -> bool:
    """Whether the sample records where its entries and buckets output (newer files)."""
    return any(_out(row) for row in s.get("flows", [])) or any(
        len(row) > GROUP_PORTS and any(row[GROUP_PORTS]) for row in s.get("groups", [])
    )


def _grown(before: int | None, now: int) -> int:
    """How much a cumulative entry counter grew since the last poll: all of it for a new
    entry or one replaced meanwhile (its counter went back)."""
    if before is None or now < before:
        return now
    return now - before


def forwarded_at(rows: list[tuple[float, int]], t: float) -> tuple[float, int] | None:
    """The row of the last poll at or before ``t`` (the first if none is)."""
    if not rows:
        return None
    i = bisect.bisect_right([r[0] for r in rows], t) - 1
    return rows[max(i, 0)]
