"""The results bundle on disk: one directory per run around one SQLite database.

Layout::

    BUNDLE/
      results.sqlite       everything measured (schema below); the one source of truth
      fabric.json          the run's generated fabric description (topologies/description.py):
                           link capacities and the emulation scale, for utilization and
                           real-speed figures
      experiment.yaml      the experiment file as the run read it (if the runner passed it)
      summary.json         per configuration: time, algbw, busbw, #wrong, real-speed figures,
                           connections left unpinned
      tables/              per (policy, collective, algorithm): nccl-tests text (.txt) + CSV
      plots/               busbw vs size per collective, link utilization heat map,
                           connections/ per-connection throughput per configuration

Everything but the database and fabric.json is derived, and ``astral report`` rewrites it.

Schema (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`, ``application_id`` = "ASTR").
Times ``t``, ``start`` and ``end`` are Unix epoch seconds (float) taken on the one machine
that hosts every emulated namespace, so they compare across ranks and switches::

    runs                (id, experiment, started, finished, status, host, python, mininet,
                         os_ken, ovs, seed, fabric, emulation_scale)
    configurations      (id, run_id, policy, host_ports, collective, algorithm, size, count,
                         dtype, ranks, iterations, warmup, unpinned)
                         host_ports: how hosts picked NIC ports (orchestrator/testbed/hostports.py;
                         'unknown' in version 1 bundles, from before the setting existed)
                         unpinned: fabric connections that got no pinned source port under
                         a policy that pins them (ephemeral instead); NULL: nothing pinned
    iterations          (config_id, warmup, iteration, rank, time_us, bytes, wrong)
                         one operation of one rank; warmup = 1 for untimed ones;
                         wrong = -1: not verified
    connections         (id, config_id, rank, protocol, src_ip, src_port, dst_ip, dst_port)
    connection_samples  (connection_id, t, bytes)   bytes sent in (previous sample, t]
    connection_samples_flat  view: the two above joined (config_id, rank, five-tuple, t, bytes)
    port_counters       (run_id, t, switch, port, rx_bytes, tx_bytes, rx_packets,
                         tx_packets, drops)        cumulative, as OpenFlow port stats report
    timelines           (config_id, iteration, rank, phase, start, end)
    ceilings            (config_id, rail, fabric_share, payload_share, burst_s)
                         the configuration's busbw ceiling, GB/s emulated
                         (orchestrator.collectives.ceilings.Ceiling; absent in bundles
                         written before it existed)
    emulator_load       (config_id, window_s, sampled_s, samples, idle_share,
                         vswitchd_cores, vswitchd_wait, softirqd_wait, offered_hop_bps,
                         saturated, reasons, idle_share_min, cores_per_hop_gbps,
                         vswitchd_wait_min, softirqd_wait_max)
                         the CPU during the configuration's measured window and whether the
                         emulator was saturated (orchestrator.results.emulator; absent in
                         bundles written before it existed)
    forecasts           (config_id, time_us, p10_time_us, p90_time_us, busbw, busbw_p10,
                         busbw_p90, hash_draws, calibrated)
                         what the model predicted before the configuration ran
                         (orchestrator/forecast, docs/forecast.md); version 3 on

A bundle holds one run. :class:`ResultsWriter` is what the runner calls, from one thread;
:class:`ResultsBundle` reads a finished (or crashed) bundle back.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

from orchestrator.collectives.ceilings import Ceiling
from orchestrator.results.emulator import EmulatorLoad
from topologies.description import FabricDescription
from topologies.errors import ResultsError
from topologies.fivetuple import FiveTuple

SCHEMA_VERSION = 3  # 2: configurations.host_ports and .unpinned; 3: the forecasts table
#: Versions this astral reads: 1 lacks configurations.unpinned (read as NULL) and
#: configurations.host_ports (read as 'unknown'); 1 and 2 lack forecasts (read as none).
READABLE_VERSIONS = (1, 2, 3)
APPLICATION_ID = 0x41535452  # "ASTR": marks the file as ours

DATABASE = "results.sqlite"
FABRIC = "fabric.json"
EXPERIMENT = "experiment.yaml"
SUMMARY = "summary.json"
TABLES = "tables"
PLOTS = "plots"

_SCHEMA = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    experiment TEXT NOT NULL,
    started TEXT NOT NULL,
    finished TEXT,
    status TEXT NOT NULL DEFAULT 'running',
    host TEXT NOT NULL,
    python TEXT NOT NULL,
    mininet TEXT NOT NULL,
    os_ken TEXT NOT NULL,
    ovs TEXT NOT NULL,
    seed INTEGER NOT NULL,
    fabric TEXT NOT NULL,
    emulation_scale REAL NOT NULL
);
CREATE TABLE configurations (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    policy TEXT NOT NULL,
    collective TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    size INTEGER NOT NULL,
    count INTEGER NOT NULL,
    dtype TEXT NOT NULL,
    ranks INTEGER NOT NULL,
    iterations INTEGER NOT NULL,
    warmup INTEGER NOT NULL,
    host_ports TEXT NOT NULL,
    unpinned INTEGER,
    UNIQUE (run_id, policy, host_ports, collective, algorithm, size, dtype, ranks)
);
CREATE TABLE iterations (
    config_id INTEGER NOT NULL REFERENCES configurations(id),
    warmup INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    time_us REAL NOT NULL,
    bytes INTEGER NOT NULL,
    wrong INTEGER NOT NULL,
    PRIMARY KEY (config_id, warmup, iteration, rank)
);
CREATE TABLE connections (
    id INTEGER PRIMARY KEY,
    config_id INTEGER NOT NULL REFERENCES configurations(id),
    rank INTEGER NOT NULL,
    protocol TEXT NOT NULL,
    src_ip TEXT NOT NULL,
    src_port INTEGER NOT NULL,
    dst_ip TEXT NOT NULL,
    dst_port INTEGER NOT NULL,
    UNIQUE (config_id, rank, protocol, src_ip, src_port, dst_ip, dst_port)
);
CREATE TABLE connection_samples (
    connection_id INTEGER NOT NULL REFERENCES connections(id),
    t REAL NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE INDEX connection_samples_by_connection ON connection_samples (connection_id, t);
CREATE VIEW connection_samples_flat AS
    SELECT c.config_id, c.rank, c.protocol, c.src_ip, c.src_port, c.dst_ip, c.dst_port,
           s.t, s.bytes
    FROM connection_samples AS s JOIN connections AS c ON c.id = s.connection_id;
CREATE TABLE port_counters (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    t REAL NOT NULL,
    switch TEXT NOT NULL,
    port INTEGER NOT NULL,
    rx_bytes INTEGER NOT NULL,
    tx_bytes INTEGER NOT NULL,
    rx_packets INTEGER NOT NULL,
    tx_packets INTEGER NOT NULL,
    drops INTEGER NOT NULL
);
CREATE INDEX port_counters_by_port ON port_counters (switch, port, t);
CREATE TABLE ceilings (
    config_id INTEGER PRIMARY KEY REFERENCES configurations(id),
    rail REAL NOT NULL,
    fabric_share REAL NOT NULL,
    payload_share REAL NOT NULL,
    burst_s REAL NOT NULL
);
CREATE TABLE timelines (
    config_id INTEGER NOT NULL REFERENCES configurations(id),
    iteration INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    phase TEXT NOT NULL,
    start REAL NOT NULL,
    "end" REAL NOT NULL
);
CREATE TABLE forecasts (
    config_id INTEGER PRIMARY KEY REFERENCES configurations(id),
    time_us REAL NOT NULL,
    p10_time_us REAL NOT NULL,
    p90_time_us REAL NOT NULL,
    busbw REAL NOT NULL,
    busbw_p10 REAL NOT NULL,
    busbw_p90 REAL NOT NULL,
    hash_draws INTEGER NOT NULL,
    calibrated INTEGER NOT NULL
);
CREATE TABLE emulator_load (
    config_id INTEGER PRIMARY KEY REFERENCES configurations(id),
    window_s REAL NOT NULL,
    sampled_s REAL NOT NULL,
    samples INTEGER NOT NULL,
    idle_share REAL NOT NULL,
    vswitchd_cores REAL NOT NULL,
    vswitchd_wait REAL NOT NULL,
    softirqd_wait REAL NOT NULL,
    offered_hop_bps REAL NOT NULL,
    saturated INTEGER NOT NULL,
    reasons TEXT NOT NULL,
    idle_share_min REAL NOT NULL,
    cores_per_hop_gbps REAL NOT NULL,
    vswitchd_wait_min REAL NOT NULL,
    softirqd_wait_max REAL NOT NULL
);
"""


