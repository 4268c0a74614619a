"""pytest plugin: emulated fabrics as fixtures, for integration tests of your own.

Installed with the package (entry point ``pytest11``), so every pytest run in the
environment has it; a project that vendors astral lists it in its top-level conftest.py
instead (``pytest_plugins = ["orchestrator.pytest_plugin"]``). docs/pytest-plugin.md has
the guide. The fixture::

    def test_ring(astral_fabric):
        fabric = astral_fabric("astral-small", policy="ecmp")       # up once per module
        result = fabric.run("all-reduce", "ring", sizes=["64K", "1M"])
        assert result.wrong == 0
        assert all(0 < row.busbw < fabric.busbw_ceiling("all-reduce", "ring") for row in result)
        fabric.port_counters()                                       # controller telemetry
        bundle = fabric.bundle()                                     # results bundle dir

``astral_fabric`` is module-scoped: the first call in a test module brings the fabric up
(about 2 s for astral-small), later calls with the same fabric reuse it (switching the
policy if another is asked for: a controller restart, about 1 s), a call with another
fabric tears the first down. Everything is torn down when the module's tests are done,
whether they passed, failed or were interrupted (pytest runs fixture finalizers in every
case); one fabric at a time, because runs take a machine-wide lock.

Needs root, Mininet's ``mnexec`` and a running Open vSwitch: without them the fixture skips
the test with the reason, except under CI (the environment variable ``CI`` set), where it
fails the test instead (:func:`unavailable`): a CI run must not pass by skipping the tests
that need a fabric. While another run holds the machine-wide lock, bring-up waits for it
(``lock_wait``, default ``$ASTRAL_LOCK_WAIT`` or 600 s) instead of failing.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

# Seconds a fixture waits for another run to release the machine-wide run lock.
LOCK_WAIT = float(os.environ.get("ASTRAL_LOCK_WAIT", "600"))

if TYPE_CHECKING:
    from orchestrator.results import PortCounter, ResultsWriter
    from orchestrator.run.experiment import ExperimentSpec
    from orchestrator.run.runner import RunOptions, RunOutcome
    from orchestrator.testbed.testbed import Testbed
    from orchestrator.worker.outcome import Failure, RunResult


@dataclass(frozen=True)
class SizeResult:
    """One row of an nccl-tests table. Bandwidths in GB/s (10^9 bytes/s), emulated;
    ``busbw_real`` and ``algbw_real`` scaled back to real link speeds."""

    size: int
    count: int
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None  # None: not verified
    scale: float

    @property
    def busbw_real(self) -> float:
        return self.busbw / self.scale

    @property
    def algbw_real(self) -> float:
        return self.algbw / self.scale


@dataclass
class CollectiveRun:
    """What :meth:`FabricHandle.run` returns: one row per size (iterate it), #wrong, the
    failure if a worker died or hung (rank and host), and the launcher's full result."""

    collective: str
    algorithm: str
    policy: str
    host_ports: str  # how hosts picked NIC ports (orchestrator/testbed/hostports.py)
    rows: list[SizeResult]
    result: RunResult
    table_text: str = ""

    def __iter__(self) -> Iterator[SizeResult]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def wrong(self) -> int | None:
        """Wrong elements over all sizes (warm-up included); None if a size was not
        verified (so that ``assert result.wrong == 0`` cannot pass on unchecked data)."""
        counts = [row.wrong for row in self.rows]
        if any(count is None for count in counts):
            return None
        return sum(count for count in counts if count is not None)

    @property
    def failure(self) -> Failure | None:
        return self.result.failure

    @property
    def average_busbw(self) -> float:
        values = [r.busbw for r in self.rows if not math.isnan(r.busbw)]
        return sum(values) / len(values) if values else math.nan

    def raise_for_failure(self) -> None:
        self.result.raise_for_failure()

    def table(self) -> str:
        """The nccl-tests table, real-speed columns included."""
        return self.table_text


