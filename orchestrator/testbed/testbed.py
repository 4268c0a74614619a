"""A testbed: one emulated fabric, brought up once, on which collectives run under policies.

What ``astral run`` (orchestrator.run.runner) and the pytest plugin (orchestrator.pytest_plugin)
hold while they work. It ties three owners together and owns nothing else itself:

- :class:`~orchestrator.emulation.network.Emulation`: the Mininet fabric, the controller process,
  the run record, readiness and teardown (also on Ctrl-C and SIGTERM);
- the controller's load-balancing policy: :meth:`Testbed.use_policy` restarts the
  controller process with another policy on the same OpenFlow port. The switches keep
  forwarding while it is away (fail-secure), reconnect within a second, and the new process
  reads each switch's table and sends only the difference (controllers/app.py), so the
  switch is hitless; the call returns once every switch is programmed again. Every restart
  the testbed makes is kept with its instants (:attr:`Testbed.restarts`): seen from the
  controller's events and counters it looks like a crash and recovery, and a run's bundle
  records it so that the diagnosis does not take it for one;
- :class:`~orchestrator.worker.launcher.Launcher`: one worker per GPU, spawned inside the
  GPU's namespace (``host.popen``, recorded in the run record so that teardown stops it),
  talking to each other on fabric addresses across servers and NVLink addresses inside a
  server, to the launcher over a Unix socket in the run directory.

Workers listen on one fixed port (:data:`WORKER_PORT`; every GPU has its own namespace, so
they do not clash), which makes each connection's destination port known before it opens,
and with a source port chosen in advance the whole five-tuple: which NIC port the kernel
sends it out of and, under a policy that declares ``pins_source_ports`` (``path-pinned``),
its path. How hosts pick NIC ports is a setting of its own, ``host_ports``
(:mod:`orchestrator.testbed.hostports`: ``balanced``, the default, or ``hash``), and
:mod:`orchestrator.testbed.pinning` chooses the source ports for it.

Usage::

    with Testbed("astral-small", policy="ecmp") as bed:
        result = bed.run([CollectiveTest("all-reduce", "ring", 1 << 20)])
        print(result.table())
        hashed = bed.run([...], host_ports="hash")      # the kernel's hash picks NIC ports
        bed.use_policy("path-pinned")
        with bed.launch(options=LaunchOptions(iterations=5)) as launcher:   # several runs,
            launcher.run([...]); launcher.run([...])                         # one start-up
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from controllers.policies import PolicyRegistry
from controllers.policies import default_registry as policy_registry
from controllers.routing import programmable_switches
from orchestrator import REPO
from orchestrator.cluster.emulation import ClusterEmulation, ClusterMachine
from orchestrator.collectives.ceilings import (
    Ceiling,
    configuration_ceiling,
    default_channels,
    min_batch_seconds,
)
from orchestrator.collectives.latency import LatencyTable
from orchestrator.emulation.network import Emulation, Log
from orchestrator.emulation.shaping import DEFAULT_RECIPE
from orchestrator.results import PortCounter
from orchestrator.results.store import ControllerRestart
from orchestrator.testbed.hostports import BALANCED, DEFAULT_HOST_PORTS, check_host_ports
from orchestrator.testbed.monitoring import FULL, MonitorLevel
from orchestrator.testbed.pinning import (
    PATHS_FILE,
    Pinning,
    held_ports,
    source_ports,
    wait_for_paths,
)
from orchestrator.testbed.telemetry import read_telemetry
from orchestrator.testbed.tracing import PathTraces, trace_connections
from orchestrator.worker.launcher import Launcher, WorkerProcess
from orchestrator.worker.outcome import ConnectionInfo, RunResult
from orchestrator.worker.spec import (
    WORKER_PORT,
    CollectiveTest,
    LaunchOptions,
    WorkerSpec,
    workers_from_description,
)
from topologies.description import FabricDescription
from topologies.errors import EmulationError
from topologies.fabricspec import FabricSpec
from topologies.latency import applied_latency

TELEMETRY_INTERVAL = FULL.telemetry_interval  # seconds between counter polls (None: off)
# the longest a controller restart waits for its first round of port counters
FIRST_COUNTERS_S = 2.0
LIVE_FILE = "live.json"  # the ranks' progress while a launch runs (orchestrator.monitor.live)


class Testbed:
    """An emulated fabric plus its controller and workers; a context manager.

    ``fabric``: a preset name, a fabric file, a FabricSpec or a FabricDescription (as
    :class:`Emulation` takes it). ``policy``: the controller's policy at bring-up.
    ``telemetry_interval``: the controller polls every switch's counters this often into
    the run directory's telemetry file (:meth:`port_counters` reads it); None: no polling.
    ``host_ports``: how launches pick NIC ports unless told (orchestrator.testbed.hostports).
    """

    def __init__(
        self,
        fabric: str | Path | FabricSpec | FabricDescription | None = None,
        *,
        policy: str = "shortest",
        state_base: Path | None = None,
        ready_timeout: float = 60.0,
        handle_signals: bool = True,
        log: Log | None = None,
        telemetry_interval: float | None = TELEMETRY_INTERVAL,
        lock_wait: float = 0.0,
        host_ports: str = DEFAULT_HOST_PORTS,
        cluster: Sequence[ClusterMachine] | None = None,
    ) -> None:
        self.host_ports = check_host_ports(host_ports)
        # the controller's policies: their names, and what each asks of the hosts
        self.policies: PolicyRegistry = policy_registry()
        self.policies.get(policy, source="testbed")  # an unknown name: ConfigError
        settings: dict[str, Any] = {
            "policy": policy,
            "state_base": state_base,
            "ready_timeout": ready_timeout,
            "handle_signals": handle_signals,
            "log": log,
            "telemetry_interval": telemetry_interval,
            "lock_wait": lock_wait,
        }
        # One fabric over several machines (orchestrator.cluster) or all of it here.
        self.emulation = (
            ClusterEmulation(fabric, machines=cluster, **settings)
            if cluster
            else Emulation(fabric, **settings)
        )
        self.ready_timeout = ready_timeout
        self.policy = policy
        self.policy_switches: dict[str, float] = {}  # policy -> seconds to reprogram
        self.pinning: Pinning | None = None  # the last launch's source ports (None: none)
        self._policy_since = 0.0  # epoch seconds of the last controller (re)start
        self.restarts: list[ControllerRestart] = []  # every controller restart made here
        self._launches = 0
        self.monitor: MonitorLevel = FULL  # what launches record (use_monitor)
        self.launcher: Launcher | None = None  # the last launch's
        self.launch_dirs: list[Path] = []  # every launch's directory (its worker logs)

    # --- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> Testbed:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Testbed:
        self.emulation.start()
        return self

    def stop(self) -> None:
        self.emulation.stop()

    @property
    def description(self) -> FabricDescription:
        if self.emulation.description is None:
            raise EmulationError("the testbed has not been started")
        return self.emulation.description

    @property
    def run_dir(self) -> Path:
        return self.emulation.run_dir

    @property
    def scale(self) -> float:
        return self.description.fabric.spec.emulation.scale

    @property
    def nic_ports(self) -> int:
        return self.description.fabric.spec.nic_ports

    def rail_bandwidth(self) -> float:
        """One GPU's emulated NIC bandwidth, bytes/s: NIC ports x the NIC links' rate."""
        spec = self.description.fabric.spec
        return spec.nic_ports * spec.emulation.emulated(spec.speeds.nic) / 8

    def ceiling(self, gpus: Sequence[str] | None, collective: str, algorithm: str) -> Ceiling:
        """The busbw ceiling of ``collective``/``algorithm`` with ranks on ``gpus`` (default:
        every GPU), on this fabric's NIC rate and shapers (orchestrator.collectives.ceilings)."""
        recipe = self.emulation.fitted_recipe
        assert recipe is not None  # the emulation is up: it described the fabric
        return configuration_ceiling(
            self.workers(gpus),
            collective,
            algorithm,
            self.rail_bandwidth(),
            burst_s=DEFAULT_RECIPE.burst_s,  # the recipe wiring and hostconfig apply
            payload_share=recipe.payload_share,
        )

    # --- policies -----------------------------------------------------------------------

    @property
    def pins_source_ports(self) -> bool:
        """Whether the current policy picks a connection's path by its TCP source port (its
        declaration, ``controllers.policies.Policy.pins_source_ports``): then :meth:`launch`
        chooses every connection's source port from the paths the policy publishes."""
        return self.policies.get(self.policy).pins_source_ports

    def use_policy(self, name: str, timeout: float | None = None) -> float:
        """Reprogram the fabric with policy ``name``; returns the seconds it took (0 if it
        is the current one). Restarts the controller on its port and waits until every
        switch is programmed under the new policy."""
        self.policies.get(name, source="testbed")  # an unknown name: ConfigError
        if name == self.policy:
            return 0.0
        controller = self.emulation.controller
        if controller is None:
            raise EmulationError("the testbed has no controller: start it first")
        began = time.monotonic()
        self.policy = name
        controller.policy = name
        self.description.extra["policy"] = name
        self._restart_controller("policy", timeout)
        seconds = time.monotonic() - began
        self.policy_switches[name] = seconds
        return seconds

    def use_monitor(self, level: MonitorLevel, timeout: float | None = None) -> float:
        """Record at ``level`` from the next launch on (orchestrator.testbed.monitoring);
        restarts the controller (as :meth:`use_policy` does: hitless) when its counter
        polling changes. Returns the seconds that took (0 if nothing restarted)."""
        self.monitor = level
        controller = self.emulation.controller
        if controller is None or controller.telemetry_interval in (
            None,
            level.telemetry_interval,
        ):
            return 0.0
        began = time.monotonic()
        controller.telemetry_interval = level.telemetry_interval
        self._restart_controller("monitor", timeout)
        return time.monotonic() - began

    def _restart_controller(self, reason: str, timeout: float | None) -> None:
        """Restart the controller and wait until every switch is programmed again, keeping
        the restart in :attr:`restarts` from the moment it begins (``ended`` None until
        the switches are programmed: a live diagnosis may look meanwhile)."""
        controller = self.emulation.controller
        if controller is None:
            raise EmulationError("the testbed has no controller: start it first")
        self._policy_since = time.time()
        self.restarts.append(ControllerRestart(self._policy_since, None, self.policy, reason))
        controller.restart()
        controller.wait_programmed(timeout=timeout or self.ready_timeout)
        if controller.telemetry_interval:
            self._wait_first_counters(self._policy_since)
        self.restarts[-1] = replace(self.restarts[-1], ended=time.time())

    def _wait_first_counters(self, since: float) -> None:
        """Wait (at most :data:`FIRST_COUNTERS_S`) for the restarted controller's first
        round of port counters: a connection that starts before it has no counter sample
        before its first byte, and the counters cannot confirm its path (a run's first
        configuration started 50 ms after that round, and tests/integration/test_path_trace.py
        failed now and then when a switch's reply came after the first byte)."""
        switches = {s.name for s in programmable_switches(self.description.fabric)}
        deadline = time.monotonic() + FIRST_COUNTERS_S
        while time.monotonic() < deadline:
            try:
                if switches <= {c.switch for c in self.port_counters(since=since)}:
                    return
            except (OSError, ValueError):
                pass  # the file not written yet, or a line being written
            time.sleep(0.1)

    def process_groups(self) -> dict[str, list[int]]:
        """The emulator's own processes by role, for the host layer's CPU figures: the
        controller and the current launch's workers."""
        controller = self.emulation.controller
        groups: dict[str, list[int]] = {"controller": [], "workers": []}
        if controller is not None and controller.pid is not None:
            groups["controller"].append(controller.pid)
        launcher = self.launcher
        if launcher is not None:
            groups["workers"] = launcher.pids()
        return groups

    # --- workers ------------------------------------------------------------------------

    def workers(self, gpus: Sequence[str] | None = None) -> list[WorkerSpec]:
        """Rank i on ``gpus[i]`` (default: every GPU in rank order)."""
        return workers_from_description(self.description, gpus)

    def spawn(self, worker: WorkerSpec, argv: list[str], log: IO[bytes]) -> WorkerProcess:
        """Start a worker inside its GPU's namespace (recorded: teardown stops it)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        return self.emulation.popen(
            worker.host,
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(REPO),
            env=env,
        )

    def default_channels(
        self, gpus: Sequence[str] | None, collectives: Sequence[tuple[str, str]] | None
    ) -> int:
        """Connections per peer pair for ``collectives`` on ``gpus``: the most any of them
        needs to spread over the NIC ports (orchestrator.collectives.ceilings.default_channels)."""
        if not collectives:
            return self.nic_ports
        workers = self.workers(gpus)
        return max(default_channels(workers, op, alg, self.nic_ports) for op, alg in collectives)

    def launch_options(
        self,
        options: LaunchOptions | None = None,
        gpus: Sequence[str] | None = None,
        collectives: Sequence[tuple[str, str]] | None = None,
    ) -> LaunchOptions:
        """``options`` completed for this fabric: the default channels of ``collectives``
        when no options are given, the timed batches' minimum length for this fabric's
        shapers (unless set), the fabric's latencies unless the options carry their own,
        and the fixed listening port."""
        if options is None:
            options = LaunchOptions(channels=self.default_channels(gpus, collectives))
        options = replace(options, tcp_info=options.tcp_info or self.monitor.tcp_info)
        # never below the shapers' floor (a shorter batch would let their buckets count)
        floor = min_batch_seconds(DEFAULT_RECIPE.burst_s)
        if options.min_batch_seconds < floor:
            options = replace(options, min_batch_seconds=floor)
        if options.latency is None:
            options = replace(options, latency=self.latency_table(gpus))
        return replace(options, worker_args=("--port", str(WORKER_PORT), *options.worker_args))

    def latency_table(self, gpus: Sequence[str] | None = None) -> LatencyTable:
        """The emulated per-step latencies of ranks on ``gpus`` (topologies/latency.py);
        empty with ``latency: off``."""
        names = [w.host for w in self.workers(gpus)]
        applied = applied_latency(self.description.fabric, names)
        return (
            LatencyTable(applied.one_way, applied.operation) if applied.enabled else LatencyTable()
        )

    def launch(
        self,
        gpus: Sequence[str] | None = None,
        options: LaunchOptions | None = None,
        collectives: Sequence[tuple[str, str]] | None = None,
        *,
        host_ports: str | None = None,
    ) -> Launcher:
        """A launcher for workers on ``gpus`` (use it as a context manager). Unless
        ``options`` name source ports, every fabric connection's source port is chosen for
        ``host_ports`` (default :attr:`host_ports`) and the policy (orchestrator.testbed.pinning:
        NIC ports spread under ``balanced``, paths from the controller's under a policy that
        pins source ports, :attr:`pins_source_ports`), balanced for each of ``collectives``
        ((op, algorithm), in the order they will run; default: every one)."""

        workers = self.workers(gpus)
        options = self.launch_options(options, gpus, collectives)
        self.pinning = None
        host_ports = check_host_ports(host_ports or self.host_ports)
        planned = self.pins_source_ports or host_ports == BALANCED
        if planned and not options.source_ports:
            paths = None
            if self.pins_source_ports:
                paths = wait_for_paths(
                    self.run_dir / PATHS_FILE, self._policy_since, policy=self.policy
                )
            pinning = source_ports(
                self.emulation,
                self.description,
                workers,
                options.channels,
                WORKER_PORT,
                collectives,
                host_ports=host_ports,
                paths=paths,
                taken=held_ports(self.emulation, workers),
            )
            self.pinning = pinning
            options = replace(options, source_ports=pinning.ports)
        self._launches += 1
        run_dir = self.run_dir / f"workers-{self._launches}"
        self.launch_dirs.append(run_dir)
        live = self.run_dir / LIVE_FILE if self.monitor.live else None
        self.launcher = Launcher(
            workers,
            spawn=self.spawn,
            options=options,
            run_dir=run_dir,
            live=live,
            clock_offsets=self.clock_offsets(),
        )
        return self.launcher

    def clock_offsets(self) -> dict[str, float]:
        """GPU -> its machine's clock minus this one's (a cluster run's, measured at
        bring-up: orchestrator.cluster.emulation); empty on one machine."""
        emulation = self.emulation
        if not isinstance(emulation, ClusterEmulation) or emulation.placement is None:
            return {}
        offsets = emulation.clock_offsets
        return {
            gpu: offsets[emulation.machine_of(gpu)]
            for gpu in self.description.fabric.gpus
            if emulation.machine_of(gpu) in offsets
        }

    def run(
        self,
        tests: Sequence[CollectiveTest],
        gpus: Sequence[str] | None = None,
        options: LaunchOptions | None = None,
        *,
        host_ports: str | None = None,
    ) -> RunResult:
        """Start workers, run ``tests``, stop them. A worker failure is in the result's
        ``failure`` (by rank and host); nothing of the fabric is touched by it."""
        collectives = list(dict.fromkeys((t.collective, t.algorithm) for t in tests))
        with self.launch(gpus, options, collectives, host_ports=host_ports) as launcher:
            return launcher.run(tests)

    def trace_paths(
        self, connections: Sequence[ConnectionInfo], workers: Sequence[WorkerSpec] | None = None
    ) -> PathTraces:
        """Every fabric connection's path as the kernels and switches forward it now
        (orchestrator.testbed.tracing); ``workers``: whose ranks the connections name
        (default: the last launch's)."""
        if workers is None:
            if self.launcher is None:
                raise EmulationError("no launch to trace the connections of")
            workers = self.launcher.workers
        return trace_connections(self.emulation, self.description, workers, connections)

    # --- telemetry ----------------------------------------------------------------------

    @property
    def telemetry_path(self) -> Path | None:
        """The controller's telemetry file (docs/telemetry.md), None without telemetry."""
        controller = self.emulation.controller
        if controller is None or controller.telemetry_interval is None:
            return None
        return controller.telemetry_path

    def port_counters(self, since: float | None = None) -> list[PortCounter]:
        """Switch port counters the controller published (cumulative, model port numbers),
        those sampled after ``since`` (epoch seconds) if given; empty without telemetry."""
        path = self.telemetry_path
        if path is None or not path.exists():
            return []
        counters = []
        for stats in read_telemetry(path).rounds:
            for switch in stats.switches.values():
                if since is not None and switch.t <= since:
                    continue
                counters += [
                    PortCounter(
                        t=switch.t,
                        switch=switch.name,
                        port=p.port,
                        rx_bytes=p.rx_bytes,
                        tx_bytes=p.tx_bytes,
                        rx_packets=p.rx_packets,
                        tx_packets=p.tx_packets,
                        drops=p.rx_dropped + p.tx_dropped,
                        rx_dropped=p.rx_dropped,
                        tx_dropped=p.tx_dropped,
                        rx_errors=p.rx_errors,
                        tx_errors=p.tx_errors,
                    )
                    for p in switch.ports
                ]
        return counters
