"""``astral run``: an experiment from start to finish, and the results bundle it leaves.

::

    spec = load(path)                     # ExperimentSpec; errors are ConfigErrors (exit 2)
    outcome = Runner(spec, RunOptions(), text=path.read_text()).run()
    outcome.bundle                        # results/<timestamp>-<name>/

What :meth:`Runner.run` does, in order:

1. load guard (:func:`load_guard`): the experiment's offered load against the emulator's
   measured capacity (``astral calibrate``), refusing above the safe share unless forced;
2. brings the fabric up once (:class:`~orchestrator.testbed.testbed.Testbed`: Mininet, controller,
   readiness; it takes the run lock) under the first policy;
3. per policy (policies vary slowest, :meth:`ExperimentSpec.steps`): reprograms the fabric
   (a controller restart on the same port, hitless); then per collective starts one worker
   per GPU of the placement, with the connections that collective needs (as many per peer
   as spread its fabric traffic over the NIC ports,
   orchestrator.collectives.ceilings.default_channels; their NIC ports as the experiment's
   ``host_ports`` says, orchestrator.testbed.hostports, and their source ports pinned to
   disjoint paths under ``path-pinned``), runs ``warmup +
   iterations`` operations per size, records them and prints the nccl-tests table
   (real-speed columns included);
4. tears the fabric down, renders the bundle's summary, tables and plots, and prints a
   side-by-side summary with the run's conditions.

Every number printed follows one definition of time (orchestrator.collectives.nccl.TIME_DEFINITION,
nccl-tests ``-a 1``): the tables printed during the run are computed by the same function
as the bundle's (orchestrator.results.summary.result_of) from the same records.

The bundle (orchestrator.results.store has the layout) gets, besides what ResultsWriter
writes, ``run.json``: what the runner knew and the database has no place for: the command,
the conditions (load average, datapath, TSO, cores), the load guard's verdict, timings
(bring-up, each policy switch, each step, teardown) and, if the run failed, the failing
ranks and hosts.

Endings: a worker that dies or hangs ends the run (the launcher names the rank and host),
the fabric is torn down, the bundle is marked ``failed``, exit status 4. Ctrl-C and SIGTERM
tear down too (the Emulation handles its part) and mark the bundle ``interrupted``
(exit 130, 143). The bundle keeps whatever was measured before the end.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from orchestrator import REPO
from orchestrator.collectives.nccl import TIME_DEFINITION, average_busbw, bus_factor, format_table
from orchestrator.collectives.sizes import format_size
from orchestrator.emulation.network import Terminated
from orchestrator.results import (
    ConnectionSample,
    IterationRecord,
    Phase,
    ResultsWriter,
    Versions,
)
from orchestrator.results.store import Configuration
from orchestrator.results.summary import ConfigurationResult, result_of
from orchestrator.run.experiment import (
    Collective,
    ConfigurationStep,
    ExperimentSpec,
)
from orchestrator.run.loadguard import LoadVerdict, load_guard
from orchestrator.testbed.testbed import Testbed
from orchestrator.worker.outcome import CollectiveResult, Failure, RunResult, phase_spans
from orchestrator.worker.spec import CollectiveTest, LaunchOptions
from topologies.errors import AstralError, EmulationError
from topologies.units import TCP_PAYLOAD_SHARE

DEFAULT_EXPERIMENT = REPO / "experiments" / "default.yaml"
RUN_FILE = "run.json"
TELEMETRY_FILE = "telemetry.jsonl"  # the controller's, copied (docs/telemetry.md)
EXIT_WORKERS_FAILED = EmulationError.exit_status

Say = Callable[[str], None]


@dataclass(frozen=True)
class RunOptions:
    """How to run an experiment (command-line options; defaults are ``astral run``'s)."""

    out: Path | None = None  # the bundle directory; default results/<timestamp>-<name>
    results_root: Path = Path("results")
    force: bool = False  # run even above the emulator's safe load (= load_limit.force)
    progress: bool = False  # a tqdm bar on stderr
    plots: bool = True
    ready_timeout: float = 60.0
    state_base: Path | None = None
    step_deadline: float = 30.0  # a step running longer than this is hung (launcher)
    channels: int | None = None  # connections per peer pair; None: per collective
    # (orchestrator.collectives.ceilings.default_channels: enough to spread over the NIC ports)
    worker_args: tuple[str, ...] = ()  # extra worker argv (tests: fault injection)


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
    """What else ran on this machine: the load average and its cores."""
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}


