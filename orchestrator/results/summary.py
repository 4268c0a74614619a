"""From a bundle's raw measurements to nccl-tests figures: the summary, tables and CSVs.

How a configuration's numbers are computed (nccl-tests' rules, ``orchestrator.collectives.nccl``):

- time: per rank, the mean of its timed (non-warm-up) iterations, which ran back to back
  from a common start (so the mean is the batch / iterations); then the mean over ranks;
- algbw = size / time, busbw = algbw * factor(collective, ranks), both in GB/s, emulated;
- busbw_min / busbw_max: busbw of the slowest and the fastest timed iteration (each
  iteration's time averaged over ranks), a spread the plots draw as a band;
- #wrong: the sum over all iterations and ranks, warm-up included (corruption is wrong
  whenever it happens);
- real-speed figures: emulated / the fabric's emulation scale;
- the ceiling: the configuration's own busbw ceiling (``orchestrator.collectives.ceilings``),
  printed in each table's header; a cell above it, or short enough that the shapers'
  buckets could have inflated it, is marked beside its row.
- the emulator's load: whether it was saturated while the configuration was measured, as
  the run judged it (orchestrator.results.emulator), in summary.json and in the header of
  every table that has such a configuration.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from orchestrator.collectives.ceilings import Ceiling
from orchestrator.collectives.nccl import (
    CSV_COLUMNS,
    TIME_DEFINITION,
    NcclRow,
    average_busbw,
    csv_record,
    format_table,
)
from orchestrator.collectives.program import PROGRAM
from orchestrator.results.emulator import EmulatorLoad, saturation_lines
from orchestrator.results.store import (
    SCHEMA_VERSION,
    SUMMARY,
    TABLES,
    Configuration,
    ForecastRecord,
    IterationRecord,
    ResultsBundle,
    _write_json,
)
from topologies.latency import latency_title

Group = tuple[str, str, str]  # (policy, collective, algorithm)

#: The mark of a row without a time, and why it has none (summary.json's ``not_measured``).
NOT_MEASURED = "NOT MEASURED"
NOT_MEASURED_REASON = "no timed iteration was recorded (the workers failed or hung before one)"


@dataclass(frozen=True)
class ConfigurationResult:
    """One configuration's nccl-tests row plus its spread and real-speed figures."""

    configuration: Configuration
    row: NcclRow
    busbw_min: float
    busbw_max: float
    timed: int  # timed (iteration, rank) records behind the figures
    scale: float
    ceiling: Ceiling | None = None

    @property
    def batch_seconds(self) -> float:
        """How long the timed batch lasted, mean over ranks (time x iterations)."""
        return self.row.time_us * self.configuration.iterations / 1e6

    @property
    def measured(self) -> bool:
        """Whether the configuration has a time: one whose workers failed or hung before a
        timed iteration finished has none, and must read as not measured everywhere (not as
        a row of nan with ``0 OK``)."""
        return not math.isnan(self.row.time_us)

    @property
    def ceiling_share(self) -> float:
        """busbw / the configuration's own ceiling (nan without one)."""
        return self.ceiling.share(self.row.busbw) if self.ceiling else math.nan

    def marks(self) -> list[str]:
        """What the table says beside this row (see :meth:`Ceiling.marks`); a configuration
        without a time is marked ``NOT MEASURED`` instead."""
        if not self.measured:
            return [NOT_MEASURED]
        if self.ceiling is None or math.isnan(self.row.busbw):
            return []
        return self.ceiling.marks(self.row.busbw, self.batch_seconds)

    @property
    def algbw_real(self) -> float:
        return self.row.algbw / self.scale

    @property
    def busbw_real(self) -> float:
        return self.row.busbw / self.scale


def operation_time_us(records: Iterable[IterationRecord]) -> float:
    """Mean over ranks of each rank's mean timed iteration (nccl-tests ``-a 1``): a rank's
    timed iterations follow each other without a gap, so its mean is its batch / iterations."""
    per_rank: dict[int, list[float]] = {}
    for record in records:
        if not record.warmup:
            per_rank.setdefault(record.rank, []).append(record.time_us)
    if not per_rank:
        return math.nan
    return fmean(fmean(times) for times in per_rank.values())


def iteration_times_us(records: Iterable[IterationRecord]) -> list[float]:
    """Each timed iteration's time, averaged over the ranks that reported it."""
    per_iteration: dict[int, list[float]] = {}
    for record in records:
        if not record.warmup:
            per_iteration.setdefault(record.iteration, []).append(record.time_us)
    return [fmean(times) for _, times in sorted(per_iteration.items())]


