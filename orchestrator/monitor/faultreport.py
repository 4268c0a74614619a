"""``astral report``'s fault section: what was injected, when, and what each layer saw.

For every fault in the bundle's ``faults`` table, its interval (applied to undone, or to
the end of the run) is compared with a window of the same length just before it, layer by
layer, from the bundle alone:

- application: per rank, the mean operation time of the operations that started in the
  interval against those that started before; the ranks that slowed most;
- transport: the connections whose recorded path crosses the target, their
  retransmissions (growth of TCP_INFO's total) and mean RTT in either window;
- network: the target's link directions (bytes/s and drops by their counters) against the
  mean of the other links;
- host: the machine's idle share and ovs-vswitchd's cores in either window.

A bundle without a ``faults`` table, or with no rows, has no section (an empty list).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from statistics import fmean

from orchestrator.monitor.queries import (
    Direction,
    counter_bytes,
    directions,
    target_directions,
    touched_connections,
)
from orchestrator.results.store import InjectedFault, ResultsBundle
from topologies.errors import ResultsError

TOP_RANKS = 3


def fault_section(bundle: ResultsBundle) -> list[str]:
    faults = bundle.faults()
    if not faults:
        return []
    end_of_run = run_end(bundle)
    origin: float | None
    if _operation_spans(bundle):
        origin, since = run_origin(bundle), "the run's first operation"
    else:
        # no operation recorded (the run failed before one): an origin of 0 would print
        # epoch seconds as if they were offsets; the run's start is the next honest origin
        origin = _started(bundle)
        since = (
            "the run's start: no operation was recorded"
            if origin is not None
            else "n/a: no operation and no readable start recorded"
        )
    lines = [f"# faults: {len(faults)} injected (times from {since})"]
    for fault in faults:
        lines += describe(bundle, fault, origin, end_of_run)
    return lines


def _operation_spans(bundle: ResultsBundle) -> list[tuple[float, float]]:
    """Each configuration's first start and last end, from the phase timelines and, in
    version 3 bundles, the steps."""
    spans = list(bundle.spans().values())
    if bundle.has_table("steps"):
        spans += [
            (float(a), float(b))
            for a, b in bundle.sql('SELECT MIN(start), MAX("end") FROM steps GROUP BY config_id')
        ]
    return spans


def _started(bundle: ResultsBundle) -> float | None:
    """When the run started (epoch s, from its ISO timestamp), None if it cannot be read."""
    try:
        return datetime.fromisoformat(bundle.run.started).timestamp()
    except (TypeError, ValueError):
        return None


def run_origin(bundle: ResultsBundle) -> float:
    return min((s for s, _ in _operation_spans(bundle)), default=0.0)


def run_end(bundle: ResultsBundle) -> float:
    return max((e for _, e in _operation_spans(bundle)), default=0.0)


def _at(t: float | None, origin: float | None) -> str:
    if t is None:
        return "never"
    return "n/a" if origin is None else f"{t - origin:+.3f} s"


def describe(
    bundle: ResultsBundle, fault: InjectedFault, origin: float | None, end_of_run: float
) -> list[str]:
    params = ", ".join(f"{k} {v}" for k, v in sorted(fault.params.items()))
    head = f"#   fault {fault.id}: {fault.kind} on {fault.target or '(no target)'}"
    lines = [head + (f" ({params})" if params else "")]
    late = ""
    if fault.applied is not None and fault.scheduled is not None:
        late = f" ({(fault.applied - fault.scheduled) * 1e3:.0f} ms after its schedule)"
    lines.append(
        f"#     scheduled {_at(fault.scheduled, origin)}, applied {_at(fault.applied, origin)}"
        f"{late}, undone {_at(fault.undone, origin)}"
        + (f"; error: {fault.error}" if fault.error else "")
    )
    if fault.applied is None:
        return lines
    start = fault.applied
    end = fault.undone if fault.undone is not None else max(end_of_run, start)
    width = max(end - start, 1e-3)
    before = (start - width, start)
    lines.append(application(bundle, before, (start, end)))
    lines.append(transport(bundle, fault.target, before, (start, end)))
    lines.append(network(bundle, fault.target, before, (start, end)))
    lines.append(host(bundle, before, (start, end)))
    return lines


Window = tuple[float, float]


def application(bundle: ResultsBundle, before: Window, during: Window) -> str:
    """Per rank, mean operation time during vs before; the most slowed ranks."""
    per_rank: dict[int, tuple[list[float], list[float]]] = {}
    for c in bundle.configurations():
        for r in bundle.iterations(c.id):
            if r.start is None:
                continue
            then, now = per_rank.setdefault(r.rank, ([], []))
            if before[0] <= r.start < before[1]:
                then.append(r.time_us)
            elif during[0] <= r.start < during[1]:
                now.append(r.time_us)
    ratios = {
        rank: fmean(now) / fmean(then) for rank, (then, now) in per_rank.items() if then and now
    }
    during_ops = sum(len(now) for _, now in per_rank.values())
    if not ratios:
        return (
            f"#     application: {during_ops} operations started in the interval; "
            "none to compare with before it"
        )
    slowest = sorted(ratios.items(), key=lambda kv: -kv[1])[:TOP_RANKS]
    overall = fmean(ratios.values())
    return (
        f"#     application: {during_ops} operations in the interval took {overall:.2f}x "
        "their rank's time before it on average; slowed most: "
        + ", ".join(f"rank {rank} {ratio:.2f}x" for rank, ratio in slowest)
    )


def transport(bundle: ResultsBundle, target: str, before: Window, during: Window) -> str:
    ids = touched_connections(bundle, target)
    if not ids:
        return "#     transport: no recorded connection path crosses the target"
    retrans = [0, 0]
    rtts: tuple[list[float], list[float]] = ([], [])
    for connection_id in ids:
        samples = bundle.tcp_info(connection_id)
        for i, (a, b) in enumerate((before, during)):
            inside = [s for s in samples if a <= s.t < b]
            if inside:
                retrans[i] += inside[-1].retrans - inside[0].retrans
                rtts[i].extend(s.rtt_us / 1e3 for s in inside)
    if not rtts[0] and not rtts[1]:
        return (
            f"#     transport: {len(ids)} connections cross the target; no TCP_INFO "
            "recorded (monitor: light?)"
        )
    rtt = [f"{fmean(x):.2f} ms" if x else "-" for x in rtts]
    return (
        f"#     transport: {len(ids)} connections cross the target: retransmissions "
        f"{retrans[0]} before, {retrans[1]} during; mean RTT {rtt[0]} before, {rtt[1]} during"
    )


def _rate(bundle: ResultsBundle, d: Direction, window: Window) -> float | None:
    carried = counter_bytes(bundle, d, *window)
    if carried is None:
        return None
    return carried * 8 / max(window[1] - window[0], 1e-9)


def network(bundle: ResultsBundle, target: str, before: Window, during: Window) -> str:
    try:
        targeted = target_directions(bundle, target) if target else []
    except ResultsError:
        targeted = []
    if not targeted:
        return "#     network: no link of the fabric is the target"
    names = {d.label for d in targeted}
    others = [d for d in directions(bundle.fabric).values() if d.label not in names]
    cells = []
    for d in targeted:
        rates = [_rate(bundle, d, w) for w in (before, during)]
        util = ["-" if r is None else f"{r / d.measured.capacity:.0%}" for r in rates]
        drops = _drops(bundle, d, during)
        cells.append(f"{d.label} {util[0]} -> {util[1]} of capacity, {drops} drops during")
    other = [r for d in others if (r := _rate(bundle, d, during)) is not None and r > 0]
    mean = _mean_utilization(bundle, others, during)
    tail = f"; the other {len(other)} busy directions averaged {mean:.0%}" if mean else ""
    return "#     network: " + "; ".join(cells) + tail


def _mean_utilization(bundle: ResultsBundle, others: Sequence[Direction], window: Window) -> float:
    values = []
    for d in others:
        rate = _rate(bundle, d, window)
        if rate:
            values.append(rate / d.measured.capacity)
    return fmean(values) if values else 0.0


def _drops(bundle: ResultsBundle, d: Direction, window: Window) -> int | str:
    m = d.measured
    rows = bundle.sql(
        "SELECT drops FROM port_counters WHERE switch = ? AND port = ? AND t >= ? AND t <= ?"
        " ORDER BY t",
        (m.switch, m.port, window[0], window[1]),
    )
    if len(rows) < 2:
        return "?"
    return max(0, int(rows[-1][0]) - int(rows[0][0]))


def host(bundle: ResultsBundle, before: Window, during: Window) -> str:
    cpu = bundle.host_cpu()
    cells = []
    for name, (a, b) in (("before", before), ("during", during)):
        inside = [c for c in cpu if c.start >= a and c.end <= b]
        if inside:
            idle = fmean(c.idle_share for c in inside)
            ovs = fmean(c.vswitchd_cores for c in inside)
            cells.append(f"{name}: idle {idle:.0%}, ovs-vswitchd {ovs:.2f} cores")
    if not cells:
        return "#     host: no CPU samples in these windows"
    return "#     host: " + "; ".join(cells)