_EMULATOR_LOAD = tuple(f.name for f in fields(EmulatorLoad))  # the table's columns


@dataclass(frozen=True)
class Versions:
    """Software versions of a run, as the runner found them (free text, e.g. ``3.1.0``)."""

    python: str
    mininet: str
    os_ken: str
    ovs: str


@dataclass(frozen=True)
class IterationRecord:
    """One collective operation as one rank saw it. ``bytes``: what the rank sent;
    ``wrong``: elements that failed verification, -1 when the rank did not verify them;
    ``warmup``: not timed."""

    iteration: int
    rank: int
    time_us: float
    bytes: int
    wrong: int = 0
    warmup: bool = False


@dataclass(frozen=True)
class ConnectionSample:
    """Bytes a rank's connection carried in the interval (previous sample's t, t]."""

    rank: int
    five_tuple: FiveTuple
    t: float
    bytes: int


@dataclass(frozen=True)
class PortCounter:
    """One switch port's cumulative counters at time ``t`` (drops: rx + tx dropped)."""

    t: float
    switch: str
    port: int
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    drops: int = 0


@dataclass(frozen=True)
class Phase:
    """A named phase of one iteration on one rank (e.g. ``reduce-scatter``, ``all-gather``)."""

    iteration: int
    rank: int
    phase: str
    start: float
    end: float


