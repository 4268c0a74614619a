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
    iterations          (config_id, warmup, iteration, rank, time_us, bytes, wrong, start)
                         one operation of one rank; warmup = 1 for untimed ones;
                         wrong = -1: not verified; start: when the rank began it (epoch s;
                         NULL before version 3)
    connections         (id, config_id, rank, protocol, src_ip, src_port, dst_ip, dst_port,
                         src_rank, dst_rank, channel, link)
                         one end's view of a connection (``rank``: whose samples); data
                         flows src_rank -> dst_rank; link: fabric or nvlink (the last four
                         NULL before version 3, or when a sample arrived without them)
    connection_samples  (connection_id, t, bytes)   bytes sent in (previous sample, t]
    connection_samples_flat  view: the two above joined (config_id, rank, five-tuple, t, bytes)
    port_counters       (run_id, t, switch, port, rx_bytes, tx_bytes, rx_packets,
                         tx_packets, drops, rx_dropped, tx_dropped, rx_errors, tx_errors)
                         cumulative, as OpenFlow port stats report (the last four 0 before
                         version 3)
    queue_counters      (run_id, t, switch, port, packets, drops, backlog)
                         a switch port's egress queue (its shaper's root qdisc): cumulative
                         packets sent and dropped, bytes held at t
                         (orchestrator/testbed/queues.py; absent before version 5); a GPU
                         NIC port's egress queue too, under the GPU's name in ``switch``
                         (runs of this machine's fabrics, from 2026-12-05)
    ingress_drops       (run_id, t, switch, port, drops)
                         packets a switch port received that the switch process never
                         read: cumulative drops of ovs-vswitchd's packet socket on the
                         port, its receive buffer full (orchestrator/testbed/queues.py;
                         absent before version 6)
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
    faults              (id, run_id, kind, target, params, scheduled, applied, undone, error)
                         every fault the experiment injected (orchestrator/testbed/faults.py):
                         params its keys as JSON; scheduled, applied, undone epoch seconds
                         (NULL: never reached); error what failed. Absent before version 3:
                         read as no faults
    controller_restarts (run_id, began, ended, policy, reason)
                         every controller restart the run made itself
                         (orchestrator/testbed/testbed.py): reason 'policy' (a policy switch
                         between configurations) or 'monitor' (a monitor level that changes
                         the counter polling); policy the one in force after it; began when
                         the old process was stopped, ended when every switch was
                         programmed again (NULL: never), epoch seconds. Version 4 on; absent
                         before: not recorded (the diagnosis infers the policy switches from
                         the configurations, orchestrator/diagnosis/restarts.py)

Version 3 adds the monitor's layers (docs/monitoring.md); absent in older bundles, read as
empty::

    steps               (config_id, iteration, rank, step, phase, start, end, send_peers,
                         recv_peers, sent, received)       application: one step of one
                         operation on one rank; peers as JSON lists of ranks, bytes from
                         the plan
    tcp_info            (connection_id, t, rtt_us, rttvar_us, cwnd, ssthresh, retrans,
                         lost, unacked)     transport: the sender kernel's TCP_INFO of a
                         connection (retrans: total retransmitted segments so far)
    connection_paths    (connection_id, hop, node, in_port, out_port, source,
                         counter_bytes)     the nodes a connection crosses, GPU to GPU;
                         source 'traced' (as the switches forward it: ofproto/trace hop
                         by hop), 'pinned' (the controller's published path, which the
                         trace confirmed), 'trace-dropped' or 'trace-unknown' (traced up to
                         the last row's switch, which drops it or decides in a way a trace
                         cannot know), 'first-hop' (only the NIC port and ToR: untraced);
                         counter_bytes: what the out-port's counters carried while the
                         connection was active (NULL: not measured)
    controller_events   (run_id, t, kind, switch, port, level, message)
                         network: the controller's events (connect, disconnect, port-up,
                         port-down, reprogram, programmed, error) and its log lines (log)
    host_cpu            (run_id, start, end, idle_share, vswitchd_cores, vswitchd_wait,
                         softirqd_wait, controller_cores, workers_cores)   host, per interval

Logs (``logs/``): the controller's log and every launch's worker logs, copied at the end.

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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, astuple, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