def wrong_elements(records: Sequence[IterationRecord]) -> int | None:
    """#wrong of a configuration; None (not verified) if any record was not verified (its
    wrong is -1): a sum that skipped them would claim a check that never ran."""
    if any(record.wrong < 0 for record in records):
        return None
    return sum(record.wrong for record in records)


def result_of(
    configuration: Configuration,
    records: Sequence[IterationRecord],
    scale: float,
    ceiling: Ceiling | None = None,
) -> ConfigurationResult:
    c = configuration
    timed = sum(1 for record in records if not record.warmup)
    wrong = wrong_elements(records)
    if timed == 0 and not wrong:
        # nothing timed: the data of the operations asked for was never checked either (a
        # warm-up's corruption, where found, is still reported)
        wrong = None
    row = NcclRow.of(
        c.collective,
        size=c.size,
        count=c.count,
        dtype=c.dtype,
        ranks=c.ranks,
        time_us=operation_time_us(records),
        wrong=wrong,
    )
    spread = [
        NcclRow.of(
            c.collective,
            size=c.size,
            count=c.count,
            dtype=c.dtype,
            ranks=c.ranks,
            time_us=t,
            wrong=0,
        ).busbw
        for t in iteration_times_us(records)
    ]
    return ConfigurationResult(
        configuration=c,
        row=row,
        busbw_min=min(spread, default=math.nan),
        busbw_max=max(spread, default=math.nan),
        timed=timed,
        scale=scale,
        ceiling=ceiling,
    )


def summarize(bundle: ResultsBundle) -> list[ConfigurationResult]:
    """Every collective configuration of the bundle, in the order the run recorded them
    (a workload's replays have no nccl-tests row: their figures are workload.json's,
    orchestrator/run/replay.py)."""
    ceilings = bundle.ceilings()
    return [
        result_of(
            configuration,
            bundle.iterations(configuration.id),
            bundle.scale,
            ceilings.get(configuration.id),
        )
        for configuration in bundle.configurations()
        if configuration.collective != PROGRAM
    ]


def grouped(results: Iterable[ConfigurationResult]) -> dict[Group, list[ConfigurationResult]]:
    """Results per (policy, collective, algorithm), groups in first-seen order, sizes rising."""
    groups: dict[Group, list[ConfigurationResult]] = {}
    for result in results:
        groups.setdefault(result.configuration.group, []).append(result)
    for members in groups.values():
        members.sort(key=lambda r: (r.configuration.size, r.configuration.ranks))
    return groups


def group_slug(group: Group) -> str:
    """A file name for a group: ``ecmp__all-reduce-ring`` (anything odd replaced by '_')."""
    policy, collective, algorithm = group
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{policy}__{collective}-{algorithm}")


def group_title(group: Group, results: Sequence[ConfigurationResult], bundle: ResultsBundle) -> str:
    policy, collective, algorithm = group
    first = results[0].configuration
    return (
        f"{collective} ({algorithm}), policy {policy}, host ports {host_ports(results)}, "
        f"{first.ranks} ranks, "
        f"{iterations_text(results)} (+{first.warmup} warm-up), fabric {bundle.run.fabric}"
    )


def iterations_text(
    results: Sequence[ConfigurationResult], asked: int | None = None, min_batch: float | None = None
) -> str:
    """ "4 iterations", or the range that ran where short operations were repeated more
    (the launcher lengthens their batches); with ``asked``, how many the experiment asked
    for, said where it differs, and why: the shapers' buckets, or the experiment's own
    ``min_batch`` (seconds)."""
    counts = sorted({r.configuration.iterations for r in results}) or [asked or 0]
    ran = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    if asked is None or counts == [asked]:
        return f"{ran} iterations"
    if min_batch:
        why = f"a short operation repeats until its batch lasts min_batch {min_batch:g}s"
    else:
        why = (
            "a short operation repeats until its batch lasts long enough for the shapers' "
            "buckets not to count"
        )
    return f"{ran} iterations (asked {asked}; {why})"


def host_ports(results: Iterable[ConfigurationResult]) -> str:
    """How hosts picked NIC ports in ``results`` (orchestrator/testbed/hostports.py); results
    under both (a pytest plugin bundle can hold such) name both: ``balanced+hash``."""
    return "+".join(sorted({r.configuration.host_ports for r in results}))


