"""Reading the controller's telemetry file: counter series, per-link rates and utilization.

The controller process writes ``telemetry.jsonl`` in the run directory (``python -m
controllers --telemetry FILE``; format in docs/telemetry.md, records defined in
:mod:`controllers.counters`). This module only parses and computes (no root, no switch)::

    tel = read_telemetry(run_dir / "telemetry.jsonl")          # also FILE.1 .. FILE.N
    tel.rounds[-1].switches["p0r0t0"].ports                      # raw counters
    rates = link_rates(tel, description)                         # Direction -> [LinkRate]
    busiest = max(rates, key=lambda d: mean_utilization(rates[d]))
    polling_periods(tel)                                         # achieved poll intervals
    [r for r in tel.routes if r.event == "moved"]                # what adaptive did

A link is seen from a switch at one of its ends: traffic from ``a`` to ``b`` is ``a``'s
transmit counter when ``a`` is a polled switch, else ``b``'s receive counter (a GPU is never
polled). Rates divide by the switch's own clock (port ``duration``), utilization by the
link's emulated rate from the fabric description.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.counters import (
    FlowRoute,
    PortRate,
    StatsRound,
    check_columns,
    decode_round,
    decode_route,
    port_rates,
)
from topologies.description import FabricDescription
from topologies.model import LinkKind

MAX_ROTATED = 99  # FILE.1 .. FILE.99 are looked for


@dataclass
class Telemetry:
    """Everything one telemetry stream holds, oldest first.

    ``segments``: the index in ``rounds`` where each controller process (a header with a new
    pid) began;
    rates are never computed across a segment boundary (a restarted controller starts its
    round numbers again and may have missed what happened in between).
    """

    headers: list[dict[str, Any]] = field(default_factory=list)
    rounds: list[StatsRound] = field(default_factory=list)
    routes: list[FlowRoute] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)
    bad_lines: int = 0  # lines that were not JSON or not a known record

    def segment_rounds(self) -> Iterator[list[StatsRound]]:
        bounds = [*self.segments, len(self.rounds)]
        for start, end in itertools.pairwise(bounds):
            if end > start:
                yield self.rounds[start:end]


def telemetry_files(path: str | Path) -> list[Path]:
    """The files of one stream that exist, oldest first: ``FILE.N`` ... ``FILE.1``, ``FILE``."""
    path = Path(path)
    rotated = [path.with_name(f"{path.name}.{i}") for i in range(MAX_ROTATED, 0, -1)]
    return [p for p in [*rotated, path] if p.exists()]


def read_telemetry(path: str | Path) -> Telemetry:
    """Parse ``path`` and its rotated predecessors. A last line without its newline (being
    written right now) is skipped; a header of an unknown version raises ValueError."""
    files = telemetry_files(path)
    if not files:
        raise FileNotFoundError(f"no telemetry file {path}")
    tel = Telemetry()
    for name in files:
        with open(name, encoding="utf-8") as src:
            text = src.read()
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        elif lines:
            lines.pop()  # incomplete last line
        for line in lines:
            parse_line(tel, line)
    return tel


def parse_line(tel: Telemetry, line: str) -> None:
    """Add one line's record to ``tel``."""
    try:
        record = json.loads(line)
        kind = record.get("type")
    except (ValueError, AttributeError):
        tel.bad_lines += 1
        return
    if kind == "header":
        check_columns(record)
        # Same process after a rotation: the same segment goes on.
        if not tel.headers or tel.headers[-1].get("pid") != record.get("pid"):
            tel.segments.append(len(tel.rounds))
        tel.headers.append(record)
        return
    if not tel.headers:
        tel.bad_lines += 1  # a rotated-away header: cannot trust the columns
        return
    try:
        if kind == "stats":
            tel.rounds.append(decode_round(record))
        elif kind == "route":
            tel.routes.append(decode_route(record))
        else:
            tel.bad_lines += 1
    except (KeyError, TypeError, ValueError):
        tel.bad_lines += 1


# --- poll periods --------------------------------------------------------------------------


def polling_periods(tel: Telemetry) -> list[float]:
    """Seconds between the starts of consecutive rounds (within each controller process)."""
    periods = []
    for rounds in tel.segment_rounds():
        periods += [b.t - a.t for a, b in itertools.pairwise(rounds)]
    return periods


@dataclass(frozen=True)
class PeriodSummary:
    count: int
    mean: float
    p50: float
    p95: float
    max: float
    incomplete: int  # rounds where some switch did not answer in time
    took_p95: float | None  # request-to-last-reply time of complete rounds, 95th percentile


