"""``astral run``: an experiment from start to finish, and the results bundle it leaves.

::

    spec = load(path)                     # ExperimentSpec; errors are ConfigErrors (exit 2)
    outcome = Runner(spec, RunOptions(), text=path.read_text()).run()
    outcome.bundle                        # results/<timestamp>-<name>/

What :meth:`Runner.run` does, in order:

1. load guard (:func:`load_guard`): the experiment's offered load against the emulator's
   measured capacity (``astral calibrate``), refusing above the safe share unless forced;
   with ``RunOptions.calibrate`` (``astral run``'s default) and no calibration on the
   machine, the quick calibration runs first, once, and is stored (``ensure_calibration``);
2. brings the fabric up once (:class:`~orchestrator.testbed.testbed.Testbed`: Mininet, controller,
   readiness; it takes the run lock) under the first policy;
3. per policy (policies vary slowest, :meth:`ExperimentSpec.steps`): reprograms the fabric
   (a controller restart on the same port, hitless, its instants kept in the bundle's
   ``controller_restarts`` so that the diagnosis knows it for the run's own); then per
   collective starts one worker per GPU of the placement, with the connections that
   collective needs (as many per peer as spread its fabric traffic over the NIC ports,
   orchestrator.collectives.ceilings.default_channels; their NIC ports as the experiment's
   ``host_ports`` says, orchestrator.testbed.hostports, and their source ports pinned to
   disjoint paths under ``path-pinned``), runs ``warmup +
   iterations`` operations per size, records them and prints the nccl-tests table
   (real-speed columns included); meanwhile a thread samples the CPU (idle share,
   ovs-vswitchd's and the softirq threads'), and each configuration is judged on its
   measured window: was the emulator saturated (orchestrator.calibration.saturation)? The
   verdict goes into the bundle and the header of the configuration's table;
   the experiment's ``faults:`` are applied and undone on their schedule meanwhile by a
   thread (orchestrator.testbed.faults: ``at`` counts from the first timed batch's start),
   and whatever is still in effect is undone before the bundle is closed, the faults and
   their instants in its ``faults`` table; after each batch, every fabric connection is
   followed through the switches (orchestrator.testbed.tracing) and its path recorded as
   the switches forward it;
4. tears the fabric down, renders the bundle's summary, tables and plots, and prints a
   side-by-side summary with the run's conditions (among them the minimum RTO the workers'
   connections got: a warning where the kernel's 200 ms floor holds).

Every number printed follows one definition of time (orchestrator.collectives.nccl.TIME_DEFINITION,
nccl-tests ``-a 1``): the tables printed during the run are computed by the same function
as the bundle's (orchestrator.results.summary.result_of) from the same records.

The bundle (orchestrator.results.store has the layout) gets, besides what ResultsWriter
writes, ``run.json``: what the runner knew and the database has no place for: the command,
the conditions (load average, datapath, TSO, cores, the minimum RTO the kernel grants and
what the workers' connections got), the load guard's verdict, timings
(bring-up, each policy switch, each step, teardown), each tracing of the connections'
paths (``path_traces``: outcomes, traces, seconds) and, if the run failed, the failing
ranks and hosts.

Endings: a worker that dies or hangs ends the run (the launcher names the rank and host),
the fabric is torn down, the bundle is marked ``failed``, exit status 4. A run that
completes but whose data failed verification in any configuration (#wrong > 0) is marked
``failed`` too and exits 7, naming each such configuration (nccl-tests also exits non-zero
when its check fails). Ctrl-C and SIGTERM
tear down too (the Emulation handles its part) and mark the bundle ``interrupted``
(exit 130, 143). The bundle keeps whatever was measured before the end.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from controllers.events import EVENTS_NAME
from orchestrator import REPO
from orchestrator.calibration.capacity import Calibration
from orchestrator.calibration.saturation import DEFAULT_THRESHOLDS, judge_test
from orchestrator.cluster.emulation import ClusterEmulation, cluster_of
from orchestrator.collectives.ceilings import Ceiling
from orchestrator.collectives.nccl import TIME_DEFINITION, average_busbw, bus_factor
from orchestrator.collectives.plans import Layout
from orchestrator.collectives.program import PROGRAM, Program
from orchestrator.collectives.sizes import format_size
from orchestrator.diagnosis import diagnose_bundle
from orchestrator.diagnosis.detectors import QUIET_AFTER_S
from orchestrator.diagnosis.live import LiveDiagnosis
from orchestrator.diagnosis.proberecord import ProbeFollower, ProbeRecord
from orchestrator.emulation.network import Terminated
from orchestrator.emulation.recipe import current_recipe, packet_scale_of
from orchestrator.forecast.calibration import ForecastCalibration, load_forecast_calibration
from orchestrator.forecast.configurations import Forecaster
from orchestrator.forecast.program import ProgramForecast, ProgramForecaster
from orchestrator.forecast.report import forecast_record
from orchestrator.monitor import record
from orchestrator.monitor.report import render_monitor
from orchestrator.results import (
    ConnectionSample,
    IterationRecord,
    Phase,
    ResultsWriter,
    Versions,
)
from orchestrator.results.emulator import EmulatorLoad
from orchestrator.results.store import (
    WORKLOAD_FILE,
    Configuration,
    ForecastRecord,
    IngressDrop,
    InjectedFault,
    QueueCounter,
)
from orchestrator.results.summary import (
    ConfigurationResult,
    configuration_table,
    forecast_note,
    iterations_text,
    result_of,
)
from orchestrator.run.alerts import live_builder
from orchestrator.run.experiment import (
    Collective,
    ConfigurationStep,
    ExperimentSpec,
)
from orchestrator.run.interrupts import noted_interrupts
from orchestrator.run.loadguard import LoadVerdict, ensure_calibration, load_guard
from orchestrator.run.replay import (
    BALANCED_OVER,
    ReplayResult,
    replay_options,
    replay_record,
    replay_table,
    slot_ops,
    workload_report,
)
from orchestrator.testbed.cpuload import CpuSample, CpuSampler, host_intervals
from orchestrator.testbed.faults import Stragglers, injector_on
from orchestrator.testbed.faultschedule import FAULT_LOG, FaultLog, FaultOutcome, FaultScheduler
from orchestrator.testbed.monitoring import monitor_level
from orchestrator.testbed.probemesh import ProbeMesh
from orchestrator.testbed.queues import QueueSampler, unread_per_port
from orchestrator.testbed.testbed import Testbed
from orchestrator.testbed.tracing import PathTraces
from orchestrator.worker import rto
from orchestrator.worker.launcher import Launcher
from orchestrator.worker.outcome import CollectiveResult, Failure, RunResult, phase_spans
from orchestrator.worker.spec import CollectiveTest, LaunchOptions
from orchestrator.workload.iteration import iteration_program
from topologies.description import FabricDescription
from topologies.errors import AstralError, EmulationError, WrongResultsError
from topologies.generators import build_fabric
from topologies.latency import latency_record, latency_title

DEFAULT_EXPERIMENT = REPO / "experiments" / "default.yaml"
RUN_FILE = "run.json"
DIAGNOSIS_FILE = "diagnosis.json"  # astral diagnose's answer at the end of the run
TELEMETRY_FILE = "telemetry.jsonl"  # the controller's, copied (docs/telemetry.md)
EXIT_WORKERS_FAILED = EmulationError.exit_status

Say = Callable[[str], None]


@dataclass(frozen=True)
class RunOptions:
    """How to run an experiment (command-line options; defaults are ``astral run``'s)."""

    out: Path | None = None  # the bundle directory; default results/<timestamp>-<name>
    results_root: Path = Path("results")
    force: bool = False  # run even above the emulator's safe load (= load_limit.force)
    # without a calibration file, run the quick calibration first and store it (astral run
    # does; the library's callers, the pytest plugin and the tests never measure unasked)
    calibrate: bool = False
    progress: bool = False  # a tqdm bar on stderr
    plots: bool = True
    ready_timeout: float = 60.0
    lock_wait: float = 0.0  # seconds to wait for another run's lock (0: refuse at once)
    state_base: Path | None = None
    step_deadline: float = 30.0  # a step running longer than this is hung (launcher)
    channels: int | None = None  # connections per peer pair; None: per collective
    # (orchestrator.collectives.ceilings.default_channels: enough to spread over the NIC ports)
    worker_args: tuple[str, ...] = ()  # extra worker argv (tests: fault injection)
    monitor: str | None = None  # the monitor's detail level; None: the experiment's


@dataclass
class RunOutcome:
    """How a run ended. ``status``: ok, failed, interrupted."""

    spec: ExperimentSpec
    status: str = "running"
    bundle: Path | None = None
    failure: Failure | None = None
    error: str | None = None
    exit_status: int = 0
    results: list[ConfigurationResult] = field(default_factory=list)
    verdict: LoadVerdict | None = None
    timings: dict[str, Any] = field(default_factory=dict)
    # (policy, collective label) -> (connections left unpinned, fabric connections), for
    # the launches whose policy pins source ports
    pinning: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    # (policy, collective label) -> each connection's minimum RTO as its sender reported it
    # (None: not in effect; orchestrator.worker.rto)
    rto_min: dict[tuple[str, str], list[int | None]] = field(default_factory=dict)
    # a workload's replay per policy (orchestrator/run/replay.py) and its forecast
    replays: dict[str, ReplayResult] = field(default_factory=dict)
    replay_forecasts: dict[str, ProgramForecast] = field(default_factory=dict)

    def rto_floors(self) -> list[int | None]:
        """Every launch's connections' minimum RTO, in one list."""
        return [floor for floors in self.rto_min.values() for floor in floors]

    def wrong_results(self) -> list[ConfigurationResult]:
        """The configurations whose data failed verification (#wrong > 0)."""
        return [r for r in self.results if r.row.wrong is not None and r.row.wrong > 0]

    emulator: dict[int, EmulatorLoad] = field(default_factory=dict)  # config id -> verdict

    def averages(self) -> dict[tuple[str, str, str], float]:
        """(policy, collective, algorithm) -> average busbw, GB/s emulated."""
        groups: dict[tuple[str, str, str], list[ConfigurationResult]] = {}
        for result in self.results:
            groups.setdefault(result.configuration.group, []).append(result)
        return {g: average_busbw([m.row for m in members]) for g, members in groups.items()}


# --- software versions and conditions --------------------------------------------------------


def software_versions() -> Versions:
    """Python, Mininet, os-ken and Open vSwitch (``ovs-vswitchd --version``) as found."""
    from importlib import metadata

    def package(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "unknown"

    try:
        from mininet.net import VERSION as mininet_version
    except ImportError:
        mininet_version = package("mininet")
    try:
        first = subprocess.run(
            ["ovs-vswitchd", "--version"], capture_output=True, text=True, check=False, timeout=10
        ).stdout.splitlines()[0]
        ovs = first.rsplit(" ", 1)[-1] if first else "unknown"
    except (OSError, IndexError, subprocess.SubprocessError):
        ovs = "unknown"
    return Versions(platform.python_version(), str(mininet_version), package("os-ken"), ovs)


def conditions() -> dict[str, Any]:
    """What else ran on this machine (the load average and its cores), and the minimum RTO
    this kernel grants a new TCP socket, in us (None: the 200 ms floor holds;
    orchestrator.worker.rto)."""
    return {
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "tcp_rto_min_us": rto.probe()[1],
    }


def rto_min_summary(floors: Sequence[int | None]) -> dict[str, Any]:
    """run.json's account of the workers' connections' minimum RTO (their senders' reports)."""
    granted = sorted({f for f in floors if f is not None})
    return {
        "requested_us": rto.RTO_MIN_US,
        "connections": len(floors),
        "in_effect": sum(f is not None for f in floors),
        "granted_us": granted,
    }


def rto_min_line(floors: Sequence[int | None]) -> str:
    """One sentence on the connections' minimum RTO: in effect everywhere, or a warning
    with what it costs."""
    missing = sum(f is None for f in floors)
    if not missing:
        granted = "/".join(f"{f / 1000:g}" for f in sorted({f for f in floors if f}))
        return (
            f"minimum RTO {granted} ms on all {len(floors)} connections "
            f"({rto.RTO_MIN_US / 1000:g} ms asked, in the kernel's clock ticks)"
        )
    return (
        f"WARNING: the {rto.RTO_MIN_US / 1000:g} ms minimum RTO is not in effect on {missing} "
        f"of {len(floors)} connections (this kernel lacks TCP_RTO_MIN_US, Linux 6.15+): a "
        f"transfer whose tail an incast drops waits {rto.KERNEL_RTO_MIN_US / 1000:g} ms for "
        "its retransmission, so small all-to-all sizes measure that timer, not the fabric "
        "(astral doctor checks it)"
    )


# --- from the launcher's results to the bundle's records -------------------------------------


def iteration_records(test: CollectiveResult) -> list[IterationRecord]:
    return [
        IterationRecord(
            iteration=iteration.iteration,
            rank=rank.rank,
            time_us=rank.time_us,
            bytes=rank.sent,
            wrong=rank.wrong,  # -1: not verified (the bundle keeps it so)
            warmup=iteration.warmup,
            start=rank.start,
        )
        for iteration in test.iterations
        for rank in iteration.ranks.values()
    ]


def timeline_records(test: CollectiveResult) -> list[Phase]:
    """Every rank's phases per iteration, steps of one phase merged (outcome.phase_spans)."""
    return [
        Phase(iteration.iteration, rank.rank, span.phase, span.start, span.end)
        for iteration in test.iterations
        for rank in iteration.ranks.values()
        for span in phase_spans(rank.phases)
    ]


def sample_records(result: RunResult) -> list[ConnectionSample]:
    return [
        ConnectionSample(
            rank=sample.rank,
            five_tuple=sample.connection.five_tuple,
            t=sample.t,
            bytes=sample.bytes,
        )
        for sample in result.samples
    ]


def record_test(
    writer: ResultsWriter,
    policy: str,
    test: CollectiveResult,
    result: RunResult,
    *,
    iterations: int,
    warmup: int,
    host_ports: str,
    dtype: str = "uint32",
    unpinned: int | None = None,  # its connections left unpinned (None: none pinned)
) -> tuple[int, Configuration, list[IterationRecord]]:
    """One collective x size of a run into the bundle; returns (id, configuration, records).
    ``iterations`` is what was asked; the configuration records how many timed iterations
    ran (the launcher lengthens short operations' batches)."""
    t = test.test
    iterations = len(test.timed()) or iterations
    from orchestrator.collectives.operations import operation

    if t.collective == PROGRAM:  # a workload's iteration: its elements, all ops together
        count = test.count
    else:
        count = operation(t.collective).table_count(test.count, test.ranks)
    config_id = writer.add_configuration(
        policy=policy,
        collective=t.collective,
        algorithm=t.algorithm,
        size=test.size,
        count=count,
        dtype=dtype,
        ranks=test.ranks,
        iterations=iterations,
        warmup=warmup,
        host_ports=host_ports,
        unpinned=unpinned,
    )
    records = iteration_records(test)
    writer.add_iterations(config_id, records)
    writer.add_timelines(config_id, timeline_records(test))
    writer.add_samples(config_id, sample_records(result))
    configuration = Configuration(
        config_id,
        policy,
        t.collective,
        t.algorithm,
        test.size,
        count,
        dtype,
        test.ranks,
        iterations,
        warmup,
        host_ports,
        unpinned,
    )
    return config_id, configuration, records


# --- progress ----------------------------------------------------------------------------------


class BarOwner:
    """Owns a tqdm bar (or None): writes above it, closes it once."""

    bar: Any = None

    def write(self, text: str, file: TextIO) -> None:
        write_above(self.bar, text, file)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar = None


class Progress(BarOwner):
    """A tqdm bar over the experiment's steps, weighted by their expected seconds (so the
    ETA is meaningful when sizes grow by 4x a step); silent when disabled."""

    def __init__(
        self,
        steps: Sequence[ConfigurationStep],
        rate: float,
        enabled: bool,
        latencies: Mapping[int, float] | None = None,
    ) -> None:
        latencies = latencies or {}
        self.weights = {s.index: step_seconds(s, rate) + latencies.get(s.index, 0.0) for s in steps}
        self.bar: Any = progress_bar(sum(self.weights.values())) if enabled else None

    def step(self, step: ConfigurationStep) -> None:
        if self.bar is not None:
            size = format_size(step.size)
            self.bar.set_description_str(
                f"{step.policy} / {step.collective.label} / {size} "
                f"[{step.index + 1}/{len(self.weights)}]"
            )

    def done(self, step: ConfigurationStep) -> None:
        if self.bar is not None:
            self.bar.update(round(self.weights[step.index], 1))


def write_above(bar: Any, text: str, file: TextIO) -> None:
    """``text`` on ``file``, above the bar where one shows (tqdm keeps it drawn below)."""
    if bar is not None:
        bar.write(text.rstrip("\n"), file=file)
    else:
        print(text.rstrip("\n"), file=file, flush=True)


def quick_calibration(say: Say, packet_scale: int = 1) -> Calibration:
    """``astral calibrate --quick`` on its default fabric (orchestrator.calibration): what
    ``astral run`` measures once on a machine without a calibration (a study too), for a
    run whose packets have ``packet_scale`` (orchestrator.emulation.recipe)."""
    from orchestrator.calibration.measure import QUICK_PLAN, calibrate
    from topologies.catalog import DEFAULT_PRESET, resolve_fabric
    from topologies.spec import load_fabric_spec

    fabric = load_fabric_spec(resolve_fabric(DEFAULT_PRESET))
    return calibrate(fabric, QUICK_PLAN, lock_wait=0.0, log=say, packet_scale=packet_scale)


def progress_bar(total: float) -> Any:
    """A tqdm bar on stderr over ``total`` expected seconds, with the ETA."""
    from tqdm import tqdm

    return tqdm(
        total=round(total, 1),
        file=sys.stderr,
        dynamic_ncols=True,
        bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}",
        leave=False,
    )


def bundle_directory(options: RunOptions, name: str) -> Path:
    """Where a run's (or a study's) bundle goes: ``--out``, else results/<time>-<name>."""
    if options.out is not None:
        return options.out
    stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
    return options.results_root / f"{stamp}-{name}"


class Messages:
    """Status lines (``say``, to stderr through the caller's function) and output
    (``emit``, tables to ``out``), written above the progress bar while one shows."""

    progress: Any
    out: TextIO
    _say: Say | None

    def say(self, message: str) -> None:
        if self._say is None:
            return
        if self.progress is not None and self.progress.bar is not None:
            self.progress.write(f"astral: {message}", sys.stderr)
        else:
            self._say(message)

    def emit(self, text: str) -> None:
        if self.progress is not None:
            self.progress.write(text, self.out)
        else:
            print(text.rstrip("\n"), file=self.out, flush=True)


def step_seconds(
    step: ConfigurationStep, rate: float, efficiency: float = 0.6, overhead: float = 0.05
) -> float:
    """A rough time of one operation of ``step`` at ``efficiency`` of the per-GPU rate
    (bytes/s); every step runs the same number of operations, so it is a fair weight."""
    if step.collective.op == PROGRAM:  # a workload's replay: its busiest rank's compute
        return overhead + step.floor_s
    traffic = step.size * bus_factor(step.collective.op, step.ranks)
    return overhead + traffic / max(rate * efficiency, 1.0)


# --- the runner ------------------------------------------------------------------------------


class Runner(Messages):
    """Runs one experiment (see the module docstring). ``out``: where tables go (stdout);
    ``say``: status messages (stderr)."""

    def __init__(
        self,
        spec: ExperimentSpec,
        options: RunOptions | None = None,
        *,
        text: str | None = None,
        out: TextIO | None = None,
        say: Say | None = None,
        command: Sequence[str] = (),
        progress: Progress | None = None,
    ) -> None:
        self.spec = spec
        # a bar the caller owns (a study's, over all its variants); None: the run's own
        self.given_progress = progress
        self.options = options or RunOptions()
        self.text = text
        self.out = out or sys.stdout
        self._say = say
        self.command = list(command)
        self.progress: Progress | None = None
        self.run_file: dict[str, Any] = {}
        self.calibrated_in: float | None = None  # seconds the quick calibration took
        # the experiment's faults on their schedule (None: it has none)
        self.faults: FaultScheduler | None = None
        self.live: LiveDiagnosis | None = None
        self.interrupted: Callable[[], bool] = lambda: False  # a Ctrl-C noted (run())
        self.current_launcher: Launcher | None = None  # the launch running (live diagnosis)
        # its configuration's calibrated forecast, s per operation (live diagnosis)
        self.current_forecast: float | None = None
        self.stragglers: Stragglers | None = None
        self.fault_outcomes: list[FaultOutcome] = []
        self.run_dir: Path | None = None  # the fabric's run directory, once it is up
        # when this run began on the fabric (epoch s); 0 when it brings its own fabric up
        # (the controller's events from its bring-up belong to the run)
        self._since: float | None = None
        self._first_launch = 0  # the testbed's launches before this run (not its logs)
        # in the current launch: what was last said of its traced paths; whether tracing
        # failed (said once, not tried again)
        self._trace_said: tuple[int, int] = (0, 0)
        self._trace_failed = False
        self.monitor = monitor_level(self.options.monitor or spec.monitor, "--monitor")

    # -- the run -----------------------------------------------------------------------

    def bundle_path(self) -> Path:
        return bundle_directory(self.options, self.spec.name)

    def run(self, testbed: Testbed | None = None) -> RunOutcome:
        """Run the experiment; on a testbed given (already up, e.g. the pytest plugin's) or
        on one brought up here and torn down at the end. Raises AstralError for what stops
        a run before it starts (refused load, a fabric that does not come up). A Ctrl-C
        is noted as well as raised, so that the launcher stops on one whose
        KeyboardInterrupt got lost (orchestrator.run.interrupts)."""
        with noted_interrupts() as interrupted:
            self.interrupted = interrupted
            return self._run(testbed)

    def _run(self, testbed: Testbed | None) -> RunOutcome:
        spec = self.spec
        outcome = RunOutcome(spec)
        began = time.monotonic()
        calibration = None
        if self.options.calibrate:
            calibration = ensure_calibration(
                self._quick_calibration,
                say=self.say,
                packet_scale=packet_scale_of(self.spec.fabric),
            )
            if self.calibrated_in is not None:  # measured now, not read from the file
                outcome.timings["calibration"] = round(self.calibrated_in, 3)
        verdict = load_guard(spec, force=self.options.force, calibration=calibration)
        outcome.verdict = verdict
        for line in verdict.lines():
            self.say(line)
        if verdict.refused:
            raise verdict.error()
        self.run_file = {
            "command": self.command,
            "experiment": spec.source,
            "host_ports": spec.host_ports,
            "started": time.time(),
            "conditions": {"start": conditions()},
            "load_guard": verdict.to_dict(),
        }
        own = testbed is None
        if own:
            self._since = 0.0
        try:
            if testbed is None:
                machines = cluster_of(spec.cluster) if spec.cluster else None
                testbed = Testbed(
                    spec.fabric,
                    policy=spec.policies[0],
                    state_base=self.options.state_base,
                    ready_timeout=self.options.ready_timeout,
                    log=self.say,
                    lock_wait=self.options.lock_wait,
                    cluster=machines,
                )
                where = f" over {', '.join(spec.cluster)}" if spec.cluster else ""
                self.say(f"bringing up fabric {spec.fabric.name} ({spec.fabric_source}){where}")
                testbed.start()
                outcome.timings["bring_up"] = round(testbed.emulation.timings.get("total", 0.0), 3)
                self.say(f"fabric up in {outcome.timings['bring_up']:.1f} s ({testbed.run_dir})")
                problem = getattr(testbed.emulation, "send_buffer_problem", None)
                if problem:
                    self.say(f"WARNING: {problem}")
                placement = getattr(testbed.emulation, "placement", None)
                if placement is not None:
                    for line in placement.lines():
                        self.say(line)
            self._run_on(testbed, outcome)
        except (KeyboardInterrupt, Terminated) as interruption:
            outcome.status = "interrupted"
            outcome.exit_status = (
                interruption.exit_status if isinstance(interruption, Terminated) else 130
            )
            outcome.error = (
                "interrupted" if isinstance(interruption, KeyboardInterrupt) else str(interruption)
            )
        finally:
            if self.progress is not None:
                self.progress.close()
            if own and testbed is not None:
                report = testbed.emulation.stop()
                outcome.timings["teardown"] = round(
                    testbed.emulation.timings.get("teardown", 0.0), 3
                )
                if report.errors:
                    self.say("teardown problems: " + "; ".join(report.errors[:4]))
        outcome.timings["total"] = round(time.monotonic() - began, 3)
        self._finish_bundle(outcome, testbed)
        return outcome

    def _quick_calibration(self) -> Calibration:
        began = time.monotonic()
        calibration = quick_calibration(self.say, packet_scale_of(self.spec.fabric))
        self.calibrated_in = time.monotonic() - began
        return calibration

    def _run_on(self, testbed: Testbed, outcome: RunOutcome) -> None:
        spec, options = self.spec, self.options
        steps = spec.steps()
        self.run_dir = testbed.run_dir
        self._first_launch = len(testbed.launch_dirs)  # this run's launches come after
        if self._since is None:  # a testbed of the caller's: what it logged before is not ours
            self._since = time.time()
        seconds = testbed.use_monitor(self.monitor)
        if seconds:
            self.say(f"monitor {self.monitor.name}: controller restarted in {seconds:.1f} s")
        self.run_file["monitor"] = self.monitor.name
        cluster = testbed.description.extra.get("cluster")
        if cluster is not None and isinstance(testbed.emulation, ClusterEmulation):
            # each machine's part: what it held, its run record there, its clock offset,
            # and the experiment's load as it carries it against its own calibration
            guard = outcome.verdict
            safe = guard.assessment.safe_bps if guard is not None else None
            loads = testbed.emulation.machine_loads(guard.offered_hop_bps if guard else 0.0, safe)
            for load in loads:
                self.say(f"load {load.line()}")
            for probe in testbed.emulation.tunnel_probes.values():
                self.say(probe.line())
            for line in testbed.emulation.doctor_lines():
                self.say(line)
            self.run_file["cluster"] = {**cluster, "loads": [vars(x) for x in loads]}
        datapath = testbed.emulation.datapath
        self.run_file["conditions"]["datapath"] = datapath.kind if datapath else None
        self.run_file["conditions"]["userspace_tso"] = datapath.tso if datapath else None
        self.run_file["conditions"]["emulation_scale"] = testbed.scale
        self.run_file["conditions"]["rail_bandwidth_Bps"] = testbed.rail_bandwidth()
        # the latencies among the experiment's GPUs (fabric.json has the whole fabric's)
        self.run_file["conditions"]["latency"] = latency_record(
            testbed.description.fabric, spec.gpus
        )
        launch = LaunchOptions(
            warmup=spec.warmup,
            iterations=spec.iterations,
            min_batch_seconds=spec.min_batch or 0.0,
            step_deadline=options.step_deadline,
            worker_args=options.worker_args,
        )
        channels = {
            c: options.channels or testbed.default_channels(spec.gpus, [(c.op, c.algorithm)])
            for c in spec.collectives
        }
        self.run_file["channels"] = {c.label: n for c, n in channels.items()}
        path = self.bundle_path()
        writer = ResultsWriter(path, testbed.description, experiment_text=self.text)
        outcome.bundle = writer.path
        writer.add_run(
            experiment=spec.name,
            host=socket.gethostname(),
            versions=software_versions(),
            seed=spec.seed,
        )
        self.say(f"results bundle: {writer.path}")
        self.progress = self.given_progress or Progress(
            steps, testbed.rail_bandwidth(), options.progress, spec.step_latencies()
        )
        offered = outcome.verdict.offered_hop_bps if outcome.verdict else 0.0
        self.run_file["emulator_saturation"] = DEFAULT_THRESHOLDS.to_dict()
        forecaster = self._forecaster(testbed)
        forecasts: dict[int, ForecastRecord] = {}
        # the CPU while configurations run (calibration.saturation; the monitor's host layer)
        groups = testbed.process_groups if self.monitor.process_cpu else None
        sampler = CpuSampler(groups=groups).start()
        # the switches' egress queues (the diagnosis tells congestion drops from others)
        queues = QueueSampler.for_emulation(
            testbed.emulation, testbed.description, self.monitor.telemetry_interval
        ).start()
        mesh = self._probe_mesh(testbed, writer.path)
        self._start_faults(testbed)
        self._start_live_diagnosis(
            testbed, self._live_probes(mesh), queues.snapshot, queues.ingress_snapshot
        )
        quiet_from: float | None = None
        step_times: list[dict[str, Any]] = []
        outcome.timings["steps"] = step_times
        outcome.timings["policy_switch"] = {}
        try:
            for policy in spec.policies:
                policy_steps = [s for s in steps if s.policy == policy]
                seconds = testbed.use_policy(policy)
                outcome.timings["policy_switch"][policy] = round(seconds, 3)
                if seconds:
                    self.say(f"policy {policy}: fabric reprogrammed in {seconds:.1f} s")
                mesh = self._probe(mesh, policy)
                if spec.workload is not None:
                    (step,) = policy_steps
                    replayed = self._replay(
                        testbed, step, launch, writer, sampler, outcome, offered
                    )
                    step_times.append(replayed)
                    continue
                for collective in spec.collectives:
                    group = [s for s in policy_steps if s.collective == collective]
                    results: list[ConfigurationResult] = []  # the run's figures
                    rows: list[LiveRow] = []  # the live table: every size that ran
                    ceiling = testbed.ceiling(spec.gpus, collective.op, collective.algorithm)
                    with self._launcher(
                        testbed, replace(launch, channels=channels[collective]), collective
                    ) as launcher:
                        unpinned = self._pinning(testbed, policy, collective, outcome)
                        self._plan_forecast(forecaster, testbed, policy, collective)
                        self._trace_said, self._trace_failed = (0, 0), False
                        for step in group:
                            self.progress.step(step)
                            predicted = self._forecast(forecaster, step)
                            self.current_forecast = (
                                predicted.time_us / 1e6
                                if predicted is not None and predicted.calibrated
                                else None
                            )
                            began = time.monotonic()
                            test = CollectiveTest(collective.op, collective.algorithm, step.size)
                            result, recorded = self._measure(
                                Measurement(testbed, launcher, writer, sampler, offered, outcome),
                                step,
                                test,
                                unpinned,
                            )
                            for _, config_id, configuration, _ in recorded:
                                writer.add_ceiling(configuration.id, ceiling)
                                if predicted is not None:
                                    writer.add_forecast(config_id, predicted)
                                    forecasts[config_id] = predicted
                            shown = step_rows(
                                recorded,
                                result.failure,
                                testbed.scale,
                                ceiling,
                                asked_configuration(step, spec),
                            )
                            rows += shown
                            results += [row.result for row in shown if row.counted]
                            step_times.append(step_timing(step, began))
                            if result.failure is not None:
                                # the sizes measured before the failure are the run's
                                # figures too (a study's completes check reads them)
                                outcome.results += results
                                # the group's table so far, the failed size's row included
                                self.emit(
                                    self._table(
                                        testbed,
                                        policy,
                                        collective.label,
                                        rows,
                                        outcome.emulator,
                                        forecasts,
                                    )
                                )
                                raise _WorkersFailed(result.failure)
                            self.progress.done(step)
                    outcome.results += results
                    self.emit(
                        self._table(
                            testbed, policy, collective.label, rows, outcome.emulator, forecasts
                        )
                    )
            quiet_from = time.time()  # the last operation is over (_settle)
            outcome.status = "ok"
        except _WorkersFailed as failed:
            outcome.status = "failed"
            outcome.failure = failed.failure
            outcome.error = str(failed.failure)
            outcome.exit_status = EXIT_WORKERS_FAILED
        except AstralError as error:  # workers that did not start, a policy that did not
            outcome.status = "failed"  # program: the run ends here, the bundle stays
            outcome.error = str(error)
            outcome.exit_status = error.exit_status
        except BaseException:
            self._interrupted(testbed, writer, mesh, sampler, queues)
            raise
        finally:
            sampler.stop()
            if self.progress is not None:
                self.progress.close()
        try:
            self._wind_down(writer, mesh)
            self._settle(quiet_from)
        except BaseException:  # Ctrl-C or SIGTERM while the fabric settles
            self._interrupted(testbed, writer, mesh, sampler, queues)
            raise
        finally:
            queues.stop()
        self._check_wrong(outcome)
        self._record_telemetry(writer, testbed, sampler, queues)
        writer.finish(status=outcome.status)

    def _replay(
        self,
        testbed: Testbed,
        step: ConfigurationStep,
        launch: LaunchOptions,
        writer: ResultsWriter,
        sampler: CpuSampler,
        outcome: RunOutcome,
        offered: float,
    ) -> dict[str, Any]:
        """The workload's iteration replayed under ``step``'s policy (orchestrator/run/replay.py):
        recorded in the bundle as one configuration (iterations, phases, connections and
        their paths, as any launch's), its figures and timeline beside the forecast's."""
        spec, policy = self.spec, step.policy
        assert spec.workload is not None and self.progress is not None
        # compute stretched by the fabric's own scale (a caller's testbed may run another)
        program = iteration_program(spec.workload, testbed.scale)
        forecast = self._program_forecast(testbed, program, policy)
        if forecast is not None:
            outcome.replay_forecasts[policy] = forecast
        channels = self.options.channels or testbed.nic_ports
        options = replay_options(launch, program, spec.warmup, spec.iterations, channels)
        balanced = Collective(*BALANCED_OVER)
        began = time.monotonic()
        with self._launcher(testbed, options, balanced) as launcher:
            unpinned = self._pinning(testbed, policy, step.collective, outcome)
            self._trace_said, self._trace_failed = (0, 0), False
            self.progress.step(step)
            result, recorded = self._measure(
                Measurement(testbed, launcher, writer, sampler, offered, outcome),
                step,
                CollectiveTest.of_program(program),
                unpinned,
            )
            for done, _, _, _ in recorded:
                if done.timed() and result.failure is None:
                    outcome.replays[policy] = ReplayResult.of(
                        spec.workload, program, testbed.scale, launcher.layout, done
                    )
        timing = step_timing(step, began)
        if result.failure is not None:
            raise _WorkersFailed(result.failure)
        self.progress.done(step)
        if policy in outcome.replays:
            record = replay_record(outcome.replays[policy], outcome.replay_forecasts.get(policy))
            self.emit(replay_table(spec.workload.name, {policy: record}, testbed.scale))
        return timing

    def _measure(
        self, on: Measurement, step: ConfigurationStep, test: CollectiveTest, unpinned: int | None
    ) -> tuple[RunResult, list[Recorded]]:
        """One batch of ``test`` on the launcher, and what every launch records of it: the
        connections' minimum RTO, the CPU (a sample right after: every window is spanned),
        the traced paths, the configuration with its iterations and the monitor's layers,
        the emulator's load. Returns the run and, per test, (result, configuration id,
        configuration, iteration records)."""
        spec, launch = self.spec, on.launcher.options
        result = on.launcher.run([test])
        self._rto_min(result, step.policy, step.collective, on.outcome)
        on.sampler.sample()
        traces = self._trace(on.testbed, step, result)
        recorded = []
        for done in result.tests:
            config_id, configuration, records = record_test(
                on.writer,
                step.policy,
                done,
                result,
                iterations=launch.iterations,
                warmup=launch.warmup,
                host_ports=spec.host_ports,
                dtype=spec.dtype,
                unpinned=unpinned,
            )
            self._record_monitor(
                on.writer, on.testbed, config_id, done, result, on.launcher.layout, traces
            )
            load = judge_test(done, on.sampler.snapshot(), on.offered)
            load = self._cluster_load(on.testbed, done, load, on.offered)
            if load is not None:
                on.writer.add_emulator_load(config_id, load)
                on.outcome.emulator[config_id] = load
            recorded.append((done, config_id, configuration, records))
        return result, recorded

    def _cluster_load(
        self,
        testbed: Testbed,
        done: CollectiveResult,
        here: EmulatorLoad | None,
        offered: float,
    ) -> EmulatorLoad | None:
        """On a cluster, every machine's share judged from its own CPU samples, each
        against its part of the offered load: the first saturated one is the
        configuration's verdict (its reasons named after the machine), else this one's."""
        emulation = testbed.emulation
        if not isinstance(emulation, ClusterEmulation) or not emulation.parts:
            return here
        loads = {x.machine: x.hop_bps for x in emulation.machine_loads(offered)}
        for machine in emulation.parts:
            samples = [
                CpuSample(**{**x, "groups": tuple(tuple(g) for g in x.get("groups", ()))})
                for x in emulation.cpu_samples(machine)
            ]
            there = judge_test(done, samples, loads.get(machine, offered))
            if there is not None and there.saturated:
                return replace(there, reasons=f"{machine}: {there.reasons}")
        return here

    def _forecast_calibration(self) -> ForecastCalibration | None:
        """This machine's forecast calibration; a damaged one is said and not used."""
        try:
            return load_forecast_calibration()
        except AstralError as error:
            self.say(f"forecast calibration ignored: {error}")
            return None

    def _program_forecast(
        self, testbed: Testbed, program: Program, policy: str
    ) -> ProgramForecast | None:
        """The workload iteration's forecast on this placement and policy (a run never
        fails for its forecast: a problem is said and the replay goes on without one)."""
        calibration = self._forecast_calibration()
        try:
            forecaster = ProgramForecaster(
                testbed.description,
                self.spec.gpus,
                policy=policy,
                calibration=calibration,
                host_ports=self.spec.host_ports,
                channels=self.options.channels or testbed.nic_ports,
            )
            return forecaster.forecast(program)
        except Exception as error:
            self.say(f"no forecast of the workload: {type(error).__name__}: {error}")
            return None

    def _probe_mesh(self, testbed: Testbed, bundle: Path) -> ProbeMesh | None:
        """The run's probe mesh (orchestrator.testbed.probemesh), not started yet; None
        when the monitor level leaves it out or the emulation spans several machines."""
        if not self.monitor.probes:
            self.run_file["probes"] = {"enabled": False, "why": f"monitor {self.monitor.name}"}
            return None
        if isinstance(testbed.emulation, ClusterEmulation):
            self.run_file["probes"] = {
                "enabled": False,
                "why": "a cluster run: its GPUs are on several machines",
            }
            return None
        if not callable(getattr(testbed.emulation, "netns_paths", None)):
            self.run_file["probes"] = {
                "enabled": False,
                "why": "the emulation does not give its GPUs' namespaces",
            }
            return None
        return ProbeMesh(testbed.emulation, testbed.description, bundle, seed=self.spec.seed)

    def _probe(self, mesh: ProbeMesh | None, policy: str) -> ProbeMesh | None:
        """Start the mesh under the first policy, trace it again under each next one; a
        mesh that cannot is said and dropped (the run goes on without it)."""
        if mesh is None:
            return None
        try:
            if mesh.tracings:
                mesh.retrace(policy)
            else:
                mesh.start(policy)
                self.say(
                    f"probe mesh: {len(mesh.probes)} probes over every link direction"
                    + (f" but {len(mesh.uncovered)}" if mesh.uncovered else "")
                    + f" (planned in {mesh.plan_seconds:.1f} s)"
                )
        except (EmulationError, OSError) as error:
            self.say(f"WARNING: no probe mesh: {error}")
            with contextlib.suppress(EmulationError, OSError):
                mesh.stop()
            self.run_file["probes"] = {"enabled": False, "why": str(error)}
            return None
        return mesh

    def _wind_down(self, writer: ResultsWriter, mesh: ProbeMesh | None) -> None:
        """The probe mesh stopped, the live diagnosis ended, the faults undone and kept."""
        self._stop_probes(mesh)
        self._end_live_diagnosis()
        self._end_faults(writer)

    def _interrupted(
        self,
        testbed: Testbed,
        writer: ResultsWriter,
        mesh: ProbeMesh | None,
        sampler: CpuSampler,
        queues: QueueSampler,
    ) -> None:
        """A run stopped by Ctrl-C or SIGTERM: wound down, what was sampled kept, and the
        bundle finished as interrupted (each step is idempotent)."""
        self._wind_down(writer, mesh)
        sampler.stop()
        queues.stop()
        self._record_telemetry(writer, testbed, sampler, queues)
        writer.finish(status="interrupted")

    def _settle(self, quiet_from: float | None) -> None:
        """Wait until :data:`QUIET_AFTER_S` and a counter poll have passed since
        ``quiet_from``, the end of the run's last operation (None: the run failed, no
        wait), so that the counters and the queues are sampled once more on a quiet
        fabric: each switch's balance of packets in and out ends there. Stopped at once,
        their last samples caught a healthy core switch with packets in flight (7 to 52
        packets short at healthy switches, a false lossy link, seed 47). The end of the
        probe mesh, the live diagnosis and the faults count towards the wait."""
        if quiet_from is not None:
            time.sleep(
                max(0.0, quiet_from + QUIET_AFTER_S + self.monitor.telemetry_interval - time.time())
            )

    def _stop_probes(self, mesh: ProbeMesh | None) -> None:
        if mesh is None:
            return
        try:
            mesh.stop()
        except OSError as error:
            self.say(f"WARNING: the probe mesh's record is incomplete: {error}")
        self.run_file["probes"] = {"enabled": True, **mesh.summary()}
        for problem in mesh.problems:
            self.say(f"WARNING: probe mesh: {problem}")

    def _start_faults(self, testbed: Testbed) -> None:
        """The experiment's faults on their schedule, applied on this testbed's fabric by
        a thread (orchestrator.testbed.faults); ``at`` counts from the first timed batch."""
        if not self.spec.faults:
            return
        injector, self.stragglers = injector_on(testbed, self.spec.gpus)
        log = FaultLog(testbed.run_dir / FAULT_LOG)
        self.faults = FaultScheduler(injector, self.spec.faults, log, say=self.say).start()
        self.run_file["faults"] = [f.describe() for f in self.spec.faults]
        self.run_file["fault_log"] = str(log.path)

    def _start_live_diagnosis(
        self,
        testbed: Testbed,
        probes: Callable[[], ProbeRecord | None] | None = None,
        queues: Callable[[], list[QueueCounter]] | None = None,
        ingress: Callable[[], list[IngressDrop]] | None = None,
    ) -> None:
        """The live diagnosis (orchestrator.diagnosis.live) on what the launches, the
        counters, the egress queues, the switch sockets' drops, the controller's events and
        the probe mesh show, alerting as it goes."""
        self.current_launcher = None
        builder = live_builder(
            testbed,
            lambda: self.current_launcher,
            time.time(),
            probes,
            queues,
            ingress,
            lambda: self.current_forecast,
        )
        self.live = LiveDiagnosis(builder, say=self.say).start()

    @staticmethod
    def _live_probes(mesh: ProbeMesh | None) -> Callable[[], ProbeRecord | None] | None:
        """What the probe mesh shows so far (the live builder adds the egress queues'
        samples so far, what tells its congestion losses from a fault's)."""
        if mesh is None:
            return None
        return ProbeFollower(mesh.bundle).read

    def _end_live_diagnosis(self) -> None:
        if self.live is None:
            return
        live, self.live = self.live, None
        alerts = live.stop()
        self.run_file["alerts"] = [a.to_dict() for a in alerts]
        self.run_file["live_diagnosis"] = live.cost()
        if live.errors:
            self.run_file["alert_errors"] = live.errors[:5]

    def _end_faults(self, writer: ResultsWriter) -> None:
        """Undo what is still in effect and keep every fault's instants in the bundle."""
        if self.faults is None:
            return
        scheduler, self.faults = self.faults, None
        self.fault_outcomes = scheduler.stop()
        writer.add_faults(
            InjectedFault(
                o.fault.id,
                o.fault.kind,
                o.fault.target_text,
                o.fault.params(),
                o.scheduled,
                o.applied,
                o.undone,
                o.error,
            )
            for o in self.fault_outcomes
        )

    def _record_monitor(
        self,
        writer: ResultsWriter,
        testbed: Testbed,
        config_id: int,
        done: CollectiveResult,
        result: RunResult,
        layout: Layout,
        traces: PathTraces | None = None,
    ) -> None:
        """The configuration's monitor layers (orchestrator.monitor.record): its steps, its
        connections' ends and paths (traced, else planned), the senders' TCP_INFO."""
        writer.add_steps(config_id, record.step_records(done, layout))
        writer.add_connections(config_id, record.connection_records(result.connections))
        writer.add_tcp_info(config_id, record.tcp_records(result))
        chosen = testbed.pinning.chosen if testbed.pinning is not None else {}
        traced = traces.paths if traces is not None else None
        fabric = testbed.description.fabric
        for c, hops in record.connection_paths(fabric, result.connections, chosen, traced):
            writer.add_path(writer.connection_id(config_id, c.src, c.five_tuple), hops)

    def _trace(
        self, testbed: Testbed, step: ConfigurationStep, result: RunResult
    ) -> PathTraces | None:
        """The batch's fabric connections followed through the switches
        (orchestrator.testbed.tracing), right after it: a fault, the controller's answer to
        it or an adaptive policy may have moved them since the last batch. Each tracing is
        kept in ``run.json``; connections that could not be followed to their destination,
        and pinned ones the switches do not forward on their published path (a controller
        bug), are said when their numbers change within the launch. Tracing that fails
        leaves the planned paths (said once per launch, not tried again in it)."""
        if self._trace_failed or not any(c.link == "fabric" for c in result.connections):
            return None
        try:
            traces = testbed.trace_paths(result.connections)
        except (EmulationError, OSError) as error:
            self._trace_failed = True
            self.say(f"WARNING: cannot trace the connections' paths (planned ones kept): {error}")
            return None
        label = f"policy {step.policy}, {step.collective.label}"
        self.run_file.setdefault("path_traces", []).append(
            {
                "policy": step.policy,
                "collective": step.collective.label,
                "size": step.size,
                **traces.summary(),
            }
        )
        chosen = testbed.pinning.chosen if testbed.pinning is not None else {}
        wrong = record.disagreements(
            testbed.description.fabric, result.connections, chosen, traces.paths
        )
        said, self._trace_said = self._trace_said, (traces.incomplete(), len(wrong))
        if traces.incomplete() and traces.incomplete() != said[0]:
            self.say(
                f"WARNING: {label}: {traces.incomplete()} of {len(traces.paths)} fabric "
                f"connections could not be traced to their destination ({traces.problems()[0]})"
            )
        if wrong and len(wrong) != said[1]:
            self.say(
                f"WARNING: {label}: the switches forward {len(wrong)} pinned connections "
                f"off their published path, recorded as traced (a controller bug?): {wrong[0]}"
            )
        return traces

    def _check_wrong(self, outcome: RunOutcome) -> None:
        """Data that failed verification fails the run (exit 7), unless it failed already
        for another reason, whose status stands; the summary names the configurations."""
        wrong = [wrong_phrase(r) for r in outcome.wrong_results()]
        wrong += [
            f"{policy} workload {r.spec.name!r}: {r.wrong} wrong elements"
            for policy, r in outcome.replays.items()
            if r.wrong > 0
        ]
        if not wrong:
            return
        error = WrongResultsError(wrong)
        if outcome.exit_status == 0:
            outcome.status = "failed"
            outcome.error = str(error)
            outcome.exit_status = error.exit_status

    @contextmanager
    def _launcher(
        self, testbed: Testbed, launch: LaunchOptions, collective: Collective
    ) -> Iterator[Any]:
        """Workers for one collective under one policy (its own connections: channels, NIC
        ports as ``host_ports`` says and, under path-pinned, paths chosen for it); a start-up
        failure becomes _WorkersFailed with its ranks."""
        launcher = testbed.launch(
            self.spec.gpus,
            launch,
            [(collective.op, collective.algorithm)],
            host_ports=self.spec.host_ports,
        )
        launcher.interrupted = self.interrupted
        if self.faults is not None:
            launcher.on_batch = self.faults.batch_started
        try:
            launcher.start()
            if self.stragglers is not None:
                self.stragglers.attach(launcher)
            self.current_launcher = launcher
        except EmulationError:
            failure = launcher.failure
            launcher.close()
            if failure is not None:
                raise _WorkersFailed(failure) from None
            raise
        except BaseException:  # Ctrl-C or SIGTERM while the workers start: stop them too
            launcher.close()
            raise
        try:
            yield launcher
        finally:
            self.current_launcher = None
            if self.stragglers is not None:
                self.stragglers.detach()
            launcher.close()

    def _pinning(
        self, testbed: Testbed, policy: str, collective: Collective, outcome: RunOutcome
    ) -> int | None:
        """How many of this launch's fabric connections got no planned source port (None:
        nothing was planned: ``host_ports: hash`` under a policy that pins no path); said
        at once when any, and kept for the summary."""
        pinning = testbed.pinning
        if pinning is None:
            return None
        left = len(pinning.unpinned)
        outcome.pinning[(policy, collective.label)] = (left, pinning.flows)
        if left:
            self.say(
                f"WARNING: policy {policy}, {collective.label}: {left} of {pinning.flows} "
                "fabric connections got no planned source port and use an ephemeral one "
                "(their NIC port, and under a policy that pins paths their path, are left "
                "to hashing)"
            )
        return left

    def _rto_min(
        self, result: RunResult, policy: str, collective: Collective, outcome: RunOutcome
    ) -> None:
        """Keep what a launch's workers reported of their connections' minimum RTO (once per
        launch: the connections stay); warn the first time some connection lacks it."""
        key = (policy, collective.label)
        if key in outcome.rto_min or not result.connections:
            return
        warned = None in outcome.rto_floors()
        outcome.rto_min[key] = [c.rto_min_us for c in result.connections]
        if None in outcome.rto_min[key] and not warned:
            self.say(rto_min_line(outcome.rto_min[key]))

    def _record_telemetry(
        self,
        writer: ResultsWriter,
        testbed: Testbed,
        sampler: CpuSampler | None = None,
        queues: QueueSampler | None = None,
    ) -> None:
        """The controller's port counters into the database, its telemetry file (routes of
        the policies that place flows included) into the bundle as it is; then the rest of
        the monitor's layers: the counters' confirmation of the paths, the controller's
        events, the CPU per interval, and the logs. First the controller restarts this run
        made itself (its policy switches): the diagnosis reads the controller's events and
        counters, on which a planned restart looks like a crash and its recovery."""
        since = self._since or 0.0
        writer.add_controller_restarts(r for r in testbed.restarts if r.began >= since)
        try:
            counters = testbed.port_counters()
            if counters:
                writer.add_port_counters(counters)
            path = testbed.telemetry_path
            if path is not None and path.exists():
                shutil.copyfile(path, writer.path / TELEMETRY_FILE)
            self.run_file["port_counters"] = len(counters)
            if queues is not None:
                self.run_file["queue_counters"] = writer.add_queue_counters(queues.snapshot())
                unread = queues.ingress_snapshot()
                self.run_file["ingress_drops"] = writer.add_ingress_drops(unread)
                lost = unread_per_port(unread)
                if lost:
                    self.say(
                        f"emulator: the switch process left {sum(lost.values()):,} packets unread"
                        f" at {len(lost)} switch port(s), its sockets full: losses of the"
                        " emulator, not of the fabric (the diagnosis does not count them)"
                    )
                if queues.failures:
                    self.say(f"egress queues: {queues.failures} sample(s) could not be read")
                if queues.socket_failures:
                    self.say(
                        f"switch sockets: {queues.socket_failures} sample(s) could not be read"
                        " (ss): the emulator's own drops are not told from the fabric's"
                    )
                if queues.nic_error:
                    self.say(queues.nic_error)
                elif queues.nic_failures:
                    self.say(f"NIC queues: {queues.nic_failures} sample(s) could not be read")
                self.run_file["nic_queues"] = len(queues.namespaces) if not queues.nic_error else 0
            writer.confirm_paths()
        except (OSError, ValueError) as error:
            self.say(f"cannot read the controller's telemetry: {error}")
        try:
            events = record.controller_events(testbed.run_dir / EVENTS_NAME, since)
            writer.add_controller_events(events)
            if sampler is not None:
                writer.add_host_cpu(host_intervals(sampler.snapshot()))
            controller = testbed.emulation.controller
            logs = [controller.log_path] if controller is not None else []
            logs.append(testbed.run_dir / EVENTS_NAME)
            record.copy_logs(writer.path, logs, testbed.launch_dirs[self._first_launch :])
        except OSError as error:
            self.say(f"cannot record the monitor's layers: {error}")

    def _table(
        self,
        testbed: Testbed,
        policy: str,
        label: str,
        rows: Sequence[LiveRow],
        loads: Mapping[int, EmulatorLoad],
        forecasts: Mapping[int, ForecastRecord] | None = None,
    ) -> str:
        """One collective's table under one policy, as its sizes have run (live_table)."""
        latency = latency_title(latency_record(testbed.description.fabric))
        return live_table(
            self.spec, (policy, label), rows, testbed.scale, loads, latency, forecasts
        )

    def _forecaster(self, testbed: Testbed) -> Forecaster | None:
        """The model for this run's placement (orchestrator/forecast), or None, said, when
        it cannot forecast this fabric (a run never fails for its forecast)."""
        spec = self.spec
        calibration = self._forecast_calibration()
        if calibration is None:
            self.say(
                "forecast: uncalibrated (no forecast calibration on this machine): each row's "
                "forecast is the bare model, links at their full rate and no per-step costs; "
                "`sudo astral forecast --calibrate` measures them (docs/forecast.md)"
            )
        try:
            return Forecaster(
                testbed.description,
                spec.gpus,
                host_ports=spec.host_ports,
                calibration=calibration,
                iterations=spec.iterations,
                warmup=spec.warmup,
                min_batch_s=spec.batch_floor_s,
            )
        except Exception as error:
            self.say(f"no forecast for this run: {type(error).__name__}: {error}")
            return None

    def _plan_forecast(
        self, forecaster: Forecaster | None, testbed: Testbed, policy: str, collective: Collective
    ) -> None:
        """Forecast the launch's collective with the source and NIC ports it planned (where
        the switches hash the five-tuple, those are its paths: no hash draws left); a
        problem is said, and the forecast keeps its draws."""
        pinning = testbed.pinning
        if forecaster is None or pinning is None or not pinning.ports:
            return
        nics = {f: c.nic for f, c in pinning.chosen.items()}
        try:
            forecaster.plan(policy, collective.op, collective.algorithm, pinning.ports, nics)
        except Exception as error:
            self.say(f"forecast without the planned ports: {type(error).__name__}: {error}")

    def _forecast(
        self, forecaster: Forecaster | None, step: ConfigurationStep
    ) -> ForecastRecord | None:
        """The forecast of ``step`` as the bundle keeps it, computed before it runs."""
        if forecaster is None:
            return None
        try:
            predicted = forecaster.forecast(step)
        except Exception as error:
            self.say(f"no forecast for step {step.index}: {type(error).__name__}: {error}")
            return None
        return forecast_record(predicted.prediction, forecaster.model.calibration.measured)

    # -- the end -----------------------------------------------------------------------

    def _finish_bundle(self, outcome: RunOutcome, testbed: Testbed | None) -> None:
        if outcome.bundle is None:
            return
        self.run_file.update(
            {
                "status": outcome.status,
                "finished": time.time(),
                "timings": outcome.timings,
                "failure": _failure_dict(outcome.failure) if outcome.failure else None,
                "error": outcome.error,
            }
        )
        self.run_file["conditions"]["end"] = conditions()
        self.run_file["conditions"]["tcp_rto_min"] = rto_min_summary(outcome.rto_floors())
        _write_json(outcome.bundle / RUN_FILE, self.run_file)
        if self.spec.workload is not None:
            self._write_workload(outcome)
        try:
            from orchestrator.results.report import render_bundle

            plots = self.options.plots and outcome.status != "interrupted"
            render_bundle(outcome.bundle, plots=plots)
            if plots:
                render_monitor(outcome.bundle)
        except (AstralError, OSError, ValueError) as error:
            self.say(f"rendering the bundle failed: {error}")
        for line in self.summary_lines(outcome, testbed):
            self.emit(line)
        self._diagnosis(outcome)

    def _write_workload(self, outcome: RunOutcome) -> None:
        """``workload.json`` (the workload, each policy's replay and forecast with their
        timelines) and, unless plots are off, each policy's workload Gantt."""
        spec, workload = self.spec, self.spec.workload
        assert outcome.bundle is not None and workload is not None
        document = {
            "workload": workload.name,
            "source": spec.workload_source,
            "layout": {
                "tp": workload.parallel.tp,
                "pp": workload.parallel.pp,
                "dp": workload.parallel.dp,
                "ep": workload.parallel.ep,
            },
            "gpus": list(spec.gpus),
            "scale": spec.fabric.emulation.scale,
            "slots": slot_ops(spec.program()),
            "policies": {
                policy: replay_record(result, outcome.replay_forecasts.get(policy))
                for policy, result in outcome.replays.items()
            },
        }
        _write_json(outcome.bundle / WORKLOAD_FILE, document)
        if not self.options.plots or outcome.status == "interrupted":
            return
        try:
            workload_report(outcome.bundle, plots=True)
        except (OSError, ValueError) as error:
            self.say(f"drawing the workload's timeline failed: {error}")

    def _diagnosis(self, outcome: RunOutcome) -> None:
        """``astral diagnose`` on the finished bundle, printed when anything was anomalous
        (a live alert, a failed or interrupted run, or a suspect), kept in the bundle."""
        assert outcome.bundle is not None
        try:
            diagnosis = diagnose_bundle(outcome.bundle)
        except (AstralError, OSError, ValueError) as error:
            self.say(f"the diagnosis failed: {error}")
            return
        _write_json(outcome.bundle / DIAGNOSIS_FILE, diagnosis.to_dict())
        if diagnosis.healthy and not self.run_file.get("alerts") and outcome.status == "ok":
            self.emit("# diagnosis: healthy")
            return
        self.emit("# diagnosis (astral diagnose " + str(outcome.bundle) + "):")
        for line in diagnosis.render().splitlines():
            self.emit("#   " + line)

    def summary_lines(self, outcome: RunOutcome, testbed: Testbed | None) -> list[str]:
        """Average bus bandwidth per collective, policies side by side, and the conditions."""
        spec = self.spec
        scale = spec.fabric.emulation.scale
        averages = outcome.averages()
        lines = [f"# astral run {spec.name!r}: {outcome.status}"]
        if averages:
            width = max(len(c.label) for c in spec.collectives) + 2
            head = "".join(f"{p:>26}" for p in spec.policies)
            lines.append(
                f"# average bus bandwidth, GB/s at real speed (emulated GB/s); host ports "
                f"{spec.host_ports}; {TIME_DEFINITION}"
            )
            lines.append(f"#   {'collective':<{width}}{head}{'ceiling':>26}")
            ceilings = {
                (r.configuration.collective, r.configuration.algorithm): r.ceiling
                for r in outcome.results
                if r.ceiling is not None
            }
            for collective in spec.collectives:
                cells = []
                for policy in spec.policies:
                    value = averages.get((policy, collective.op, collective.algorithm), math.nan)
                    cell = "-" if math.isnan(value) else f"{value / scale:.2f} ({value:.6f})"
                    cells.append(f"{cell:>26}")
                ceiling = ceilings.get((collective.op, collective.algorithm))
                top = ceiling.busbw if ceiling is not None else math.nan
                cell = "-" if not math.isfinite(top) else f"{top / scale:.2f} ({top:.6f})"
                cells.append(f"{cell:>26}")
                lines.append(f"#   {collective.label:<{width}}{''.join(cells)}")
        if outcome.replays and spec.workload is not None:
            records = {
                policy: replay_record(result, outcome.replay_forecasts.get(policy))
                for policy, result in outcome.replays.items()
            }
            table = replay_table(spec.workload.name, records, spec.fabric.emulation.scale)
            lines += ["# " + line.lstrip("# ") for line in table.splitlines()]
            lines += policy_ratio_lines(outcome.replays, outcome.replay_forecasts)
        fabric = spec.fabric
        rail = fabric.nic_ports * fabric.speeds.nic / 8 / 1e9
        ceiling_note = (
            "; ceiling: each collective's own busbw ceiling (rail x TCP payload / its fabric "
            "share, docs/measurement.md)"
            if averages
            else ""
        )
        # The frames the emulator recipe used (jumbo-packets enlarges them with the rate);
        # a run that never brought its fabric up: what the recipe would have used.
        recipe = testbed.emulation.fitted_recipe if testbed is not None else None
        if recipe is None:
            recipe = current_recipe().fitted(FabricDescription.of(build_fabric(fabric)))
        lines.append(
            f"# per-GPU rail bandwidth {fabric.nic_ports} x {fabric.speeds.nic / 1e9:g}G = "
            f"{rail:g} GB/s real ({rail * scale * 1e3:g} MB/s emulated); TCP over "
            f"{recipe.mtu}-byte frames carries at most {recipe.payload_share:.3f} of "
            f"it{ceiling_note}"
        )
        lines += self._pinning_lines(outcome)
        if outcome.rto_min:
            lines.append(f"# {rto_min_line(outcome.rto_floors())}")
        if outcome.verdict is not None:
            lines += [f"# {line}" for line in outcome.verdict.summary()]
        lines += [f"# WRONG DATA: {wrong_phrase(r)}" for r in outcome.wrong_results()]
        lines += [f"# {fault_line(o)}" for o in self.fault_outcomes]
        lines.append(f"# {emulator_line(outcome.emulator)}")
        if outcome.failure is not None:
            lines.append(f"# FAILED: {outcome.failure}")
        elif outcome.error and outcome.exit_status != WrongResultsError.exit_status:
            lines.append(f"# stopped: {outcome.error}")
        timings = outcome.timings
        parts = [f"total {timings.get('total', 0):.1f} s"]
        if "calibration" in timings:
            parts.append(f"quick calibration {timings['calibration']:.1f} s")
        if "bring_up" in timings:
            parts.append(f"bring-up {timings['bring_up']:.1f} s")
        switches = sum(timings.get("policy_switch", {}).values())
        if switches:
            parts.append(f"policy switches {switches:.1f} s")
        steps = sum(s["seconds"] for s in timings.get("steps", []))
        if steps:
            parts.append(f"collectives {steps:.1f} s")
        if "teardown" in timings:
            parts.append(f"teardown {timings['teardown']:.1f} s")
        lines.append("# took " + ", ".join(parts))
        if outcome.bundle is not None:
            lines.append(f"# bundle {outcome.bundle} (summary.json, tables/, plots/, run.json)")
        return lines

    def _pinning_lines(self, outcome: RunOutcome) -> list[str]:
        """Per policy whose source ports were planned (host ports balanced, or a policy
        that pins paths), how many connections got theirs."""
        lines = []
        for policy in self.spec.policies:
            cells = [
                f"{label} {total - left} of {total}" + (f" ({left} left ephemeral)" if left else "")
                for (p, label), (left, total) in outcome.pinning.items()
                if p == policy
            ]
            if cells:
                lines.append(f"# {policy}: source ports planned, " + ", ".join(cells))
        return lines


def wrong_phrase(result: ConfigurationResult) -> str:
    """A configuration whose data was wrong, as the run names it: ``policy ecmp, all-reduce
    (ring), 64K: 16384 wrong elements``."""
    c = result.configuration
    return (
        f"policy {c.policy}, {c.collective} ({c.algorithm}), {format_size(c.size)}: "
        f"{result.row.wrong} wrong elements"
    )


def fault_line(outcome: FaultOutcome) -> str:
    """One injected fault in the run's summary: what, and when it was applied and undone
    relative to its schedule."""
    fault = outcome.fault
    head = f"fault {fault.id}: {fault.describe()}"
    if outcome.applied is None:
        return f"{head}: not applied" + (f" ({outcome.error})" if outcome.error else "")
    late = (outcome.applied - outcome.scheduled) * 1e3 if outcome.scheduled else 0.0
    lasted = f", undone after {outcome.undone - outcome.applied:.2f} s" if outcome.undone else ""
    error = f"; {outcome.error}" if outcome.error else ""
    return f"{head}: applied {late:.0f} ms after its time{lasted}{error}"


#: What a launch records of one test: (result, configuration id, configuration, records).
Recorded = tuple[CollectiveResult, int, Configuration, list[IterationRecord]]

#: The most characters of a failure the live table prints beside the failed row (the
#: whole failure is the summary's ``# FAILED:`` line and run.json's ``failure``).
FAILURE_NOTE_CHARS = 100


@dataclass(frozen=True)
class LiveRow:
    """A configuration's row in the table ``astral run`` prints as a collective's sizes
    finish. Every size that ran gets one, so the user sees each configuration: one whose
    workers failed too, its row saying so (``failed``), rather than a table that ends
    before it or is never printed."""

    result: ConfigurationResult
    failed: str = ""  # why it failed, short; empty: it did not
    # whether it joins the run's figures (averages, the #wrong check): it finished, timed
    counted: bool = False


def failure_note(failure: Failure, most: int = FAILURE_NOTE_CHARS) -> str:
    """``FAILED: rank 3 (lo3) hung ...``: the ranks blamed first, cut to ``most``
    characters; a failure that blames no rank names the stage it happened in."""
    blamed = "; ".join(map(str, failure.culprits)) or f"workers failed during {failure.stage}"
    text = f"FAILED: {blamed}"
    return text if len(text) <= most else text[: most - 3].rstrip() + "..."


def asked_configuration(step: ConfigurationStep, spec: ExperimentSpec) -> Configuration:
    """``step`` as the experiment asked for it, for a row where the launch recorded no
    configuration (its workers failed while connecting): id 0, in no bundle."""
    return Configuration(
        0, step.policy, step.collective.op, step.collective.algorithm, step.size, step.count,
        step.dtype, step.ranks, spec.iterations, spec.warmup, spec.host_ports,
    )  # fmt: skip


def step_rows(
    recorded: Sequence[Recorded],
    failure: Failure | None,
    scale: float,
    ceiling: Ceiling | None,
    asked: Configuration,
) -> list[LiveRow]:
    """The live table's rows of one step: each configuration it recorded, computed as the
    bundle computes it (result_of). After a failure the last one recorded is the one the
    workers failed in (``asked`` if they failed before one was) and says why; none of
    them joins the run's figures, as before the failure was known."""
    rows = [
        LiveRow(
            result_of(configuration, records, scale, ceiling),
            counted=bool(done.timed()) and failure is None,
        )
        for done, _, configuration, records in recorded
    ]
    if failure is None:
        return rows
    last = rows.pop().result if rows else result_of(asked, [], scale, ceiling)
    return [*rows, LiveRow(last, failed=failure_note(failure))]


def live_table(
    spec: ExperimentSpec,
    group: tuple[str, str],
    rows: Sequence[LiveRow],
    scale: float,
    loads: Mapping[int, EmulatorLoad],
    latency: str | None,
    forecasts: Mapping[int, ForecastRecord] | None = None,
) -> str:
    """The nccl-tests table of one (policy, collective label) ``group`` as its sizes have
    run: the same table as the bundle's (configuration_table), each row's failure, if it
    failed, beside it ahead of its forecast."""
    policy, label = group
    results = [row.result for row in rows]
    head = [
        f"{label}, policy {policy}, host ports {spec.host_ports}, {spec.ranks} ranks, "
        f"{iterations_text(results, spec.iterations, spec.min_batch)} "
        f"(+{spec.warmup} warm-up), fabric {spec.fabric.name}",
        TIME_DEFINITION,
    ]
    sizes_and_loads = [(r.configuration.size, loads.get(r.configuration.id)) for r in results]
    notes = [
        row_note(row, (forecasts or {}).get(row.result.configuration.id), scale) for row in rows
    ]
    return configuration_table(results, head, scale, sizes_and_loads, latency, notes)


def row_note(row: LiveRow, forecast: ForecastRecord | None, scale: float) -> str:
    """What the live table says beside ``row`` after its marks: why it failed, first, then
    its forecast (forecast_note)."""
    return "; ".join(
        filter(None, [row.failed, forecast_note(forecast, row.result.row.busbw, scale)])
    )


def step_timing(step: ConfigurationStep, began: float) -> dict[str, Any]:
    """What run.json's timings keep of a step that began at ``began`` (monotonic s)."""
    return {
        "step": step.index,
        "policy": step.policy,
        "collective": step.collective.op,
        "algorithm": step.collective.algorithm,
        "size": step.size,
        "seconds": round(time.monotonic() - began, 3),
    }


def policy_ratio_lines(
    replays: Mapping[str, ReplayResult], forecasts: Mapping[str, ProgramForecast]
) -> list[str]:
    """Each policy's iteration time over the first policy's, replayed and forecast."""
    policies = list(replays)
    if len(policies) < 2:
        return []
    base = policies[0]
    lines = []
    for policy in policies[1:]:
        measured = replays[policy].iteration_s / replays[base].iteration_s
        text = f"# iteration time {policy} / {base}: {measured:.3f}x replayed"
        if policy in forecasts and base in forecasts:
            text += f", {forecasts[policy].seconds / forecasts[base].seconds:.3f}x forecast"
        lines.append(text)
    return lines


def emulator_line(loads: dict[int, EmulatorLoad]) -> str:
    """The run's summary of the live saturation flags (calibration.saturation)."""
    if not loads:
        return "emulator load: no configuration was sampled"
    flagged = sum(1 for load in loads.values() if load.saturated)
    if not flagged:
        return (
            f"emulator load: not saturated in any of the {len(loads)} configurations "
            "(CPU sampled over each measured window)"
        )
    return (
        f"emulator load: SATURATED in {flagged} of {len(loads)} configurations (marked in "
        "their tables): those cells measured the emulator, not the fabric"
    )


@dataclass(frozen=True)
class Measurement:
    """Where one launch's batches are measured and recorded (Runner._measure)."""

    testbed: Testbed
    launcher: Launcher
    writer: ResultsWriter
    sampler: CpuSampler
    offered: float  # the load guard's offered hop-bit/s (the emulator's load verdict)
    outcome: RunOutcome


class _WorkersFailed(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(str(failure))
        self.failure = failure


def _failure_dict(failure: Failure) -> dict[str, Any]:
    def problem(p: Any) -> dict[str, Any]:
        return {"rank": p.rank, "host": p.host, "kind": p.kind, "detail": p.detail}

    return {
        "stage": failure.stage,
        "culprits": [problem(p) for p in failure.culprits],
        "others": [problem(p) for p in failure.others],
        "text": str(failure),
    }


def _write_json(path: Path, document: object) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