def format_group(
    group: Group, results: Sequence[ConfigurationResult], bundle: ResultsBundle
) -> str:
    """One nccl-tests table (with real-speed columns) for a group."""
    head = [
        f"astral run {bundle.run.experiment!r} ({bundle.run.status}), {bundle.run.started}",
        group_title(group, results, bundle),
        time_definition(bundle),
    ]
    latency = latency_title(bundle.fabric.get("latency"))
    forecasts = bundle.forecasts()
    notes = [
        forecast_note(forecasts.get(r.configuration.id), r.row.busbw, bundle.scale) for r in results
    ]
    return configuration_table(
        results, head, bundle.scale, emulator_loads(results, bundle), latency, notes
    )


def configuration_table(
    results: Sequence[ConfigurationResult],
    head: Sequence[str],
    scale: float,
    loads: Sequence[tuple[int, EmulatorLoad | None]],
    latency: str | None,
    notes: Sequence[str] = (),
) -> str:
    """One group's nccl-tests table as ``astral run`` prints it and ``astral report``
    writes it: ``head`` (what the group is, how its time was measured), then its ceiling,
    the saturation verdicts (``loads``: (size, load) per row) and the latencies, then the
    rows, each with its marks and ``notes[i]`` (the forecast beside a measured cell)."""
    title = [*head, *ceiling_lines(results, scale), *saturation_lines(loads)]
    title += [latency] if latency else []
    extra = list(notes) + [""] * (len(results) - len(notes))
    return format_table(
        [r.row for r in results],
        title=title,
        scale=scale,
        notes=[
            "; ".join([*r.marks(), *filter(None, [e])])
            for r, e in zip(results, extra, strict=False)
        ],
    )


def forecast_note(forecast: ForecastRecord | None, busbw: float, scale: float) -> str:
    """Beside a measured row: ``forecast busbw 44.10 real (+2.3%)``, and where hashing
    spreads the forecast, its p10-p90 band and whether the measurement fell inside; a
    forecast made without this machine's calibration says so (``uncalibrated``): the bare
    model, links at full rate and no per-step costs, is not what the row is to be judged by."""
    if forecast is None:
        return ""
    text = f"forecast busbw {forecast.busbw / scale:.2f} real"
    error = forecast.error(busbw)
    # no measurement, no error: "(+nan%)" would read as a comparison that was made
    text += f" ({error:+.1%})" if not math.isnan(error) else " (no measurement to compare)"
    if not forecast.calibrated:
        text += " uncalibrated"
    if forecast.hash_draws > 1 and forecast.busbw_p10 != forecast.busbw_p90:
        where = "inside" if forecast.inside(busbw) else "OUTSIDE"
        where = where if busbw > 0 else "unmeasured"
        text += (
            f", p10-p90 {forecast.busbw_p10 / scale:.2f}-{forecast.busbw_p90 / scale:.2f} {where}"
        )
    return text


#: How version 1 bundles were timed (before nccl-tests batches, docs/measurement.md).
OLD_TIME_DEFINITION = (
    "time: mean over ranks of each rank's mean timed iteration, every iteration after its own "
    "barrier and timed from when the rank's start message arrived (a version 1 bundle)"
)


def time_definition(bundle: ResultsBundle) -> str:
    """How the bundle's times were measured: bundles of schema 1 predate the batch timing,
    so re-rendering one must not describe its figures with the new rule."""
    return TIME_DEFINITION if bundle.version >= 2 else OLD_TIME_DEFINITION


def ceiling_lines(results: Sequence[ConfigurationResult], scale: float) -> list[str]:
    """The header lines that name a group's ceiling (its configurations share one; sizes
    round differently, so the first one's is shown) and what the row marks mean."""
    ceiling = next((r.ceiling for r in results if r.ceiling is not None), None)
    if ceiling is None:
        return ["busbw ceiling: not recorded (a bundle from before ceilings were stored)"]
    lines = [ceiling.describe(scale)]
    if any(mark != NOT_MEASURED for r in results for mark in r.marks()):
        lines.append(
            "marks: ABOVE CEILING = busbw over the ceiling by more than the shapers' buckets "
            "could add (an emulation or timing fault); "
            f"bucket <= p = the shapers' {ceiling.burst_s * 1e3:g} ms buckets could have "
            "added up to p to this batch (a figure over the ceiling by no more than p is "
            "theirs)"
        )
    return lines