def summarize_periods(tel: Telemetry) -> PeriodSummary:
    periods = sorted(polling_periods(tel))
    took = sorted(r.took for r in tel.rounds if r.took is not None)
    incomplete = sum(1 for r in tel.rounds if r.missing)
    if not periods:
        return PeriodSummary(0, 0.0, 0.0, 0.0, 0.0, incomplete, _quantile(took, 0.95))
    return PeriodSummary(
        count=len(periods),
        mean=sum(periods) / len(periods),
        p50=_quantile(periods, 0.5) or 0.0,
        p95=_quantile(periods, 0.95) or 0.0,
        max=periods[-1],
        incomplete=incomplete,
        took_p95=_quantile(took, 0.95),
    )


def _quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile of sorted ``values`` (None if empty)."""
    if not values:
        return None
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


# --- ports and links -----------------------------------------------------------------------


@dataclass(frozen=True)
class Direction:
    """One direction of a link: traffic leaving ``src`` by ``src_port`` towards ``dst``."""

    src: str
    src_port: int
    dst: str
    dst_port: int
    kind: LinkKind
    capacity: float  # emulated rate, bit/s

    def __str__(self) -> str:
        return f"{self.src}:{self.src_port}>{self.dst}:{self.dst_port}"


@dataclass(frozen=True)
class LinkRate:
    """Traffic on one link direction over one interval ending at ``t`` (time.time())."""

    t: float
    dt: float
    bps: float
    utilization: float
    dropped: int  # packets the measuring port dropped in the interval (tx or rx side)


def port_rate_series(tel: Telemetry, switch: str) -> list[tuple[float, dict[int, PortRate]]]:
    """Per-port rates of ``switch`` between its consecutive samples: (t of the later, rates)."""
    series = []
    for rounds in tel.segment_rounds():
        last = None
        for stats in rounds:
            sample = stats.switches.get(switch)
            if sample is None:
                continue
            if last is not None:
                series.append((sample.t, port_rates(last, sample)))
            last = sample
    return series


def directions(description: FabricDescription) -> list[Direction]:
    """Both directions of every fabric link (NVLink links are not the fabric's)."""
    out = []
    for link in description.fabric.links:
        if link.kind is LinkKind.NVLINK:
            continue
        rate = description.emulated_rate(link)
        out.append(Direction(link.a, link.a_port, link.b, link.b_port, link.kind, rate))
        out.append(Direction(link.b, link.b_port, link.a, link.a_port, link.kind, rate))
    return out


def link_rates(tel: Telemetry, description: FabricDescription) -> dict[Direction, list[LinkRate]]:
    """Rate and utilization series of every link direction some polled switch sees."""
    polled = {name for stats in tel.rounds for name in stats.switches}
    series = {name: port_rate_series(tel, name) for name in sorted(polled)}
    out: dict[Direction, list[LinkRate]] = {}
    for d in directions(description):
        if d.src in polled:
            switch, port, tx = d.src, d.src_port, True
        elif d.dst in polled:
            switch, port, tx = d.dst, d.dst_port, False
        else:
            continue
        rows = []
        for t, rates in series[switch]:
            rate = rates.get(port)
            if rate is None:
                continue
            bps = rate.tx_bps if tx else rate.rx_bps
            dropped = rate.tx_dropped if tx else rate.rx_dropped
            util = bps / d.capacity if d.capacity > 0 else 0.0
            rows.append(LinkRate(t, rate.dt, bps, util, dropped))
        out[d] = rows
    return out


def mean_rate(rows: Sequence[LinkRate], start: float = 0.0, end: float = float("inf")) -> float:
    """Bytes-weighted mean bit rate of the intervals ending in [start, end] (0 if none)."""
    chosen = [r for r in rows if start <= r.t <= end]
    seconds = sum(r.dt for r in chosen)
    return sum(r.bps * r.dt for r in chosen) / seconds if seconds > 0 else 0.0


def mean_utilization(
    rows: Sequence[LinkRate], start: float = 0.0, end: float = float("inf")
) -> float:
    chosen = [r for r in rows if start <= r.t <= end]
    seconds = sum(r.dt for r in chosen)
    return sum(r.utilization * r.dt for r in chosen) / seconds if seconds > 0 else 0.0


def by_name(rates: Mapping[Direction, list[LinkRate]]) -> dict[str, list[LinkRate]]:
    """The same series keyed by ``"src:port>dst:port"`` (for printing and JSON)."""
    return {str(d): rows for d, rows in rates.items()}
