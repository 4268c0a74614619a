"""Two bundles' nccl-tests tables side by side, with the B/A bus bandwidth ratio.

Configurations match on (policy, collective, algorithm, size). :func:`compare_forecasts`
sets one bundle's measurements beside the forecasts its run stored (``astral compare A
--forecast``). Choosing a policy per side
(``a_policy``, ``b_policy``) compares across policies instead, e.g. one bundle's ecmp against
its own path-pinned; two bundles run with different ``host_ports`` (the header names each
side's) compare what the host's choice of NIC port does under each policy. The ratio is
taken at real link speed (each bundle's busbw divided by its own emulation scale), so
bundles emulated at different scales still compare; at equal scales it is the plain busbw
ratio.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.collectives.nccl import average_busbw, format_wrong
from orchestrator.collectives.sizes import format_size
from orchestrator.results.store import ResultsBundle
from orchestrator.results.summary import ConfigurationResult, host_ports, summarize

Key = tuple[str, str, str, int]  # (policy or "", collective, algorithm, size)


@dataclass(frozen=True)
class Side:
    """One bundle's results, filtered to one policy or not."""

    label: str  # "A" or "B"
    bundle: ResultsBundle
    results: list[ConfigurationResult]
    policy: str | None

    def keyed(self, with_policy: bool) -> dict[Key, ConfigurationResult]:
        keyed: dict[Key, ConfigurationResult] = {}
        for result in self.results:
            c = result.configuration
            if self.policy is not None and c.policy != self.policy:
                continue
            keyed[(c.policy if with_policy else "", c.collective, c.algorithm, c.size)] = result
        return keyed


@dataclass
class Comparison:
    text: str
    matched: int
    only_a: int
    only_b: int


def _ratio(a: float, b: float) -> float:
    return b / a if a > 0 and not math.isnan(a) and not math.isnan(b) else math.nan


def _fmt(value: float, spec: str) -> str:
    return "nan" if math.isnan(value) else format(value, spec)


_SIDE = f"  {'time':>11}  {'busbw':>10}  {'real':>7}  {'#wrong':>6}"
_SIDE_UNITS = f"  {'(us)':>11}  {'(GB/s)':>10}  {'(GB/s)':>7}  {'':>6}"
_HEAD = f"#{'size':>11}  {'count':>12}  {'type':>6}{_SIDE}{_SIDE}  {'B/A':>7}"
_UNITS = f"#{'(B)':>11}  {'(elements)':>12}  {'':>6}{_SIDE_UNITS}{_SIDE_UNITS}  {'busbw':>7}"


def _side_columns(result: ConfigurationResult) -> str:
    row = result.row
    return (
        f"  {_fmt(row.time_us, '11.1f'):>11}  {_fmt(row.busbw, '10.6f'):>10}"
        f"  {_fmt(result.busbw_real, '7.2f'):>7}  {format_wrong(row.wrong):>6}"
    )


def _describe(side: Side) -> str:
    run = side.bundle.run
    policy = f", policy {side.policy}" if side.policy else ""
    ports = f", host ports {host_ports(side.results)}" if side.results else ""
    return (
        f"# {side.label}: {side.bundle.path} (experiment {run.experiment!r}, {run.status}, "
        f"started {run.started}, fabric {run.fabric}, scale {side.bundle.scale:g}{policy}"
        f"{ports})"
    )


def _unmatched(label: str, results: Sequence[ConfigurationResult]) -> str:
    groups: dict[str, list[str]] = {}
    for result in results:
        c = result.configuration
        groups.setdefault(f"policy {c.policy}, {c.collective} ({c.algorithm})", []).append(
            format_size(c.size)
        )
    listed = "; ".join(f"{group}: {' '.join(sizes)}" for group, sizes in groups.items())
    return f"# only in {label}: {len(results)} configuration(s) ({listed})"


def compare(a: Side, b: Side) -> Comparison:
    """The side-by-side text; see the module docstring for what matches what."""
    with_policy = a.policy is None and b.policy is None
    keyed_a, keyed_b = a.keyed(with_policy), b.keyed(with_policy)
    lines = [
        _describe(a),
        _describe(b),
        "# busbw in GB/s as emulated; 'real' = at real link speed (busbw / the bundle's "
        "emulation scale); B/A = ratio of the real busbw",
    ]
    groups: dict[tuple[str, str, str, str], list[tuple[ConfigurationResult, ...]]] = {}
    for key, result_a in keyed_a.items():
        if key in keyed_b:
            result_b = keyed_b[key]
            group = (
                result_a.configuration.policy,
                result_b.configuration.policy,
                key[1],
                key[2],
            )
            groups.setdefault(group, []).append((result_a, result_b))
    for (policy_a, policy_b, collective, algorithm), pairs in groups.items():
        pairs.sort(key=lambda pair: pair[0].configuration.size)
        policies = f"policy {policy_a}" if policy_a == policy_b else f"A {policy_a} vs B {policy_b}"
        lines += [
            "#",
            f"# {collective} ({algorithm}), {policies}",
            f"#{'':>33}{'A':^42}{'B':^42}",
            _HEAD,
            _UNITS,
        ]
        for result_a, result_b in pairs:
            c = result_a.configuration
            ratio = _ratio(result_a.busbw_real, result_b.busbw_real)
            lines.append(
                f"{c.size:>12}  {c.count:>12}  {c.dtype:>6}"
                f"{_side_columns(result_a)}{_side_columns(result_b)}  {_fmt(ratio, '7.3f'):>7}"
            )
        avg_a = average_busbw([p[0].row for p in pairs]) / a.bundle.scale
        avg_b = average_busbw([p[1].row for p in pairs]) / b.bundle.scale
        lines.append(
            f"# Avg bus bandwidth at real speed : A {_fmt(avg_a, '.2f')}, "
            f"B {_fmt(avg_b, '.2f')}, B/A {_fmt(_ratio(avg_a, avg_b), '.3f')}"
        )
    only_a = [r for key, r in keyed_a.items() if key not in keyed_b]
    only_b = [r for key, r in keyed_b.items() if key not in keyed_a]
    if only_a or only_b:
        lines.append("#")
    if only_a:
        lines.append(_unmatched("A", only_a))
    if only_b:
        lines.append(_unmatched("B", only_b))
    matched = sum(len(pairs) for pairs in groups.values())
    text = "\n".join(line.rstrip() for line in lines) + "\n"
    return Comparison(text, matched, len(only_a), len(only_b))