from orchestrator.collectives.ceilings import Ceiling
from orchestrator.results.emulator import EmulatorLoad
from topologies.description import FabricDescription
from topologies.errors import ResultsError
from topologies.fivetuple import FiveTuple

SCHEMA_VERSION = 6  # 2: configurations.host_ports and .unpinned; 3: the monitor's layers,
#: faults, forecasts; 4: controller_restarts; 5: queue_counters; 6: ingress_drops
#: Versions this astral reads: 1 lacks configurations.unpinned (read as NULL) and
#: configurations.host_ports (read as 'unknown'); 1 and 2 lack the monitor's tables (read
#: as empty), its columns (NULL or 0), the faults and the forecasts (read as none); 1 to 3
#: lack the controller restarts (read as not recorded: ResultsBundle.controller_restarts);
#: 1 to 4 lack the egress queues' counters, 1 to 5 the switch sockets' drops (read as none).
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
#: The tables whose readers take an absent one for empty, by the schema version that added
#: them. In a bundle of that version or later an absent one is missing, not yet to come: a
#: database cut down by hand or a copy patched together (ResultsBundle.missing_tables).
TABLES_SINCE = {
    "steps": 3,
    "tcp_info": 3,
    "connection_paths": 3,
    "controller_events": 3,
    "host_cpu": 3,
    "faults": 3,
    "forecasts": 3,
    "controller_restarts": 4,
    "queue_counters": 5,
    "ingress_drops": 6,
}
APPLICATION_ID = 0x41535452  # "ASTR": marks the file as ours

DATABASE = "results.sqlite"
FABRIC = "fabric.json"
EXPERIMENT = "experiment.yaml"
SUMMARY = "summary.json"
TABLES = "tables"
PLOTS = "plots"
# a workload replay's figures and timelines, replayed and forecast (orchestrator/run/replay.py)
WORKLOAD_FILE = "workload.json"
# the probe mesh's probes and paths, and its prober's samples (orchestrator.testbed.probemesh)
PROBES_FILE = "probes.json"
PROBE_SAMPLES_FILE = "probes.jsonl"
LOGS = "logs"
# the controller's events file (controllers/events.py names it) as logs/ holds its copy
CONTROLLER_EVENTS_LOG = "events.jsonl"


def read_workload(bundle: Path) -> dict[str, Any] | None:
    """A bundle's workload.json (per policy what its replays measured and forecast:
    orchestrator/run/replay.py), or None when the bundle replayed no workload."""
    path = bundle / WORKLOAD_FILE
    if not path.is_file():
        return None
    document = json.loads(path.read_text())
    return document if isinstance(document, dict) else None


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
    start REAL,
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
    src_rank INTEGER,
    dst_rank INTEGER,
    channel INTEGER,
    link TEXT,
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
    drops INTEGER NOT NULL,
    rx_dropped INTEGER NOT NULL DEFAULT 0,
    tx_dropped INTEGER NOT NULL DEFAULT 0,
    rx_errors INTEGER NOT NULL DEFAULT 0,
    tx_errors INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX port_counters_by_port ON port_counters (switch, port, t);
