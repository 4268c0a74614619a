"""From a bundle's raw measurements to nccl-tests figures: the summary, tables and CSVs.

How a configuration's numbers are computed (nccl-tests' rules, ``orchestrator.collectives.nccl``):

- time: per rank, the mean of its timed (non-warm-up) iterations; then the mean over ranks;
- algbw = size / time, busbw = algbw * factor(collective, ranks), both in GB/s, emulated;
- busbw_min / busbw_max: busbw of the slowest and the fastest timed iteration (each
  iteration's time averaged over ranks), a spread the plots draw as a band;
- #wrong: the sum over all iterations and ranks, warm-up included (corruption is wrong
  whenever it happens);
- real-speed figures: emulated / the fabric's emulation scale.
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

from orchestrator.collectives.nccl import (
    CSV_COLUMNS,
    TIME_DEFINITION,
    NcclRow,
    average_busbw,
    csv_record,
    format_table,
)
from orchestrator.results.store import (
    SCHEMA_VERSION,
    SUMMARY,
    TABLES,
    Configuration,
    IterationRecord,
    ResultsBundle,
    _write_json,
)

Group = tuple[str, str, str]  # (policy, collective, algorithm)


@dataclass(frozen=True)
class ConfigurationResult:
    """One configuration's nccl-tests row plus its spread and real-speed figures."""

    configuration: Configuration
    row: NcclRow
    busbw_min: float
    busbw_max: float
    timed: int  # timed (iteration, rank) records behind the figures
    scale: float

    @property
    def algbw_real(self) -> float:
        return self.row.algbw / self.scale

    @property
    def busbw_real(self) -> float:
        return self.row.busbw / self.scale


def operation_time_us(records: Iterable[IterationRecord]) -> float:
    """Mean over ranks of each rank's mean timed iteration (nccl-tests ``-a 1``)."""
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


def result_of(
    configuration: Configuration, records: Sequence[IterationRecord], scale: float
) -> ConfigurationResult:
    c = configuration
    row = NcclRow.of(
        c.collective,
        size=c.size,
        count=c.count,
        dtype=c.dtype,
        ranks=c.ranks,
        time_us=operation_time_us(records),
        wrong=sum(record.wrong for record in records),
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
        timed=sum(1 for record in records if not record.warmup),
        scale=scale,
    )


def summarize(bundle: ResultsBundle) -> list[ConfigurationResult]:
    """Every configuration of the bundle, in the order the run recorded them."""
    return [
        result_of(configuration, bundle.iterations(configuration.id), bundle.scale)
        for configuration in bundle.configurations()
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
        f"{first.iterations} iterations (+{first.warmup} warm-up), fabric {bundle.run.fabric}"
    )


def host_ports(results: Iterable[ConfigurationResult]) -> str:
    """How hosts picked NIC ports in ``results`` (orchestrator/testbed/hostports.py); results
    under both (a pytest plugin bundle can hold such) name both: ``balanced+hash``."""
    return "+".join(sorted({r.configuration.host_ports for r in results}))


def format_group(
    group: Group, results: Sequence[ConfigurationResult], bundle: ResultsBundle
) -> str:
    """One nccl-tests table (with real-speed columns) for a group."""
    title = [
        f"astral run {bundle.run.experiment!r} ({bundle.run.status}), {bundle.run.started}",
        group_title(group, results, bundle),
        TIME_DEFINITION,
    ]
    return format_table([r.row for r in results], title=title, scale=bundle.scale)


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def summary_document(
    bundle: ResultsBundle, results: Sequence[ConfigurationResult]
) -> dict[str, Any]:
    """The JSON summary: the run, the fabric's figures, each configuration, group averages."""
    run = bundle.run
    spec = bundle.fabric["spec"]
    configurations = []
    for result in results:
        c, row = result.configuration, result.row
        configurations.append(
            {
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
                "time_us": _number(row.time_us),
                "algbw_GBps": _number(row.algbw),
                "busbw_GBps": _number(row.busbw),
                "busbw_min_GBps": _number(result.busbw_min),
                "busbw_max_GBps": _number(result.busbw_max),
                "wrong": row.wrong,
                "real": {
                    "algbw_GBps": _number(result.algbw_real),
                    "busbw_GBps": _number(result.busbw_real),
                },
            }
        )
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