@dataclass(frozen=True)
class Run:
    id: int
    experiment: str
    started: str
    finished: str | None
    status: str
    host: str
    versions: Versions
    seed: int
    fabric: str
    emulation_scale: float


@dataclass(frozen=True)
class ForecastRecord:
    """What the model predicted for a configuration before it ran (orchestrator/forecast):
    time per operation (us, emulated; the mean over hash draws where paths hash) and its
    10th/90th percentiles, busbw (GB/s, emulated) and its band; ``calibrated``: whether the
    machine's measured per-step figures were applied."""

    time_us: float
    p10_time_us: float
    p90_time_us: float
    busbw: float
    busbw_p10: float
    busbw_p90: float
    hash_draws: int
    calibrated: bool

    def error(self, measured_busbw: float) -> float:
        """(forecast - measured) / measured busbw; nan without a measurement."""
        if not measured_busbw > 0:
            return math.nan
        return (self.busbw - measured_busbw) / measured_busbw

    def inside(self, measured_busbw: float) -> bool:
        return self.busbw_p10 <= measured_busbw <= self.busbw_p90

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_FORECAST = tuple(f.name for f in fields(ForecastRecord))


@dataclass(frozen=True)
class Configuration:
    id: int
    policy: str
    collective: str
    algorithm: str
    size: int
    count: int
    dtype: str
    ranks: int
    iterations: int
    warmup: int
    host_ports: str  # how hosts picked NIC ports (orchestrator/testbed/hostports.py)
    unpinned: int | None = None  # connections left unpinned; None: the policy pins none

    @property
    def group(self) -> tuple[str, str, str]:
        """What one nccl-tests table covers: (policy, collective, algorithm)."""
        return (self.policy, self.collective, self.algorithm)