@dataclass
class FabricHandle:
    """A fabric that is up, for tests: run collectives, switch policies, read results."""

    testbed: Testbed
    bundle_root: Path
    _writer: ResultsWriter | None = None
    _bundles: int = 0
    bundles: list[Path] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.testbed.description.fabric.name

    @property
    def policy(self) -> str:
        return self.testbed.policy

    @property
    def gpus(self) -> list[str]:
        return [g.name for g in self.testbed.description.fabric.gpus_by_rank()]

    def use_policy(self, policy: str) -> float:
        """Reprogram the fabric under ``policy``; seconds it took."""
        return self.testbed.use_policy(policy)

    def rail_bandwidth(self) -> float:
        """One GPU's emulated NIC bandwidth, GB/s (NIC ports x emulated rate)."""
        return self.testbed.rail_bandwidth() / 1e9

    def busbw_ceiling(
        self, collective: str, algorithm: str, gpus: Sequence[str] | None = None
    ) -> float:
        """The configuration's own busbw ceiling, GB/s emulated: the busbw at which the
        busiest rank's fabric bytes (NVLink bytes taken as free) would move at full NIC
        bandwidth times TCP's payload share (orchestrator.collectives.ceilings). The rail
        bandwidth x 1460/1514 for flat algorithms; higher where NVLink carries a share
        (hierarchical all-reduce, PXN all-to-all)."""
        return self.testbed.ceiling(gpus, collective, algorithm).busbw

    def run(
        self,
        collective: str,
        algorithm: str | None = None,
        sizes: Sequence[int | str] = (1 << 20,),
        *,
        iterations: int = 3,
        warmup: int = 1,
        gpus: Sequence[str] | None = None,
        channels: int | None = None,
        step_deadline: float = 30.0,
        worker_args: Sequence[str] = (),
        record: bool = True,
        host_ports: str | None = None,
    ) -> CollectiveRun:
        """Run ``collective`` (its default algorithm unless given) at each size on ``gpus``
        (default all, rank order), NIC ports picked as ``host_ports`` says (``balanced`` or
        ``hash``; default the testbed's, ``balanced``); recorded into the current bundle
        unless ``record`` is false. A worker failure does not raise: see ``.failure``
        (``raise_for_failure()``)."""
        from orchestrator.collectives.nccl import TIME_DEFINITION, format_table
        from orchestrator.collectives.plans import COLLECTIVES
        from orchestrator.collectives.sizes import parse_size
        from orchestrator.worker.spec import CollectiveTest, LaunchOptions
        from topologies.latency import latency_record, latency_title

        algorithm = algorithm or COLLECTIVES[collective][0]
        testbed = self.testbed
        host_ports = host_ports or testbed.host_ports
        options = LaunchOptions(
            warmup=warmup,
            iterations=iterations,
            channels=channels or testbed.default_channels(gpus, [(collective, algorithm)]),
            step_deadline=step_deadline,
            worker_args=tuple(worker_args),
        )
        tests = [CollectiveTest(collective, algorithm, parse_size(s)) for s in sizes]
        result = testbed.run(tests, gpus, options, host_ports=host_ports)
        rows = [
            SizeResult(
                size=row.size,
                count=row.count,
                time_us=row.time_us,
                algbw=row.algbw,
                busbw=row.busbw,
                wrong=row.wrong,
                scale=testbed.scale,
            )
            for row in result.rows()
        ]
        title = [
            f"{collective} ({algorithm}), policy {testbed.policy}, host ports {host_ports}",
            TIME_DEFINITION,
        ]
        latency = latency_title(latency_record(testbed.description.fabric, gpus))
        title += [latency] if latency else []
        text = format_table(result.rows(), title=title, scale=testbed.scale)
        if record:
            self._record(result, iterations, warmup, gpus, host_ports)
        return CollectiveRun(collective, algorithm, testbed.policy, host_ports, rows, result, text)

    def run_experiment(
        self, spec: ExperimentSpec | str | Path, options: RunOptions | None = None, **kwargs: Any
    ) -> RunOutcome:
        """Run an experiment (a spec or a file) the way ``astral run`` does, on this fabric
        (its fabric must be this one); ``kwargs`` go to :class:`Runner`."""
        from orchestrator.run.experiment import load_experiment
        from orchestrator.run.runner import Runner, RunOptions

        text = None
        if not hasattr(spec, "steps"):
            text = Path(str(spec)).read_text(encoding="utf-8")
            spec = load_experiment(str(spec))
        assert not isinstance(spec, (str, Path))
        if spec.fabric.name != self.name:
            raise ValueError(f"experiment fabric {spec.fabric.name} is not {self.name}")
        if options is None:
            self._bundles += 1
            options = RunOptions(out=self.bundle_root / f"experiment-{self._bundles}")
        return Runner(spec, options, text=text, **kwargs).run(self.testbed)

    # --- results ------------------------------------------------------------------------

    def port_counters(self, since: float | None = None) -> list[PortCounter]:
        """Switch port counters from the controller's telemetry (cumulative)."""
        return self.testbed.port_counters(since)

    def _record(
        self,
        result: RunResult,
        iterations: int,
        warmup: int,
        gpus: Sequence[str] | None,
        host_ports: str,
    ) -> None:
        from orchestrator.results import ResultsWriter
        from orchestrator.run.runner import record_test, software_versions

        if self._writer is None:
            self._bundles += 1
            path = self.bundle_root / f"bundle-{self._bundles}"
            self._writer = ResultsWriter(path, self.testbed.description)
            self._writer.add_run(
                experiment="pytest", host=socket.gethostname(), versions=software_versions()
            )
        for test in result.tests:
            config_id, _, _ = record_test(
                self._writer,
                self.testbed.policy,
                test,
                result,
                iterations=iterations,
                warmup=warmup,
                host_ports=host_ports,
            )
            ceiling = self.testbed.ceiling(gpus, test.test.collective, test.test.algorithm)
            self._writer.add_ceiling(config_id, ceiling)

    def bundle(self, *, plots: bool = False) -> Path:
        """Close the results bundle of the runs so far (port counters included) and render
        its summary and tables (``plots``: also the PNGs); later runs start a new one."""
        writer = self._writer
        if writer is None:
            raise ValueError("no collective has been recorded since the last bundle()")
        self._writer = None
        counters = self.testbed.port_counters()
        if counters:
            writer.add_port_counters(counters)
        writer.finish()
        from orchestrator.results.report import render_bundle

        render_bundle(writer.path, plots=plots)
        self.bundles.append(writer.path)
        return writer.path

    def close(self) -> None:
        if self._writer is not None:
            self._writer.finish(status="failed")
            self._writer = None
        self.testbed.stop()