def compare_bundles(
    a: ResultsBundle,
    b: ResultsBundle,
    *,
    a_policy: str | None = None,
    b_policy: str | None = None,
) -> Comparison:
    """Compare two open bundles. One policy given means the same policy on both sides."""
    if (a_policy is None) != (b_policy is None):
        a_policy = b_policy = a_policy or b_policy
    return compare(
        Side("A", a, summarize(a), a_policy),
        Side("B", b, summarize(b), b_policy),
    )


_FORECAST_HEAD = (
    f"#{'size':>11}  {'time':>11}  {'forecast':>11}  {'real':>7}  {'forecast':>8}"
    f"  {'error':>7}  {'p10-p90 (real)':>15}"
)
_FORECAST_UNITS = (
    f"#{'(B)':>11}  {'(us)':>11}  {'(us)':>11}  {'(GB/s)':>7}  {'(GB/s)':>8}  {'busbw':>7}"
)


def compare_forecasts(bundle: ResultsBundle, *, policy: str | None = None) -> Comparison:
    """A bundle's measurements beside the forecasts its run made before each configuration
    (the ``forecasts`` table): time and real busbw, measured and forecast, the relative
    error of the busbw, and the p10-p90 band where paths hash (ECMP); of ``policy``'s
    configurations only when it is given."""
    results = [r for r in summarize(bundle) if policy is None or r.configuration.policy == policy]
    forecasts = bundle.forecasts()
    scale = bundle.scale
    run = bundle.run
    lines = [
        f"# measured: {bundle.path} (experiment {run.experiment!r}, {run.status}, started "
        f"{run.started}, fabric {run.fabric}, scale {scale:g})",
        "# forecast: what the model predicted before each configuration ran "
        "(orchestrator/forecast); error = (forecast - measured) / measured busbw",
    ]
    matched = 0
    missing = 0
    unmeasured = 0
    groups: dict[tuple[str, str, str], list[ConfigurationResult]] = {}
    for result in results:
        groups.setdefault(result.configuration.group, []).append(result)
    errors: list[float] = []
    for (policy, collective, algorithm), members in groups.items():
        lines += ["#", f"# {collective} ({algorithm}), policy {policy}", _FORECAST_HEAD,
                  _FORECAST_UNITS]  # fmt: skip
        for result in sorted(members, key=lambda r: r.configuration.size):
            forecast = forecasts.get(result.configuration.id)
            if forecast is None:
                missing += 1
                continue
            matched += 1
            error = forecast.error(result.row.busbw)
            if math.isnan(error):
                # not measured (the workers failed or hung): no error to count in the median
                unmeasured += 1
            else:
                errors.append(abs(error))
            band = "-"
            if forecast.hash_draws > 1 and forecast.busbw_p10 != forecast.busbw_p90:
                where = "in" if forecast.inside(result.row.busbw) else "OUT"
                where = where if result.row.busbw > 0 else "unmeasured"
                band = f"{forecast.busbw_p10 / scale:.2f}-{forecast.busbw_p90 / scale:.2f} {where}"
            lines.append(
                f"{result.configuration.size:>12}  {_fmt(result.row.time_us, '11.1f'):>11}"
                f"  {_fmt(forecast.time_us, '11.1f'):>11}  {_fmt(result.busbw_real, '7.2f'):>7}"
                f"  {_fmt(forecast.busbw / scale, '8.2f'):>8}  {_fmt(error, '+7.1%'):>7}"
                f"  {band:>15}" + ("  not measured" if math.isnan(error) else "")
            )
    if errors:
        ordered = sorted(errors)
        median = (
            ordered[len(ordered) // 2]
            if len(ordered) % 2
            else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
        )
        lines += [
            "#",
            f"# {len(errors)} cells: median |error| {median:.1%}, max {ordered[-1]:.1%}",
        ]
    if unmeasured:
        lines += [] if errors else ["#"]
        lines.append(
            f"# {unmeasured} of {matched} cells with a forecast not measured (no timed "
            "iteration recorded): left out of the errors"
        )
    if missing:
        lines.append(f"# {missing} configuration(s) without a forecast (a bundle from before)")
    text = "\n".join(line.rstrip() for line in lines) + "\n"
    return Comparison(text, matched, missing, 0)