# --- from the launcher's results to the bundle's records -------------------------------------


def iteration_records(test: CollectiveResult) -> list[IterationRecord]:
    return [
        IterationRecord(
            iteration=iteration.iteration,
            rank=rank.rank,
            time_us=rank.time_us,
            bytes=rank.sent,
            wrong=max(rank.wrong, 0),
            warmup=iteration.warmup,
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
) -> tuple[int, Configuration, list[IterationRecord]]:
    """One collective x size of a run into the bundle; returns (id, configuration, records)."""
    t = test.test
    from orchestrator.collectives.operations import operation

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
    )
    return config_id, configuration, records


# --- progress ----------------------------------------------------------------------------------


class Progress:
    """A tqdm bar over the experiment's steps, weighted by their expected seconds (so the
    ETA is meaningful when sizes grow by 4x a step); silent when disabled."""

    def __init__(self, steps: Sequence[ConfigurationStep], rate: float, enabled: bool) -> None:
        self.weights = {s.index: step_seconds(s, rate) for s in steps}
        self.bar: Any = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(
                total=round(sum(self.weights.values()), 1),
                file=sys.stderr,
                dynamic_ncols=True,
                bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed}<{remaining}",
                leave=False,
            )

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

    def write(self, text: str, file: TextIO) -> None:
        if self.bar is not None:
            self.bar.write(text.rstrip("\n"), file=file)
        else:
            print(text.rstrip("\n"), file=file, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def step_seconds(
    step: ConfigurationStep, rate: float, efficiency: float = 0.6, overhead: float = 0.05
) -> float:
    """A rough time of one operation of ``step`` at ``efficiency`` of the per-GPU rate
    (bytes/s); every step runs the same number of operations, so it is a fair weight."""
    traffic = step.size * bus_factor(step.collective.op, step.ranks)
    return overhead + traffic / max(rate * efficiency, 1.0)


# --- the runner ------------------------------------------------------------------------------


class Runner:
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
    ) -> None:
        self.spec = spec
        self.options = options or RunOptions()
        self.text = text
        self.out = out or sys.stdout
        self._say = say
        self.command = list(command)
        self.progress: Progress | None = None
        self.run_file: dict[str, Any] = {}

    # -- messages ----------------------------------------------------------------------

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

    # -- the run -----------------------------------------------------------------------

    def bundle_path(self) -> Path:
        if self.options.out is not None:
            return self.options.out
        stamp = datetime.now().strftime("%Y%m%dT%H%M%S")
        return self.options.results_root / f"{stamp}-{self.spec.name}"

    def run(self, testbed: Testbed | None = None) -> RunOutcome:
        """Run the experiment; on a testbed given (already up, e.g. the pytest plugin's) or
        on one brought up here and torn down at the end. Raises AstralError for what stops
        a run before it starts (refused load, a fabric that does not come up)."""
        spec = self.spec
        outcome = RunOutcome(spec)
        began = time.monotonic()
        verdict = load_guard(spec, force=self.options.force)
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
        try:
            if testbed is None:
                testbed = Testbed(
                    spec.fabric,
                    policy=spec.policies[0],
                    state_base=self.options.state_base,
                    ready_timeout=self.options.ready_timeout,
                    log=self.say,
                )
                self.say(f"bringing up fabric {spec.fabric.name} ({spec.fabric_source})")
                testbed.start()
                outcome.timings["bring_up"] = round(testbed.emulation.timings.get("total", 0.0), 3)
                self.say(f"fabric up in {outcome.timings['bring_up']:.1f} s ({testbed.run_dir})")
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

    def _run_on(self, testbed: Testbed, outcome: RunOutcome) -> None:
        spec, options = self.spec, self.options
        steps = spec.steps()
        datapath = testbed.emulation.datapath
        self.run_file["conditions"]["datapath"] = datapath.kind if datapath else None
        self.run_file["conditions"]["userspace_tso"] = datapath.tso if datapath else None
        self.run_file["conditions"]["emulation_scale"] = testbed.scale
        self.run_file["conditions"]["rail_bandwidth_Bps"] = testbed.rail_bandwidth()
        launch = LaunchOptions(
            warmup=spec.warmup,
            iterations=spec.iterations,
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
        self.progress = Progress(steps, testbed.rail_bandwidth(), options.progress)
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
                for collective in spec.collectives:
                    group = [s for s in policy_steps if s.collective == collective]
                    results = []
                    with self._launcher(
                        testbed, replace(launch, channels=channels[collective]), collective
                    ) as launcher:
                        for step in group:
                            self.progress.step(step)
                            began = time.monotonic()
                            test = CollectiveTest(collective.op, collective.algorithm, step.size)
                            result = launcher.run([test])
                            for done in result.tests:
                                _, configuration, records = record_test(
                                    writer,
                                    policy,
                                    done,
                                    result,
                                    iterations=launch.iterations,
                                    warmup=launch.warmup,
                                    host_ports=spec.host_ports,
                                    dtype=spec.dtype,
                                )
                                if done.timed() and result.failure is None:
                                    results.append(result_of(configuration, records, testbed.scale))
                            step_times.append(
                                {
                                    "step": step.index,
                                    "policy": policy,
                                    "collective": collective.op,
                                    "algorithm": collective.algorithm,
                                    "size": step.size,
                                    "seconds": round(time.monotonic() - began, 3),
                                }
                            )
                            if result.failure is not None:
                                raise _WorkersFailed(result.failure)
                            self.progress.done(step)
                    outcome.results += results
                    self.emit(self._table(testbed, policy, collective.label, results))
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
            self._record_telemetry(writer, testbed)
            writer.finish(status="interrupted")
            raise
        finally:
            if self.progress is not None:
                self.progress.close()
        self._record_telemetry(writer, testbed)
        writer.finish(status=outcome.status)

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
        try:
            launcher.start()
        except EmulationError:
            failure = launcher.failure
            launcher.close()
            if failure is not None:
                raise _WorkersFailed(failure) from None
            raise
        try:
            yield launcher
        finally:
            launcher.close()

    def _record_telemetry(self, writer: ResultsWriter, testbed: Testbed) -> None:
        """The controller's port counters into the database, its telemetry file (routes of
        the policies that place flows included) into the bundle as it is."""
        try:
            counters = testbed.port_counters()
            if counters:
                writer.add_port_counters(counters)
            path = testbed.telemetry_path
            if path is not None and path.exists():
                shutil.copyfile(path, writer.path / TELEMETRY_FILE)
            self.run_file["port_counters"] = len(counters)
        except (OSError, ValueError) as error:
            self.say(f"cannot read the controller's telemetry: {error}")

    def _table(
        self, testbed: Testbed, policy: str, label: str, results: list[ConfigurationResult]
    ) -> str:
        spec = self.spec
        title = [
            f"{label}, policy {policy}, host ports {spec.host_ports}, {spec.ranks} ranks, "
            f"{spec.iterations} iterations "
            f"(+{spec.warmup} warm-up), fabric {spec.fabric.name}",
            TIME_DEFINITION,
        ]
        return format_table([r.row for r in results], title=title, scale=testbed.scale)

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
        _write_json(outcome.bundle / RUN_FILE, self.run_file)
        try:
            from orchestrator.results.report import render_bundle

            plots = self.options.plots and outcome.status != "interrupted"
            render_bundle(outcome.bundle, plots=plots)
        except (AstralError, OSError, ValueError) as error:
            self.say(f"rendering the bundle failed: {error}")
        for line in self.summary_lines(outcome, testbed):
            self.emit(line)

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
            lines.append(f"#   {'collective':<{width}}{head}")
            for collective in spec.collectives:
                cells = []
                for policy in spec.policies:
                    value = averages.get((policy, collective.op, collective.algorithm), math.nan)
                    cell = "-" if math.isnan(value) else f"{value / scale:.2f} ({value:.6f})"
                    cells.append(f"{cell:>26}")
                lines.append(f"#   {collective.label:<{width}}{''.join(cells)}")
        fabric = spec.fabric
        rail = fabric.nic_ports * fabric.speeds.nic / 8 / 1e9
        lines.append(
            f"# per-GPU rail bandwidth {fabric.nic_ports} x {fabric.speeds.nic / 1e9:g}G = "
            f"{rail:g} GB/s real ({rail * scale * 1e3:g} MB/s emulated); TCP over 1500-byte "
            f"frames carries at most {TCP_PAYLOAD_SHARE:.3f} of it"
        )
        if outcome.verdict is not None:
            lines += [f"# {line}" for line in outcome.verdict.summary()]
        if outcome.failure is not None:
            lines.append(f"# FAILED: {outcome.failure}")
        elif outcome.error:
            lines.append(f"# stopped: {outcome.error}")
        timings = outcome.timings
        parts = [f"total {timings.get('total', 0):.1f} s"]
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