class FabricFactory:
    """What the ``astral_fabric`` fixture yields: call it to get a fabric that is up."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.current: FabricHandle | None = None
        self._key: str | None = None
        self._count = 0

    def __call__(
        self,
        fabric: str | Path = "astral-small",
        policy: str = "shortest",
        *,
        ready_timeout: float = 60.0,
        telemetry_interval: float | None = 0.5,
        lock_wait: float = LOCK_WAIT,
    ) -> FabricHandle:
        key = f"{fabric}|{telemetry_interval}"
        if self.current is not None and self._key == key:
            self.current.use_policy(policy)
            return self.current
        self.close()
        from orchestrator.testbed.testbed import Testbed

        # another run (a colleague's, another test session) may hold the lock
        testbed = Testbed(
            fabric,
            policy=policy,
            ready_timeout=ready_timeout,
            telemetry_interval=telemetry_interval,
            lock_wait=lock_wait,
        )
        testbed.start()
        self._count += 1
        handle = FabricHandle(testbed, self.root / f"fabric-{self._count}")
        handle.bundle_root.mkdir(parents=True, exist_ok=True)
        self.current, self._key = handle, key
        return handle

    def close(self) -> None:
        if self.current is not None:
            current, self.current, self._key = self.current, None, None
            current.close()


def missing_requirements() -> str | None:
    """Why a fabric cannot come up here (None if it can): root, the commands, and both
    Open vSwitch daemons answering."""
    if os.geteuid() != 0:
        return "needs root (run: sudo ./setup.sh test)"
    absent = [command for command in ("ovs-vsctl", "mnexec") if shutil.which(command) is None]
    if absent:
        return f"needs Open vSwitch and Mininet's mnexec ({', '.join(absent)} not on PATH)"
    # `ovs-vsctl show` reaches ovsdb-server only; ovs-appctl reaches ovs-vswitchd itself.
    # Generous timeouts: a busy ovs-vswitchd (hundreds of bridges) answers slowly.
    for argv in (
        ["ovs-vsctl", "--timeout=20", "show"],
        ["ovs-appctl", "--timeout=20", "-t", "ovs-vswitchd", "version"],
    ):
        try:
            subprocess.run(argv, capture_output=True, check=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return f"needs Open vSwitch running (`{' '.join(argv)}` failed; run ./setup.sh)"
    return None


def under_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this is a CI run: the environment variable ``CI`` is set (to anything but
    the empty string), as CI services and this project's ``.ci/run`` set it."""
    return bool(environ.get("CI"))


def unavailable_outcome(reason: str, environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """What a test that cannot get a fabric for ``reason`` becomes: ("skip", reason), or
    under CI ("fail", a sentence saying why it could not run)."""
    if under_ci(environ):
        return "fail", f"cannot run under CI (CI is set): {reason}"
    return "skip", reason


def unavailable(reason: str, environ: Mapping[str, str] = os.environ) -> NoReturn:
    """Skip the current test for ``reason``, or fail it under CI (:func:`unavailable_outcome`)."""
    outcome, message = unavailable_outcome(reason, environ)
    if outcome == "fail":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def astral_fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FabricFactory]:
    """A factory: ``astral_fabric(fabric="astral-small", policy="shortest")`` returns a
    :class:`FabricHandle` on a fabric that is up; torn down after the module's tests."""
    missing = missing_requirements()
    if missing is not None:
        unavailable(f"astral_fabric {missing}")
    factory = FabricFactory(tmp_path_factory.mktemp("astral"))
    try:
        yield factory
    finally:
        factory.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A Ctrl-C or SIGTERM that a run took for itself stops the session after this test.

    A run in this process takes SIGINT, SIGTERM and SIGHUP to wind down and report itself
    interrupted, and pytest never sees the signal: a session given Ctrl-C, or ``.ci/run``'s
    timeout, went on to its next test (orchestrator.emulation.signals). Asked after the
    test, its fixtures and their fabrics are torn down as pytest does on a stop."""
    from orchestrator.emulation import signals

    mark = signals.mark()
    yield
    taken = signals.since(mark)
    if taken:
        name = signal.Signals(taken[0]).name
        item.session.shouldstop = f"{name} arrived during {item.nodeid}: its run took it"