CREATE INDEX port_counters_by_time ON port_counters (t);
CREATE TABLE queue_counters (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    t REAL NOT NULL,
    switch TEXT NOT NULL,
    port INTEGER NOT NULL,
    packets INTEGER NOT NULL,
    drops INTEGER NOT NULL,
    backlog INTEGER NOT NULL
);
CREATE INDEX queue_counters_by_port ON queue_counters (switch, port, t);
CREATE TABLE ingress_drops (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    t REAL NOT NULL,
    switch TEXT NOT NULL,
    port INTEGER NOT NULL,
    drops INTEGER NOT NULL
);
CREATE INDEX ingress_drops_by_port ON ingress_drops (switch, port, t);
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
CREATE TABLE steps (
    config_id INTEGER NOT NULL REFERENCES configurations(id),
    iteration INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    phase TEXT NOT NULL,
    start REAL NOT NULL,
    "end" REAL NOT NULL,
    send_peers TEXT NOT NULL,
    recv_peers TEXT NOT NULL,
    sent INTEGER NOT NULL,
    received INTEGER NOT NULL
);
CREATE INDEX steps_by_rank ON steps (config_id, rank, iteration, step);
CREATE INDEX steps_by_time ON steps (start, "end");
CREATE TABLE tcp_info (
    connection_id INTEGER NOT NULL REFERENCES connections(id),
    t REAL NOT NULL,
    rtt_us INTEGER NOT NULL,
    rttvar_us INTEGER NOT NULL,
    cwnd INTEGER NOT NULL,
    ssthresh INTEGER NOT NULL,
    retrans INTEGER NOT NULL,
    lost INTEGER NOT NULL,
    unacked INTEGER NOT NULL
);
CREATE INDEX tcp_info_by_connection ON tcp_info (connection_id, t);
CREATE TABLE connection_paths (
    connection_id INTEGER NOT NULL REFERENCES connections(id),
    hop INTEGER NOT NULL,
    node TEXT NOT NULL,
    in_port INTEGER,
    out_port INTEGER,
    source TEXT NOT NULL,
    counter_bytes INTEGER,
    PRIMARY KEY (connection_id, hop)
);
CREATE INDEX connection_paths_by_node ON connection_paths (node, out_port);
CREATE INDEX connection_samples_by_time ON connection_samples (t);
CREATE TABLE controller_events (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    t REAL NOT NULL,
    kind TEXT NOT NULL,
    switch TEXT,
    port INTEGER,
    level TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX controller_events_by_time ON controller_events (t);
CREATE TABLE host_cpu (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    start REAL NOT NULL,
    "end" REAL NOT NULL,
    idle_share REAL NOT NULL,
    vswitchd_cores REAL NOT NULL,
    vswitchd_wait REAL NOT NULL,
    softirqd_wait REAL NOT NULL,
    controller_cores REAL,
    workers_cores REAL
);
CREATE INDEX host_cpu_by_time ON host_cpu (start);
CREATE TABLE faults (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    kind TEXT NOT NULL,
    target TEXT NOT NULL,
    params TEXT NOT NULL,
    scheduled REAL,
    applied REAL,
    undone REAL,
    error TEXT
);
CREATE TABLE controller_restarts (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    began REAL NOT NULL,
    ended REAL,
    policy TEXT NOT NULL,
    reason TEXT NOT NULL
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
    start: float | None = None  # epoch s the rank began it (None: not recorded)


@dataclass(frozen=True)
class ConnectionSample:
    """Bytes a rank's connection carried in the interval (previous sample's t, t]."""

    rank: int
    five_tuple: FiveTuple
    t: float
    bytes: int


@dataclass(frozen=True)
class QueueCounter:
    """One switch port's egress queue at time ``t`` (epoch seconds): cumulative packets
    its shaper's root qdisc sent and dropped, and the bytes it held then
    (orchestrator/testbed/queues.py samples them). ``switch`` is the port's node: a GPU's
    name for a GPU's NIC port."""

    t: float
    switch: str
    port: int
    packets: int
    drops: int
    backlog: int


@dataclass(frozen=True)
class IngressDrop:
    """What one switch port received that the switch process never read, by time ``t``
    (epoch seconds): the cumulative drops of ovs-vswitchd's packet socket on the port,
    whose receive buffer was full (orchestrator/testbed/queues.py samples them). The port
    counters count such a packet received and never sent, as they count a fault's drop:
    this tells the emulator's own loss apart."""

    t: float
    switch: str
    port: int
    drops: int


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
    rx_dropped: int = 0
    tx_dropped: int = 0
    rx_errors: int = 0
    tx_errors: int = 0


@dataclass(frozen=True)
class Phase:
    """A named phase of one iteration on one rank (e.g. ``reduce-scatter``, ``all-gather``)."""

    iteration: int
    rank: int
    phase: str
    start: float
    end: float


@dataclass(frozen=True)
class StepRecord:
    """One step of one operation on one rank (the application layer at its finest): when
    it ran, whom it sent to and received from, and how many bytes, as its plan says."""

    iteration: int
    rank: int
    step: int
    phase: str
    start: float
    end: float
    send_peers: tuple[int, ...] = ()
    recv_peers: tuple[int, ...] = ()
    sent: int = 0
    received: int = 0
    warmup: bool = False


@dataclass(frozen=True)
class ConnectionRecord:
    """A connection as one end (``rank``) knows it: data flows ``src_rank`` -> ``dst_rank``
    on ``channel`` over ``link`` (fabric or nvlink)."""

    rank: int
    five_tuple: FiveTuple
    src_rank: int
    dst_rank: int
    channel: int
    link: str


@dataclass(frozen=True)
class StoredConnection:
    """A row of ``connections`` read back (the ranks, channel and link None before v3)."""

    id: int
    config_id: int
    rank: int
    five_tuple: FiveTuple
    src_rank: int | None
    dst_rank: int | None
    channel: int | None
    link: str | None


@dataclass(frozen=True)
class TcpInfoSample:
    """The sender kernel's view of a connection at ``t`` (struct tcp_info): smoothed RTT
    and its variation (us), congestion window and slow-start threshold (segments), total
    retransmitted segments, segments currently thought lost, unacknowledged segments."""

    rank: int
    five_tuple: FiveTuple
    t: float
    rtt_us: int
    rttvar_us: int
    cwnd: int
    ssthresh: int
    retrans: int
    lost: int
    unacked: int


@dataclass(frozen=True)
class PathHop:
    """One node of a connection's path: ``in_port``/``out_port`` are the node's model port
    numbers (None at the GPU it starts or ends at); ``source``: how the path is known
    (``traced``, ``pinned``, ``trace-dropped``, ``trace-unknown``, ``first-hop``:
    orchestrator.monitor.record); ``counter_bytes``: what ``out_port`` carried while the
    connection was active, by the switch counters (None: not measured)."""

    hop: int
    node: str
    in_port: int | None
    out_port: int | None
    source: str
    counter_bytes: int | None = None


@dataclass(frozen=True)
class ControllerEvent:
    """Something the controller did or saw at ``t``: ``kind`` connect, disconnect,
    port-up, port-down, reprogram, programmed, error, or ``log`` for a plain log line."""

    t: float
    kind: str
    switch: str | None
    port: int | None
    level: str
    message: str

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> ControllerEvent:
        """The event a record of the controller's events file (controllers/events.py)
        says; a record without a kind is a ``log`` line."""
        port = record.get("port")
        return cls(
            t=float(record["t"]),
            kind=str(record.get("event") or "log"),
            switch=record.get("switch"),
            port=int(port) if isinstance(port, int) else None,
            level=str(record.get("level", "")),
            message=str(record.get("message", "")),
        )


@dataclass(frozen=True)
class HostCpu:
    """The machine's CPU over [start, end]: idle share of all CPUs; cores used by
    ovs-vswitchd, the controller and the workers (None: not watched); the wait shares of
    ovs-vswitchd's main thread and the softirq threads (orchestrator.testbed.cpuload)."""

    start: float
    end: float
    idle_share: float
    vswitchd_cores: float
    vswitchd_wait: float
    softirqd_wait: float
    controller_cores: float | None = None
    workers_cores: float | None = None


@dataclass(frozen=True)
class InjectedFault:
    """One fault a run injected: its id, kind, target and keys (``params``, as written),
    when it was due, applied and undone (epoch seconds; None: never), and what failed."""

    id: int
    kind: str
    target: str
    params: Mapping[str, Any]
    scheduled: float | None = None
    applied: float | None = None
    undone: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class ControllerRestart:
    """A controller restart the run made itself: ``reason`` ``policy`` (a policy switch)
    or ``monitor`` (the counter polling changed); ``policy`` the one in force after it;
    ``began`` when the old process was stopped, ``ended`` when every switch was programmed
    again (epoch seconds; None: not, or not yet). Kept because a restart looks the same
    from the controller's side whoever made it: the diagnosis must know the run's own."""

    began: float
    ended: float | None
    policy: str
    reason: str


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


# The monitor's tables' columns, as their records name them (after the row's owner id).
_TCP = tuple(f.name for f in fields(TcpInfoSample))[2:]  # after rank and five_tuple
_PATH_HOP = tuple(f.name for f in fields(PathHop))
_CONTROLLER_EVENT = tuple(f.name for f in fields(ControllerEvent))
_HOST_CPU = tuple(f.name for f in fields(HostCpu))
_CONTROLLER_RESTART = tuple(f.name for f in fields(ControllerRestart))


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


def counter_delta(
    db: sqlite3.Connection, switch: str, port: int | None, column: str, start: float, end: float
) -> int | None:
    """What a port counter (``tx_bytes``, ``rx_bytes``, ...) counted over [start, end]: from
    its last sample at or before ``start`` to its first at or after ``end``, so that the
    interval is covered (None without both samples, or across a counter reset)."""
    if port is None:
        return None
    before = db.execute(
        f"SELECT {column} FROM port_counters WHERE switch = ? AND port = ? AND t <= ?"
        " ORDER BY t DESC LIMIT 1",
        (switch, port, start),
    ).fetchone()
    after = db.execute(
        f"SELECT {column} FROM port_counters WHERE switch = ? AND port = ? AND t >= ?"
        " ORDER BY t LIMIT 1",
        (switch, port, end),
    ).fetchone()
    if before is None or after is None or after[0] < before[0]:
        return None
    return int(after[0] - before[0])


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
            (config_id, int(r.warmup), r.iteration, r.rank, r.time_us, r.bytes, r.wrong, r.start)
            for r in records
        ]
        with self._db:
            self._db.executemany(
                "INSERT INTO iterations (config_id, warmup, iteration, rank, time_us, bytes,"
                " wrong, start) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
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

    def add_connections(self, config_id: int, connections: Iterable[ConnectionRecord]) -> int:
        """Who is at each end of a configuration's connections (before or after their
        samples: a connection row is made once per end and completed here)."""
        count = 0
        with self._db:
            for c in connections:
                connection_id = self._connection(config_id, c.rank, c.five_tuple)
                self._db.execute(
                    "UPDATE connections SET src_rank = ?, dst_rank = ?, channel = ?, link = ?"
                    " WHERE id = ?",
                    (c.src_rank, c.dst_rank, c.channel, c.link, connection_id),
                )
                count += 1
        return count

    def connection_id(self, config_id: int, rank: int, five: FiveTuple) -> int:
        """The row of ``rank``'s end of a connection (made if new)."""
        return self._connection(config_id, rank, five)

    def add_tcp_info(self, config_id: int, samples: Iterable[TcpInfoSample]) -> int:
        """The senders' TCP_INFO samples of a configuration's connections."""
        rows = [
            (self._connection(config_id, s.rank, s.five_tuple), *(getattr(s, f) for f in _TCP))
            for s in samples
        ]
        return self._insert("tcp_info", ("connection_id", *_TCP), rows)

    def add_path(self, connection_id: int, hops: Iterable[PathHop]) -> int:
        """The path of one connection (its row from :meth:`connection_id`), hop by hop."""
        rows = [(connection_id, *astuple(h)) for h in hops]
        return self._insert("connection_paths", ("connection_id", *_PATH_HOP), rows, "OR REPLACE")

    def confirm_paths(self) -> int:
        """Fill every path hop's ``counter_bytes``: what the switch counters say the hop's
        link carried while its connection was active (from the last counter sample at or
        before the connection's first throughput sample to the first at or after its last).
        A switch's hop is its own transmit counter on ``out_port``; a GPU's (not polled)
        is the next switch's receive counter on its ``in_port``. Call it once the port
        counters are in; returns the hops filled."""
        hops = self._db.execute(
            "SELECT p.connection_id, p.hop, p.node, p.out_port, n.node, n.in_port,"
            " MIN(s.t), MAX(s.t) FROM connection_paths AS p"
            " JOIN connection_paths AS n ON n.connection_id = p.connection_id"
            " AND n.hop = p.hop + 1"
            " JOIN connection_samples AS s ON s.connection_id = p.connection_id"
            " GROUP BY p.connection_id, p.hop"
        ).fetchall()
        filled = 0
        with self._db:
            for connection_id, hop, node, out_port, after, in_port, first, last in hops:
                carried = counter_delta(self._db, node, out_port, "tx_bytes", first, last)
                if carried is None:
                    carried = counter_delta(self._db, after, in_port, "rx_bytes", first, last)
                if carried is None:
                    continue
                self._db.execute(
                    "UPDATE connection_paths SET counter_bytes = ? WHERE connection_id = ?"
                    " AND hop = ?",
                    (carried, connection_id, hop),
                )
                filled += 1
        return filled

    def add_steps(self, config_id: int, steps: Iterable[StepRecord]) -> int:
        """Every step of every operation of every rank of a configuration."""
        rows = [
            (
                config_id,
                s.iteration,
                s.rank,
                s.step,
                s.phase,
                s.start,
                s.end,
                json.dumps(list(s.send_peers)),
                json.dumps(list(s.recv_peers)),
                s.sent,
                s.received,
            )
            for s in steps
        ]
        with self._db:
            self._db.executemany(
                'INSERT INTO steps (config_id, iteration, rank, step, phase, start, "end",'
                " send_peers, recv_peers, sent, received) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " ?, ?)",
                rows,
            )
        return len(rows)

    def add_controller_events(self, events: Iterable[ControllerEvent]) -> int:
        rows = [(self.run_id, *astuple(e)) for e in events]
        return self._insert("controller_events", ("run_id", *_CONTROLLER_EVENT), rows)

    def add_host_cpu(self, intervals: Iterable[HostCpu]) -> int:
        rows = [(self.run_id, *astuple(c)) for c in intervals]
        return self._insert("host_cpu", ("run_id", *_HOST_CPU), rows)

    def _insert(
        self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]], verb: str = ""
    ) -> int:
        """Rows into one of the monitor's tables, columns named as its record's fields."""
        names = ", ".join(f'"{c}"' for c in columns)
        marks = ", ".join("?" * len(columns))
        with self._db:
            self._db.executemany(f"INSERT {verb} INTO {table} ({names}) VALUES ({marks})", rows)
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
                c.rx_dropped,
                c.tx_dropped,
                c.rx_errors,
                c.tx_errors,
            )
            for c in counters
        ]
        with self._db:
            self._db.executemany(
                "INSERT INTO port_counters (run_id, t, switch, port, rx_bytes, tx_bytes,"
                " rx_packets, tx_packets, drops, rx_dropped, tx_dropped, rx_errors, tx_errors)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def add_queue_counters(self, counters: Iterable[QueueCounter]) -> int:
        """Switch ports' egress queue counters (orchestrator/testbed/queues.py)."""
        rows = [
            (self.run_id, c.t, c.switch, c.port, c.packets, c.drops, c.backlog) for c in counters
        ]
        with self._db:
            self._db.executemany(
                "INSERT INTO queue_counters (run_id, t, switch, port, packets, drops, backlog)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def add_ingress_drops(self, drops: Iterable[IngressDrop]) -> int:
        """Switch ports' packet socket drops (orchestrator/testbed/queues.py)."""
        rows = [(self.run_id, d.t, d.switch, d.port, d.drops) for d in drops]
        with self._db:
            self._db.executemany(
                "INSERT INTO ingress_drops (run_id, t, switch, port, drops) VALUES (?, ?, ?, ?, ?)",
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

    def add_faults(self, faults: Iterable[InjectedFault]) -> int:
        """The run's injected faults, with their instants (the fault scheduler's outcome)."""
        rows = [
            (f.id, self.run_id, f.kind, f.target, json.dumps(dict(f.params), sort_keys=True),
             f.scheduled, f.applied, f.undone, f.error)
            for f in faults
        ]  # fmt: skip
        with self._db:
            self._db.executemany(
                "INSERT INTO faults (id, run_id, kind, target, params, scheduled, applied,"
                " undone, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def add_controller_restarts(self, restarts: Iterable[ControllerRestart]) -> int:
        """The controller restarts the run made itself (its policy switches), in order."""
        rows = [(self.run_id, *astuple(r)) for r in restarts]
        return self._insert("controller_restarts", ("run_id", *_CONTROLLER_RESTART), rows)

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


#: SQLite errors that are a bug of the reader's, not damage to the file: never reworded.
_READER_BUGS = (sqlite3.ProgrammingError, sqlite3.IntegrityError, sqlite3.NotSupportedError)


@contextmanager
def readable_database(*bundles: str | Path) -> Iterator[None]:
    """Turn an SQLite error met while reading the databases of ``bundles`` into one
    ResultsError naming them (exit 6).

    Why: :meth:`ResultsBundle.open` checks the file's header, version and first run only.
    A page damaged further in (bit rot, a copy patched together) or a table missing (a
    database cut down by hand) fails at the first query that reaches it, deep in the
    reader, the report or the diagnosis, as a traceback that exits 1, which ``astral
    diagnose`` also uses for "suspects found"."""
    try:
        yield
    except sqlite3.DatabaseError as err:
        if isinstance(err, _READER_BUGS):
            raise
        raise ResultsError(
            " or ".join(str(b) for b in bundles),
            f"an intact {DATABASE} database (damaged, or missing part of its schema)",
            f"{type(err).__name__}: {err}",
        ) from None


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
            with readable_database(path):
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
        start = "start" if self.version >= 3 else "NULL"
        rows = self._db.execute(
            f"SELECT iteration, rank, time_us, bytes, wrong, warmup, {start} FROM iterations"
            " WHERE config_id = ? ORDER BY warmup DESC, iteration, rank",
            (config_id,),
        ).fetchall()
        return [IterationRecord(r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6]) for r in rows]

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
        detail = (
            "rx_dropped, tx_dropped, rx_errors, tx_errors" if self.version >= 3 else "0, 0, 0, 0"
        )
        rows = self._db.execute(
            "SELECT t, switch, port, rx_bytes, tx_bytes, rx_packets, tx_packets, drops,"
            f" {detail} FROM port_counters ORDER BY switch, port, t"
        )
        for row in rows:
            yield PortCounter(*row)

    def queue_counters(self) -> list[QueueCounter]:
        """The switch ports' egress queue samples, by port and time (none before version 5)."""
        if not self.has_table("queue_counters"):
            return []
        rows = self._db.execute(
            "SELECT t, switch, port, packets, drops, backlog FROM queue_counters"
            " ORDER BY switch, port, t"
        )
        return [QueueCounter(*row) for row in rows]

    def ingress_drops(self) -> list[IngressDrop]:
        """The switch ports' packet socket drops, by port and time (none before version 6)."""
        if not self.has_table("ingress_drops"):
            return []
        rows = self._db.execute(
            "SELECT t, switch, port, drops FROM ingress_drops ORDER BY switch, port, t"
        )
        return [IngressDrop(*row) for row in rows]

    # --- the monitor's layers (version 3; empty in older bundles) --------------------------

    def has_table(self, name: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return row is not None

    def counter_delta(
        self, switch: str, port: int, column: str, start: float, end: float
    ) -> int | None:
        """What a port counter counted over [start, end] (:func:`counter_delta`)."""
        return counter_delta(self._db, switch, port, column, start, end)

    def _monitor_rows(
        self, table: str, statement: str, parameters: Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:
        """The rows of a query on one of the monitor's tables; none in a bundle without it."""
        if not self.has_table(table):
            return []
        return self._db.execute(statement, tuple(parameters)).fetchall()

    def sql(self, statement: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read-only query (the monitor's queries, orchestrator.monitor.queries,
        use the indexes the schema declares for them)."""
        return self._db.execute(statement, tuple(parameters)).fetchall()

    def connections(self, config_id: int | None = None) -> list[StoredConnection]:
        """Every connection end (of one configuration if given), by id."""
        ends = "src_rank, dst_rank, channel, link"
        if self.version < 3:
            ends = "NULL, NULL, NULL, NULL"
        where, params = "", tuple[int, ...]()
        if config_id is not None:
            where, params = "WHERE config_id = ?", (config_id,)
        rows = self._db.execute(
            f"SELECT id, config_id, rank, protocol, src_ip, src_port, dst_ip, dst_port, {ends}"
            f" FROM connections {where} ORDER BY id",
            params,
        ).fetchall()
        return [
            StoredConnection(r[0], r[1], r[2], FiveTuple(r[4], r[5], r[6], r[7], r[3]), *r[8:])
            for r in rows
        ]

    def steps(self, config_id: int) -> list[StepRecord]:
        rows = self._monitor_rows(
            "steps",
            'SELECT s.iteration, s.rank, s.step, s.phase, s.start, s."end", s.send_peers,'
            " s.recv_peers, s.sent, s.received, COALESCE(i.warmup, 0) FROM steps AS s"
            " LEFT JOIN iterations AS i ON i.config_id = s.config_id"
            " AND i.iteration = s.iteration AND i.rank = s.rank"
            " WHERE s.config_id = ? ORDER BY s.iteration, s.rank, s.step",
            (config_id,),
        )
        return [
            StepRecord(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                r[5],
                tuple(json.loads(r[6])),
                tuple(json.loads(r[7])),
                r[8],
                r[9],
                bool(r[10]),
            )
            for r in rows
        ]

    def tcp_info(self, connection_id: int) -> list[TcpInfoSample]:
        """A connection's TCP_INFO samples in time order (rank and five-tuple its row's)."""
        rows = self._monitor_rows(
            "tcp_info",
            "SELECT c.rank, c.src_ip, c.src_port, c.dst_ip, c.dst_port, c.protocol, i.t,"
            " i.rtt_us, i.rttvar_us, i.cwnd, i.ssthresh, i.retrans, i.lost, i.unacked"
            " FROM tcp_info AS i JOIN connections AS c ON c.id = i.connection_id"
            " WHERE i.connection_id = ? ORDER BY i.t",
            (connection_id,),
        )
        return [TcpInfoSample(r[0], FiveTuple(r[1], r[2], r[3], r[4], r[5]), *r[6:]) for r in rows]

    def paths(self) -> dict[int, list[PathHop]]:
        """Connection id -> its path, hop by hop (connections without one are absent)."""
        paths: dict[int, list[PathHop]] = {}
        for row in self._monitor_rows(
            "connection_paths",
            "SELECT connection_id, hop, node, in_port, out_port, source, counter_bytes"
            " FROM connection_paths ORDER BY connection_id, hop",
        ):
            paths.setdefault(row[0], []).append(PathHop(*row[1:]))
        return paths

    def controller_events(self) -> list[ControllerEvent]:
        rows = self._monitor_rows(
            "controller_events",
            "SELECT t, kind, switch, port, level, message FROM controller_events ORDER BY t",
        )
        return [ControllerEvent(*row) for row in rows]

    def logged_controller_events(self) -> list[ControllerEvent] | None:
        """The controller's events from the bundle's copy of its events file (logs/), those
        from the run's start on; None without the file. The runner fills the
        ``controller_events`` table and this copy from the same file at the same moment, so
        a bundle whose table is missing (:meth:`missing_tables`) still has its events here.
        Lines that do not parse are skipped, as the controller's own reader does (the last
        one of a killed run may be half written)."""
        path = self.path / LOGS / CONTROLLER_EVENTS_LOG
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        try:
            since = datetime.fromisoformat(self.run.started).timestamp()
        except ValueError:
            since = float("-inf")
        events = []
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            timed = isinstance(record, dict) and isinstance(record.get("t"), (int, float))
            if timed and record["t"] >= since:
                events.append(ControllerEvent.of_record(record))
        return sorted(events, key=lambda e: e.t)

    def missing_tables(self) -> list[str]:
        """The tables of :data:`TABLES_SINCE` this bundle's schema version has and its
        database lacks, sorted: damage. Why: their readers return nothing for an absent
        table, as for an older bundle's; a reader that concludes from absence (no port went
        down, so a stall is a blackhole) must know when absence means "not recorded"."""
        return sorted(
            table
            for table, since in TABLES_SINCE.items()
            if self.version >= since and not self.has_table(table)
        )

    def controller_restarts(self) -> list[ControllerRestart] | None:
        """The controller restarts the run made itself, in order; None in a bundle from
        before they were recorded (version 3 or older), where they are not known."""
        if not self.has_table("controller_restarts"):
            return None
        rows = self._db.execute(
            "SELECT began, ended, policy, reason FROM controller_restarts ORDER BY began"
        ).fetchall()
        return [ControllerRestart(*row) for row in rows]

    def host_cpu(self) -> list[HostCpu]:
        rows = self._monitor_rows(
            "host_cpu",
            'SELECT start, "end", idle_share, vswitchd_cores, vswitchd_wait, softirqd_wait,'
            " controller_cores, workers_cores FROM host_cpu ORDER BY start",
        )
        return [HostCpu(*row) for row in rows]

    def faults(self) -> list[InjectedFault]:
        """The faults the run injected, by id (empty without the table or rows)."""
        rows = self._monitor_rows(
            "faults",
            "SELECT id, kind, target, params, scheduled, applied, undone, error FROM faults"
            " ORDER BY id",
        )
        faults = []
        for r in rows:
            try:
                params = json.loads(r[3]) if r[3] else {}
            except ValueError:
                params = {"raw": r[3]}
            faults.append(
                InjectedFault(r[0], r[1] or "", r[2] or "", params, r[4], r[5], r[6], r[7])
            )
        return faults

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