def emulator_loads(
    results: Sequence[ConfigurationResult], bundle: ResultsBundle
) -> list[tuple[int, EmulatorLoad | None]]:
    """(size, the emulator's load while it was measured) per result, in order."""
    loads = bundle.emulator_loads()
    return [(r.configuration.size, loads.get(r.configuration.id)) for r in results]


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def configuration_record(
    result: ConfigurationResult,
    load: EmulatorLoad | None = None,
    forecast: ForecastRecord | None = None,
) -> dict[str, Any]:
    """One configuration as summary.json keeps it (``astral forecast --json`` too)."""
    c, row = result.configuration, result.row
    return {
        "id": c.id,
        "policy": c.policy,
        "host_ports": c.host_ports,
        "collective": c.collective,
        "algorithm": c.algorithm,
        "size": c.size,
        "count": c.count,
        "dtype": c.dtype,
        "ranks": c.ranks,
        "iterations": c.iterations,
        "warmup": c.warmup,
        "timed_records": result.timed,
        # connections that got no pinned source port (null: the policy pins none)
        "unpinned_connections": c.unpinned,
        "verified": row.wrong is not None,  # false: "wrong" is null, nothing checked
        "time_us": _number(row.time_us),
        "algbw_GBps": _number(row.algbw),
        "busbw_GBps": _number(row.busbw),
        "busbw_min_GBps": _number(result.busbw_min),
        "busbw_max_GBps": _number(result.busbw_max),
        "wrong": row.wrong,
        "ceiling": result.ceiling.to_dict() if result.ceiling else None,
        "ceiling_share": _number(result.ceiling_share),
        "marks": result.marks(),
        "emulator_saturated": load.saturated if load is not None else None,
        "emulator_load": load.to_dict() if load is not None else None,
        "real": {
            "algbw_GBps": _number(result.algbw_real),
            "busbw_GBps": _number(result.busbw_real),
        },
        # the model's forecast made before the run (null: none recorded)
        "forecast": (
            {**forecast.to_dict(), "busbw_error": _number(forecast.error(row.busbw))}
            if forecast
            else None
        ),
    }


def summary_document(
    bundle: ResultsBundle, results: Sequence[ConfigurationResult]
) -> dict[str, Any]:
    """The JSON summary: the run, the fabric's figures, each configuration, group averages."""
    run = bundle.run
    spec = bundle.fabric["spec"]
    loads = bundle.emulator_loads()
    forecasts = bundle.forecasts()
    configurations = []
    for result in results:
        c = result.configuration
        forecast = forecasts.get(c.id)
        record = configuration_record(result, loads.get(c.id), forecast)
        # why a configuration has no figures, only where it has none: a measured record
        # keeps the keys ``astral forecast --json`` shares with it
        if not result.measured:
            record["not_measured"] = NOT_MEASURED_REASON
        configurations.append(record)
    averages = []
    for group, members in grouped(results).items():
        average = average_busbw([m.row for m in members])
        averages.append(
            {
                "policy": group[0],
                "host_ports": host_ports(members),
                "collective": group[1],
                "algorithm": group[2],
                "busbw_GBps": _number(average),
                "real_busbw_GBps": _number(average / bundle.scale),
            }
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "units": "GB/s = 1e9 bytes/s; emulated unless under 'real' (emulated / emulation_scale)",
        "run": {
            "id": run.id,
            "experiment": run.experiment,
            "started": run.started,
            "finished": run.finished,
            "status": run.status,
            "host": run.host,
            "seed": run.seed,
            "versions": {
                "python": run.versions.python,
                "mininet": run.versions.mininet,
                "os_ken": run.versions.os_ken,
                "ovs": run.versions.ovs,
            },
        },
        "fabric": {
            "name": spec["name"],
            "kind": spec["kind"],
            "gpus": len(bundle.fabric.get("gpus", [])),
            "emulation_scale": bundle.scale,
            "speeds": spec["speeds"],
            "nic_ports": spec["nic_ports"],
        },
        "configurations": configurations,
        "averages": averages,
        "emulator": {
            "sampled": len(loads),
            "saturated_configurations": sorted(i for i, load in loads.items() if load.saturated),
        },
    }


def write_summary(bundle: ResultsBundle, results: Sequence[ConfigurationResult]) -> Path:
    path = bundle.path / SUMMARY
    _write_json(path, summary_document(bundle, results))
    return path


def write_tables(bundle: ResultsBundle, results: Sequence[ConfigurationResult]) -> list[Path]:
    """Per group, ``tables/<slug>.txt`` (nccl-tests text) and ``tables/<slug>.csv``."""
    directory = bundle.path / TABLES
    directory.mkdir(exist_ok=True)
    written = []
    for group, members in grouped(results).items():
        slug = group_slug(group)
        text_path = directory / f"{slug}.txt"
        text_path.write_text(format_group(group, members, bundle), encoding="utf-8")
        csv_path = directory / f"{slug}.csv"
        with csv_path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(CSV_COLUMNS)
            for member in members:
                writer.writerow(csv_record(member.row, bundle.scale))
        written += [text_path, csv_path]
    return written