def _iso(timestamp: float | None) -> str:
    moment = time.time() if timestamp is None else timestamp
    return datetime.fromtimestamp(moment, tz=timezone.utc).isoformat(timespec="milliseconds")


def _fabric_document(fabric: FabricDescription | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(fabric, FabricDescription):
        return fabric.to_dict()
    return dict(fabric)


def _write_json(path: Path, document: object) -> None:
    """Write atomically, like FabricDescription.write: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=1, sort_keys=True, allow_nan=False)
        out.write("\n")
    os.replace(tmp, path)


class ResultsWriter:
    """Creates a bundle and fills it while a run goes; what the runner calls.

    Usage::

        with ResultsWriter(bundle_dir, description, experiment_text=text) as results:
            results.add_run(experiment="default", host="lab1", versions=versions, seed=1)
            for step in spec.steps():
                config = results.add_configuration(policy=..., size=step.size, ...)
                results.add_iterations(config, records)
                results.add_samples(config, samples)
                results.add_timelines(config, phases)
            results.add_port_counters(counters)       # any time, as they arrive
            results.finish()                          # marks the run done

    Leaving the ``with`` block on an exception marks the run ``failed`` (``interrupted``
    for Ctrl-C) and keeps everything written so far. Every ``add_*`` commits, so a crashed
    run's bundle still holds what it measured.
    """

    def __init__(
        self,
        directory: str | Path,
        fabric: FabricDescription | Mapping[str, Any],
        *,
        experiment_text: str | None = None,
    ) -> None:
        self.path = Path(directory)
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise ResultsError(self.path, "a new or empty directory for the bundle", "one in use")
        self.path.mkdir(parents=True, exist_ok=True)
        self.fabric = _fabric_document(fabric)
        self.scale = float(self.fabric["spec"]["emulation"]["scale"])
        _write_json(self.path / FABRIC, self.fabric)
        if experiment_text is not None:
            (self.path / EXPERIMENT).write_text(experiment_text, encoding="utf-8")
        self._connection_db: sqlite3.Connection | None = sqlite3.connect(self.path / DATABASE)
        with self._db:
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self._run_id: int | None = None
        self._connections: dict[tuple[int, int, FiveTuple], int] = {}

    def __enter__(self) -> ResultsWriter:
        return self

    @property
    def _db(self) -> sqlite3.Connection:
        if self._connection_db is None:
            raise RuntimeError("the results bundle is already finished")
        return self._connection_db

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._connection_db is None:
            return
        if kind is None:
            self.close()
        else:
            status = "interrupted" if issubclass(kind, KeyboardInterrupt) else "failed"
            self.finish(status=status)

    @property
    def run_id(self) -> int:
        if self._run_id is None:
            raise RuntimeError("call add_run() before adding measurements")
        return self._run_id

    def add_run(
        self,
        *,
        experiment: str,
        host: str,
        versions: Versions,
        seed: int = 0,
        started: float | None = None,
    ) -> int:
        """Record the run (once per bundle); ``started`` is epoch seconds, default now."""
        if self._run_id is not None:
            raise RuntimeError("a bundle holds one run; add_run() was already called")
        cursor = self._db.execute(
            "INSERT INTO runs (experiment, started, host, python, mininet, os_ken, ovs, seed,"
            " fabric, emulation_scale) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                experiment,
                _iso(started),
                host,
                versions.python,
                versions.mininet,
                versions.os_ken,
                versions.ovs,
                seed,
                str(self.fabric["spec"]["name"]),
                self.scale,
            ),
        )
        self._db.commit()
        self._run_id = int(cursor.lastrowid or 0)
        return self._run_id

    def add_configuration(
        self,
        *,
        policy: str,
        collective: str,
        algorithm: str,
        size: int,
        count: int,
        dtype: str,
        ranks: int,
        iterations: int,
        warmup: int,
        host_ports: str,
        unpinned: int | None = None,
    ) -> int:
        """Record one configuration (an experiment step); returns its id for the add_* calls.
        ``unpinned``: its connections that got no pinned source port (None: none pinned)."""
        cursor = self._db.execute(
            "INSERT INTO configurations (run_id, policy, collective, algorithm, size, count,"
            " dtype, ranks, iterations, warmup, host_ports, unpinned)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.run_id,
                policy,
                collective,
                algorithm,
                size,
                count,
                dtype,
                ranks,
                iterations,
                warmup,
                host_ports,
                unpinned,
            ),
        )
        self._db.commit()
        return int(cursor.lastrowid or 0)

    def add_iterations(self, config_id: int, records: Iterable[IterationRecord]) -> int:
        """Per-rank, per-iteration timings of a configuration; returns how many were added."""
        rows = [
            (config_id, int(r.warmup), r.iteration, r.rank, r.time_us, r.bytes, r.wrong)
            for r in records
        ]
        with self._db:
            self._db.executemany(
                "INSERT INTO iterations (config_id, warmup, iteration, rank, time_us, bytes,"
                " wrong) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def add_samples(self, config_id: int, samples: Iterable[ConnectionSample]) -> int:
        """Per-connection throughput samples of a configuration (any order, any batch size)."""
        rows = [(self._connection(config_id, s.rank, s.five_tuple), s.t, s.bytes) for s in samples]
        with self._db:
            self._db.executemany(
                "INSERT INTO connection_samples (connection_id, t, bytes) VALUES (?, ?, ?)", rows
            )
        return len(rows)

    def _connection(self, config_id: int, rank: int, five: FiveTuple) -> int:
        key = (config_id, rank, five)
        if key not in self._connections:
            cursor = self._db.execute(
                "INSERT INTO connections (config_id, rank, protocol, src_ip, src_port, dst_ip,"
                " dst_port) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (config_id, rank, five.protocol, five.src_ip, five.src_port, five.dst_ip,
                 five.dst_port),
            )  # fmt: skip
            self._connections[key] = int(cursor.lastrowid or 0)
        return self._connections[key]

    def add_port_counters(self, counters: Iterable[PortCounter]) -> int:
        """Switch port counters, as the controller publishes them, at any time of the run."""
        rows = [
            (
                self.run_id,
                c.t,
                c.switch,
                c.port,
                c.rx_bytes,
                c.tx_bytes,
                c.rx_packets,
                c.tx_packets,
                c.drops,
            )
            for c in counters
        ]
        with self._db:
            self._db.executemany(
                "INSERT INTO port_counters (run_id, t, switch, port, rx_bytes, tx_bytes,"
                " rx_packets, tx_packets, drops) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def add_ceiling(self, config_id: int, ceiling: Ceiling) -> None:
        """The busbw ceiling of a configuration (what its figures are judged against)."""
        with self._db:
            self._db.execute(
                "INSERT INTO ceilings (config_id, rail, fabric_share, payload_share, burst_s)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    config_id,
                    ceiling.rail,
                    ceiling.fabric_share,
                    ceiling.payload_share,
                    ceiling.burst_s,
                ),
            )

    def add_timelines(self, config_id: int, phases: Iterable[Phase]) -> int:
        """Phase timelines (per iteration and rank) of a configuration."""
        rows = [(config_id, p.iteration, p.rank, p.phase, p.start, p.end) for p in phases]
        with self._db:
            self._db.executemany(
                'INSERT INTO timelines (config_id, iteration, rank, phase, start, "end")'
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def add_forecast(self, config_id: int, forecast: ForecastRecord) -> None:
        """The model's forecast of a configuration, beside its measurement."""
        with self._db:
            self._db.execute(
                f"INSERT INTO forecasts (config_id, {', '.join(_FORECAST)})"
                f" VALUES (?{', ?' * len(_FORECAST)})",
                (config_id, *(getattr(forecast, name) for name in _FORECAST)),
            )

    def add_emulator_load(self, config_id: int, load: EmulatorLoad) -> None:
        """The CPU during a configuration's measured window and the verdict on it."""
        with self._db:
            self._db.execute(
                f"INSERT INTO emulator_load (config_id, {', '.join(_EMULATOR_LOAD)})"
                f" VALUES (?{', ?' * len(_EMULATOR_LOAD)})",
                (config_id, *(getattr(load, name) for name in _EMULATOR_LOAD)),
            )

    def finish(self, *, status: str = "ok", finished: float | None = None) -> Path:
        """Mark the run finished and close the database. Returns the bundle's path; its
        summary, tables and plots are rendered from it by
        :func:`orchestrator.results.report.render_bundle`."""
        if self._run_id is not None and self._connection_db is not None:
            with self._db:
                self._db.execute(
                    "UPDATE runs SET finished = ?, status = ? WHERE id = ?",
                    (_iso(finished), status, self._run_id),
                )
        self.close()
        return self.path

    def close(self) -> None:
        if self._connection_db is not None:
            self._connection_db.close()
            self._connection_db = None


class ResultsBundle:
    """A bundle opened for reading (the database read-only). Bad paths are ResultsErrors."""

    def __init__(
        self,
        path: Path,
        db: sqlite3.Connection,
        fabric: dict[str, Any],
        version: int = SCHEMA_VERSION,
    ) -> None:
        self.path = path
        self._db = db
        self.version = version
        self.fabric = fabric
        self.run = self._read_run()
        self.scale = float(fabric["spec"]["emulation"]["scale"])

    @classmethod
    def open(cls, path: str | Path) -> ResultsBundle:
        path = Path(path)
        if not path.exists():
            raise ResultsError(path, "a results bundle directory", "no such file or directory")
        if not path.is_dir():
            raise ResultsError(path, "a results bundle directory", "a file")
        database = path / DATABASE
        if not database.is_file():
            raise ResultsError(path, f"a {DATABASE} database in it", "none")
        fabric_path = path / FABRIC
        try:
            fabric = json.loads(fabric_path.read_text(encoding="utf-8"))
            float(fabric["spec"]["emulation"]["scale"])
        except FileNotFoundError:
            raise ResultsError(path, f"a {FABRIC} fabric description in it", "none") from None
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ResultsError(
                path, f"a readable {FABRIC} fabric description", f"{type(err).__name__}: {err}"
            ) from None
        db = sqlite3.connect(database.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            application_id = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as err:
            db.close()
            raise ResultsError(path, f"an SQLite database in {DATABASE}", str(err)) from None
        if application_id != APPLICATION_ID:
            db.close()
            raise ResultsError(path, f"an astral results database in {DATABASE}", "another file")
        if version not in READABLE_VERSIONS:
            db.close()
            raise ResultsError(
                path,
                f"results schema version {' or '.join(map(str, READABLE_VERSIONS))} "
                "(this astral's)",
                f"version {version}",
            )
        try:
            return cls(path, db, fabric, version)
        except ResultsError:
            db.close()
            raise

    def __enter__(self) -> ResultsBundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def _read_run(self) -> Run:
        row = self._db.execute(
            "SELECT id, experiment, started, finished, status, host, python, mininet, os_ken,"
            " ovs, seed, fabric, emulation_scale FROM runs ORDER BY id LIMIT 1"
        ).fetchone()
        if row is None:
            raise ResultsError(self.path, "a run recorded in the database", "none")
        return Run(
            id=row[0],
            experiment=row[1],
            started=row[2],
            finished=row[3],
            status=row[4],
            host=row[5],
            versions=Versions(row[6], row[7], row[8], row[9]),
            seed=row[10],
            fabric=row[11],
            emulation_scale=row[12],
        )

    def configurations(self) -> list[Configuration]:
        """Every configuration, ordered (policy, collective, algorithm, size) as recorded."""
        unpinned = "unpinned" if self.version >= 2 else "NULL"
        host_ports = "host_ports" if self.version >= 2 else "'unknown'"
        rows = self._db.execute(
            "SELECT id, policy, collective, algorithm, size, count, dtype, ranks, iterations,"
            f" warmup, {host_ports}, {unpinned} FROM configurations ORDER BY id"
        ).fetchall()
        return [Configuration(*row) for row in rows]

    def iterations(self, config_id: int) -> list[IterationRecord]:
        rows = self._db.execute(
            "SELECT iteration, rank, time_us, bytes, wrong, warmup FROM iterations"
            " WHERE config_id = ? ORDER BY warmup DESC, iteration, rank",
            (config_id,),
        ).fetchall()
        return [IterationRecord(r[0], r[1], r[2], r[3], r[4], bool(r[5])) for r in rows]

    def samples(self, config_id: int) -> list[ConnectionSample]:
        rows = self._db.execute(
            "SELECT rank, src_ip, src_port, dst_ip, dst_port, protocol, t, bytes"
            " FROM connection_samples_flat WHERE config_id = ? ORDER BY rank, src_ip,"
            " src_port, dst_ip, dst_port, t",
            (config_id,),
        ).fetchall()
        return [
            ConnectionSample(r[0], FiveTuple(r[1], r[2], r[3], r[4], r[5]), r[6], r[7])
            for r in rows
        ]

    def port_counters(self) -> Iterator[PortCounter]:
        rows = self._db.execute(
            "SELECT t, switch, port, rx_bytes, tx_bytes, rx_packets, tx_packets, drops"
            " FROM port_counters ORDER BY switch, port, t"
        )
        for row in rows:
            yield PortCounter(*row)

    def ceilings(self) -> dict[int, Ceiling]:
        """Per configuration id, its busbw ceiling (empty for bundles from before)."""
        try:
            rows = self._db.execute(
                "SELECT config_id, rail, fabric_share, payload_share, burst_s FROM ceilings"
            ).fetchall()
        except sqlite3.OperationalError:  # no such table: an older bundle
            return {}
        return {int(r[0]): Ceiling(r[1], r[2], r[3], r[4]) for r in rows}

    def emulator_loads(self) -> dict[int, EmulatorLoad]:
        """Per configuration id, the CPU during its window and the verdict (empty for
        bundles from before the table existed; configurations not sampled are absent)."""
        try:
            rows = self._db.execute(
                f"SELECT config_id, {', '.join(_EMULATOR_LOAD)} FROM emulator_load"
            ).fetchall()
        except sqlite3.OperationalError:  # no such table: an older bundle
            return {}
        loads = {}
        for config_id, *values in rows:
            named = dict(zip(_EMULATOR_LOAD, values, strict=True))
            named["saturated"] = bool(named["saturated"])
            loads[int(config_id)] = EmulatorLoad(**named)
        return loads

    def forecasts(self) -> dict[int, ForecastRecord]:
        """Per configuration id, the model's forecast (empty for bundles from before)."""
        try:
            rows = self._db.execute(
                f"SELECT config_id, {', '.join(_FORECAST)} FROM forecasts"
            ).fetchall()
        except sqlite3.OperationalError:  # no such table: an older bundle
            return {}
        out = {}
        for config_id, *values in rows:
            named = dict(zip(_FORECAST, values, strict=True))
            named["calibrated"] = bool(named["calibrated"])
            out[int(config_id)] = ForecastRecord(**named)
        return out

    def timelines(self, config_id: int) -> list[Phase]:
        rows = self._db.execute(
            'SELECT iteration, rank, phase, start, "end" FROM timelines WHERE config_id = ?'
            " ORDER BY iteration, rank, start",
            (config_id,),
        ).fetchall()
        return [Phase(*row) for row in rows]

    def spans(self) -> dict[int, tuple[float, float]]:
        """Per configuration, the first start and last end of its timelines (epoch s)."""
        rows = self._db.execute(
            'SELECT config_id, MIN(start), MAX("end") FROM timelines GROUP BY config_id'
        ).fetchall()
        return {row[0]: (row[1], row[2]) for row in rows}
