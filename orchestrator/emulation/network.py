"""The emulated fabric: a fabric description brought up in Mininet, owned by one object.

::

    with Emulation("topologies/presets/astral-small.yaml") as emu:
        emu.host("p0s0g0").cmd("ping -c1 10.1.0.1")      # a Mininet Host
        emu.description.addresses["p0s1g1"].fabric_ip    # the addressing plan
        worker = emu.popen("p0s0g0", ["python3", "-m", "worker"])   # recorded, cleaned
    # everything the run created is gone here, whatever happened inside

Bring-up, in order (``Emulation.timings`` has the seconds of each step):

1. lock (orchestrator.emulation.lock: one run at a time); clean what earlier killed runs recorded
2. run record (orchestrator.emulation.state) and signal handlers (SIGTERM/SIGHUP -> teardown)
3. datapath detection (orchestrator.emulation.datapath), fabric model + description + wiring plan
   (orchestrator.emulation.wiring, orchestrator.emulation.hostconfig), all pure, then a
   preflight: none of the planned bridges and interfaces may exist yet
4. everything about to be created goes into the record, then: the description file in the
   run directory, the controller process (orchestrator.emulation.controller), GPU namespaces (one
   Mininet host shell each), all veth pairs in one ``ip -batch``, every GPU namespace
   configured (one ``sh`` each, all at once), OVS bridges with their ports in one
   ``ovs-vsctl`` transaction (after the GPUs' ports are up, so that each switch meets the
   controller with every port up), NVLink Linux bridges, then the shapers of the root
   namespace ends (one ``tc -batch``; after the bridges, as OVS deletes a root qdisc it
   finds on a port it adds)
5. readiness: the controller reports every switch programmed, then every GPU reaches every
   other one through every NIC port and its server-mates over NVLink
   (orchestrator.emulation.readiness)

Teardown (:meth:`Emulation.stop`, also on any error during bring-up, on SIGINT, SIGTERM and
SIGHUP) stops the controller, then runs
:func:`orchestrator.emulation.state.clean` on the record: the same code ``astral clean``
runs after a kill -9, so both paths remove exactly the same things. It never raises;
problems are logged and returned in the report.

Mininet is used as a container (``emu.net`` works with ``mininet.cli.CLI``), not as the
builder: its per-interface shell round trips and string commands are replaced by batches
(orchestrator.emulation.nodes explains the classes).
Mininet's ``Mininet.init()`` is skipped: it raises
host-wide limits and sysctls (``fixLimits``) that this run does not need and would leave
behind; the only limit raised is this process's open-file limit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import resource
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from mininet.net import Mininet

from orchestrator.emulation import batch, signals
from orchestrator.emulation.controller import ControllerProcess, free_port
from orchestrator.emulation.datapath import PROBE_BRIDGE, Datapath, detect_datapath
from orchestrator.emulation.executor import Completed, run_local
from orchestrator.emulation.hostconfig import HostConfig, render_all
from orchestrator.emulation.lock import RunLock
from orchestrator.emulation.nodes import FabricSwitch, GpuHost, NvlinkBridge, PrecreatedLink
from orchestrator.emulation.readiness import probe_plan, wait_reachable
from orchestrator.emulation.recipe import EmulatorRecipe, current_recipe
from orchestrator.emulation.sendbuffer import SendBuffer, raise_send_buffer, restore_send_buffer
from orchestrator.emulation.shaping import qdisc_list_command, unshaped
from orchestrator.emulation.share import Share
from orchestrator.emulation.state import (
    RUN_TAG,
    CleanReport,
    LinuxSystem,
    RunState,
    clean,
    prune_runs,
    unclean_runs,
    unreadable_record_warnings,
)
from orchestrator.emulation.wiring import Wiring, check_name, plan_wiring
from topologies.catalog import DEFAULT_FABRIC, resolve_fabric
from topologies.description import FabricDescription
from topologies.errors import AstralError, EmulationError
from topologies.fabricspec import FabricSpec
from topologies.generators import build_fabric
from topologies.spec import load_fabric_spec

DESCRIPTION_FILE = "fabric.json"
CONTROLLER_HOST = "127.0.0.1"
CONTROLLER_ATTEMPTS = 3
NOFILE_WANTED = 65536
# OVS drops a controller that has not answered an echo for this long (default 5 s). On a
# loaded 2-core machine a controller programming a hundred switches can be that busy; a
# reconnect then costs more than the wait.
INACTIVITY_PROBE_MS = 30_000


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind (tearing down on the way) and exit 128 + signum.

    A BaseException, not a KeyboardInterrupt: Mininet's CLI swallows KeyboardInterrupt
    (Ctrl-C interrupts the command running on a node), but SIGTERM must end the run.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


Log = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class Emulation:
    """One emulated fabric; a context manager (bring up on enter, tear down on exit).

    ``fabric``: a fabric file (YAML) or a preset's name, a :class:`FabricSpec` or a ready
    :class:`FabricDescription`; default the astral-small preset. After :meth:`start`:
    ``net`` (the Mininet object), ``hosts`` (GPU name -> Mininet host), ``description``
    (with ``extra`` holding datapath, controller and run directory), ``run_dir``,
    ``controller`` (orchestrator.emulation.controller.ControllerProcess), ``datapath``, ``timings``.
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
        telemetry_interval: float | None = None,
        lock_wait: float = 0.0,
        recipe: EmulatorRecipe | None = None,
        share: Share | None = None,
    ) -> None:
        self.fabric_source = fabric if fabric is not None else DEFAULT_FABRIC
        # This machine's part of a fabric spread over several (orchestrator.emulation.share);
        # None: the whole fabric, here.
        self.share = share
        # How links are shaped and how large the GPUs' packets are (docs/capacity.md), and
        # the same fitted to this fabric's rates once it is described (frames, segments).
        self.recipe = recipe or current_recipe()
        self.fitted_recipe: EmulatorRecipe | None = None
        # Seconds start() waits for another run's lock before ConcurrentRunError.
        self.lock_wait = lock_wait
        self.policy = policy
        # Seconds between the controller's counter polls into run_dir/telemetry.jsonl
        # (docs/telemetry.md); None: no telemetry file.
        self.telemetry_interval = telemetry_interval
        self.state_base = state_base
        self.ready_timeout = ready_timeout
        self.handle_signals = handle_signals
        self.log = log or _quiet
        self.lock = RunLock(state_base, purpose="run")
        self.state: RunState | None = None
        self.description: FabricDescription | None = None
        self.wiring: Wiring | None = None
        self.host_configs: dict[str, HostConfig] = {}
        self.datapath: Datapath | None = None
        #: ovs-vswitchd's send buffer as raised for this run (userspace datapath), or why not.
        self.send_buffer: SendBuffer | None = None
        self.send_buffer_problem: str | None = None
        self.controller: ControllerProcess | None = None
        self.net: Any = None
        self.hosts: dict[str, GpuHost] = {}
        self.timings: dict[str, float] = {}
        self.leftovers: list[CleanReport] = []
        self.teardown_report: CleanReport | None = None
        self._started = False
        self._stopped = False
        self._previous_handlers: dict[int, Any] = {}
        self._state_lock = threading.Lock()

    # -- context manager -----------------------------------------------------------------

    def __enter__(self) -> Emulation:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def run_dir(self) -> Path:
        if self.state is None:
            raise EmulationError("the emulation has not been started")
        return self.state.run_dir

    def host(self, name: str) -> GpuHost:
        try:
            return self.hosts[name]
        except KeyError:
            raise EmulationError(f"no GPU named {name!r} in this fabric") from None

    # -- bring-up ------------------------------------------------------------------------

    def start(self) -> Emulation:
        """Bring the fabric up and wait until it is ready; tear down again on any failure."""
        if self._started:
            raise EmulationError("an Emulation object can be started once")
        self._started = True
        began = time.monotonic()
        atexit.register(self.stop)  # a safety net for callers that never call stop()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - began
        return self

    @contextlib.contextmanager
    def _step(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        yield
        self.timings[name] = time.monotonic() - began

    def _start(self) -> None:
        with self._step("lock"):
            self.lock.acquire(wait=self.lock_wait, on_wait=self.log)
            self._install_signal_handlers()
            self._clean_leftovers()
            self.state = RunState.create(self.state_base)
        state = self.state
        with self._step("plan"):
            state.add_bridges([(PROBE_BRIDGE, "ovs")])
            self.datapath = detect_datapath(probe_tag={RUN_TAG: state.run_id})
            if self.datapath.kind == "userspace":
                self._raise_send_buffer()
            self.description = self._describe()
            fitted = self.fitted_recipe
            assert fitted is not None
            self.wiring = plan_wiring(self.description, fitted.shaping)
            for gpu in self.description.fabric.gpus:
                check_name(gpu)
            self.host_configs = render_all(self.description, fitted)
            self._plan_share()
            if self.share is not None:
                self.wiring = self.wiring.restricted(self.share.nodes, self.share.tunnels)
                self.host_configs = {
                    gpu: config
                    for gpu, config in self.host_configs.items()
                    if gpu in self.share.nodes
                }
            self._preflight(self.wiring)
            self._record_plan(self.wiring)
        with self._step("controller"):
            self._start_controller()
        with self._step("hosts"):
            self._create_nodes()
        with self._step("links"):
            self._create_links()
        # GPU namespaces before the switches: their ports are then up when each switch first
        # meets its controller, instead of coming up one by one (each a port-status event
        # the controller answers with a new plan).
        with self._step("configure"):
            self._configure_hosts()
        with self._step("switches"):
            self._create_bridges()
            # After the ports joined their bridges: Open vSwitch deletes a root qdisc it
            # finds on a port it adds.
            self._shape_root_ends()
        with self._step("programmed"):
            self._wait_programmed()
        with self._step("reachable"):
            self._wait_reachable()
        if self.datapath is not None and self.datapath.kind == "userspace" and not self.send_buffer:
            # ovs-vswitchd opens its sending socket at its first transmit: one just started
            # had none at the plan step, and the probes have sent through it since
            self._raise_send_buffer()
        self.check_shapers()
        state.set_status("up")

    def _plan_share(self) -> None:
        """Set :attr:`share` once the fabric is planned (a cluster run places it here:
        orchestrator.cluster.emulation); a single machine keeps the share it was given."""

    def _wait_programmed(self) -> None:
        """Every switch programmed by the controller (a cluster's part has none of its own:
        the machine that holds the controller waits for every part's switches)."""
        if self.controller is None:
            return
        assert self.wiring is not None
        dpids = [b.dpid for b in self.wiring.ovs_bridges()]
        self.controller.wait_programmed(dpids, timeout=self.ready_timeout)

    def _wait_reachable(self) -> None:
        """Every GPU reaches every other (a cluster's part probes when told to, once every
        machine's part is up: orchestrator.cluster)."""
        if self.share is not None and self.controller is None:
            return
        self.timings["reachable_rounds"] = self.probe(self.ready_timeout)

    def probe(self, timeout: float) -> int:
        """Probe from this machine's GPUs to every GPU of the fabric until all answer;
        the rounds it took (orchestrator.emulation.readiness)."""
        assert self.description is not None
        plan = {gpu: t for gpu, t in probe_plan(self.description).items() if gpu in self.hosts}
        return wait_reachable(plan, self.netns_paths(), timeout=timeout)

    def _describe(self) -> FabricDescription:
        source = self.fabric_source
        if isinstance(source, FabricDescription):
            description = FabricDescription(source.fabric, source.addresses, dict(source.extra))
        else:
            spec = (
                source
                if isinstance(source, FabricSpec)
                else load_fabric_spec(resolve_fabric(source))
            )
            description = FabricDescription.of(build_fabric(spec))
        assert self.datapath is not None and self.state is not None
        fitted = self.fitted_recipe = self.recipe.fitted(description)
        description.extra.update(
            {
                "run_id": self.state.run_id,
                "run_dir": str(self.state.run_dir),
                "datapath": self.datapath.kind,
                "userspace_tso": self.datapath.tso,
                "policy": self.policy,
                "recipe": self.recipe.name,
                "tcp_packet_segments": fitted.segments,
                "mtu": fitted.mtu,
                "tcp_payload_share": fitted.payload_share,
            }
        )
        return description

    def _raise_send_buffer(self) -> None:
        """Keep ovs-vswitchd from dropping packets unseen once our queues fill its socket's
        send buffer (orchestrator.emulation.sendbuffer). Not fatal: the run goes on, and says so."""
        try:
            self.send_buffer = raise_send_buffer()
            self.send_buffer_problem = None
        except OSError as exc:
            self.send_buffer_problem = (
                f"could not raise ovs-vswitchd's send buffer ({exc}); with several congested "
                "links it may drop packets without counting them (docs/fidelity.md)"
            )

    def _preflight(self, wiring: Wiring) -> None:
        """Refuse to start over bridges or interfaces that exist already: not ours to touch."""
        system = LinuxSystem()
        links = system.links()
        ovs = system.ovs_bridges()
        clashes = [b.name for b in wiring.bridges if b.name in links or b.name in ovs]
        clashes += [name for name in wiring.root_interfaces() if name in links]
        if clashes:
            shown = ", ".join(clashes[:8]) + (" ..." if len(clashes) > 8 else "")
            raise EmulationError(
                f"{len(clashes)} bridges/interfaces this fabric needs exist already ({shown}); "
                "they are not in any astral run record, so astral leaves them alone: remove "
                "them (or the tool that made them) first"
            )

    def _link_group(self) -> int:
        assert self.state is not None and self.state.link_group is not None
        return self.state.link_group

    def _record_plan(self, wiring: Wiring) -> None:
        assert self.state is not None
        # A device group of our own (ip-link(8) "group"): teardown deletes its members in
        # one kernel operation, after checking it holds nothing that is not recorded.
        self.state.link_group = random.randrange(1 << 24, 1 << 31)
        self.state.add_bridges((b.name, b.kind) for b in wiring.bridges)
        self.state.add_interfaces(wiring.root_interfaces())
        self.state.add_qdiscs(s.intf for s in wiring.shapers)
        self.state.add_hosts({gpu: list(cfg.interfaces) for gpu, cfg in self.host_configs.items()})

    # -- controller ----------------------------------------------------------------------

    def _controller_target(self) -> str:
        if self.controller is not None:
            return self.controller.target
        assert self.share is not None
        host, port = self.share.controller
        return f"tcp:{host}:{port}"

    def _start_controller(self) -> None:
        assert self.state is not None and self.description is not None
        if self.share is not None:  # the cluster's controller runs on another machine
            host, port = self.share.controller
            self.description.extra["controller"] = {"host": host, "port": port}
            self.description.write(self.state.run_dir / DESCRIPTION_FILE)
            return
        self._spawn_controller(CONTROLLER_HOST)

    def _spawn_controller(self, listen: str, port: int | None = None) -> None:
        """The controller, listening on ``listen`` (127.0.0.1 unless a cluster's switches on
        other machines must reach it) at ``port`` (default: a free one, retried if taken)."""
        assert self.state is not None and self.description is not None
        state = self.state

        def record(process: ControllerProcess) -> None:
            if process.pid is not None:
                state.add_process(
                    "controller", process.pid, "controller", group=True, starttime=process.starttime
                )

        last: AstralError | None = None
        fixed = port
        for _ in range(CONTROLLER_ATTEMPTS if fixed is None else 1):
            chosen = fixed or free_port(listen)
            self.description.extra["controller"] = {"host": listen, "port": chosen}
            path = self.description.write(state.run_dir / DESCRIPTION_FILE)
            controller = ControllerProcess(
                path,
                state.run_dir,
                policy=self.policy,
                host=listen,
                port=chosen,
                on_start=record,
                telemetry_interval=self.telemetry_interval,
            )
            try:
                self.controller = controller.start()
                return
            except EmulationError as err:  # the port was taken in between: try another
                controller.stop()
                last = err
        assert last is not None
        raise last

    # -- nodes and links -----------------------------------------------------------------

    def _create_nodes(self) -> None:
        assert self.state is not None and self.description is not None
        assert self.wiring is not None and self.datapath is not None
        state = self.state
        _raise_nofile_limit()
        Mininet.inited = True  # skip Mininet.init(): see the module docstring
        self.net = Mininet(
            topo=None, build=False, controller=None, host=GpuHost, link=PrecreatedLink
        )
        self.net.built = True  # nothing for Mininet to build: the CLI must not try

        def on_shell(name: str, pid: int) -> None:
            with self._state_lock:
                state.add_process(f"{name}-shell", pid, "switch")

        for gpu in self.description.fabric.gpus_by_rank():
            if self.share is not None and gpu.name not in self.share.nodes:
                continue
            host = self.net.addHost(gpu.name, cls=GpuHost, ip=None)
            self.hosts[gpu.name] = host
            state.set_host_process(gpu.name, host.pid, _netns_inode(host.pid), save=False)
        state.save()
        for bridge in self.wiring.bridges:
            if bridge.kind == "ovs":
                self.net.addSwitch(
                    bridge.name,
                    cls=FabricSwitch,
                    dpid=bridge.dpid_hex,
                    datapath=self.datapath.mininet,
                    on_shell=on_shell,
                )
            else:
                self.net.addSwitch(
                    bridge.name, cls=NvlinkBridge, dpid=bridge.dpid_hex, on_shell=on_shell
                )

    def _create_links(self) -> None:
        """All veth pairs in one ``ip -batch``; root ends get IPv6 off and come up."""
        assert self.wiring is not None and self.description is not None
        commands = []
        group = str(self._link_group())
        assert self.fitted_recipe is not None
        mtu = str(self.fitted_recipe.mtu)
        for veth in self.wiring.veths:
            argv = ["ip", "link", "add", "name", veth.a_intf, "group", group, "mtu", mtu]
            argv += ["type", "veth", "peer", "name", veth.b_intf, "mtu", mtu]
            if veth.b_mac:
                argv += ["address", veth.b_mac]
            if veth.b_host:
                argv += ["netns", str(self.hosts[veth.b_host].pid)]
            else:
                argv += ["group", group]
            commands.append(argv)
        for tunnel in self.wiring.tunnels:
            commands.append(tunnel.create_command(group, int(mtu)))
            if tunnel.host is not None:
                pid = str(self.hosts[tunnel.host].pid)
                commands.append(["ip", "link", "set", "dev", tunnel.intf, "netns", pid])
        batch.run_steps(commands, "creating veth pairs and tunnels")
        root = self.wiring.root_interfaces()
        _disable_ipv6(root)
        batch.run_steps(
            [["ip", "link", "set", "dev", name, "up"] for name in root], "bringing links up"
        )
        for veth in self.wiring.veths:
            params2: dict[str, Any] = {}
            if veth.b_host:
                addresses = self.description.addresses[veth.b_host]
                port = next(p for p in (addresses.nvlink, *addresses.nics) if p.intf == veth.b_intf)
                params2 = {"ip": port.ip, "prefixlen": port.prefixlen}
            self.net.addLink(
                veth.a_node,
                veth.b_node,
                port1=veth.a_port,
                port2=veth.b_port,
                intfName1=veth.a_intf,
                intfName2=veth.b_intf,
                addr1=None,
                addr2=veth.b_mac,
                params2=params2,
            )

    def _create_bridges(self) -> None:
        """OVS bridges in one transaction (ports numbered as the model), then Linux bridges."""
        assert self.wiring is not None and self.state is not None
        assert self.datapath is not None
        wiring = self.wiring
        ovs = wiring.ovs_bridges()
        if ovs:
            argv = ["ovs-vsctl", "--timeout=60"]
            for bridge in ovs:
                controller_id = f"@c{bridge.dpid}"
                argv += [
                    "--", f"--id={controller_id}", "create", "Controller",
                    f"target=\"{self._controller_target()}\"", "max_backoff=1000",
                    f"inactivity_probe={INACTIVITY_PROBE_MS}",
                    "--", "add-br", bridge.name,
                    "--", "set", "Bridge", bridge.name,
                    f"datapath_type={self.datapath.ovs_type}",
                    "fail_mode=secure",
                    "protocols=OpenFlow13,OpenFlow15",  # 1.5: OVS selection_method
                    f"other_config:datapath-id={bridge.dpid_hex}",
                    "other_config:disable-in-band=true",
                    f"other_config:dp-desc={bridge.name}",
                    f"external_ids:{RUN_TAG}={self.state.run_id}",
                    f"controller={controller_id}",
                ]  # fmt: skip
                for port, intf in wiring.bridge_ports(bridge.name):
                    argv += [
                        "--", "add-port", bridge.name, intf,
                        "--", "set", "Interface", intf, f"ofport_request={port}",
                    ]  # fmt: skip
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            if result.returncode != 0 or "Error detected" in result.stderr:
                raise EmulationError(
                    f"creating {len(ovs)} Open vSwitch bridges failed: "
                    f"{batch.errors_of(result.stderr)}"
                )
            self._check_ofports()
        group = str(self._link_group())
        commands: list[list[str]] = []
        if self.datapath.kind == "userspace":
            # The tap device ovs-vswitchd made for each bridge joins our device group, so
            # that teardown deletes it with the rest in one operation (the kernel
            # datapath's internal ports stay ovs-vswitchd's business).
            commands += [["ip", "link", "set", "dev", b.name, "group", group] for b in ovs]
        for bridge in wiring.linux_bridges():
            commands.append(
                ["ip", "link", "add", "name", bridge.name, "group", group, "type", "bridge"]
            )
        batch.run_steps(commands, "creating NVLink bridges")
        _disable_ipv6([b.name for b in wiring.linux_bridges()])
        commands = []
        for bridge in wiring.linux_bridges():
            for _, intf in wiring.bridge_ports(bridge.name):
                commands.append(["ip", "link", "set", "dev", intf, "master", bridge.name])
            commands.append(["ip", "link", "set", "dev", bridge.name, "up"])
        batch.run_steps(commands, "wiring NVLink bridges")

    def _check_ofports(self) -> None:
        """OpenFlow port numbers must be the model's: the controller programs by them."""
        assert self.wiring is not None
        result = subprocess.run(
            ["ovs-vsctl", "--format=json", "--columns=name,ofport", "list", "Interface"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        actual = {row[0]: row[1] for row in json.loads(result.stdout or '{"data": []}')["data"]}
        wrong = []
        for bridge in self.wiring.ovs_bridges():
            for port, intf in self.wiring.bridge_ports(bridge.name):
                if actual.get(intf) != port:
                    wrong.append(f"{intf}: {actual.get(intf)} instead of {port}")
        if wrong:
            raise EmulationError(
                "Open vSwitch did not give the ports their model numbers: " + "; ".join(wrong[:8])
            )

    # -- configuration -------------------------------------------------------------------

    def _shape_root_ends(self) -> None:
        assert self.wiring is not None
        commands = [argv for shaper in self.wiring.shapers for argv in shaper.commands()]
        batch.run_steps(commands, "shaping switch ports")

    def check_shapers(self) -> None:
        """Every switch-side shaper is still in place once the fabric is up (Open vSwitch
        deletes a root qdisc on a port it (re)adds, silently): a fabric that would run
        unshaped links is an error, not a measurement."""
        assert self.wiring is not None
        result = subprocess.run(
            qdisc_list_command(), capture_output=True, text=True, check=False, timeout=60
        )
        try:
            qdiscs = json.loads(result.stdout or "[]")
        except json.JSONDecodeError as exc:
            raise EmulationError(f"cannot read `tc -j qdisc show`: {exc}") from exc
        missing = unshaped(qdiscs, [s.intf for s in self.wiring.shapers], self.recipe.shaping)
        if missing:
            raise EmulationError(
                f"{len(missing)} switch ports lost their shaper after bring-up "
                f"({', '.join(missing[:6])}{', ...' if len(missing) > 6 else ''}): "
                "did Open vSwitch restart or re-add them?"
            )

    def _configure_hosts(self) -> None:
        """Every GPU namespace at once: one ``sh`` per GPU running batched ip/tc."""
        processes = {}
        for gpu, config in self.host_configs.items():
            processes[gpu] = self.hosts[gpu].popen(
                ["sh", "-c", batch.script(config.commands())],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
        failures = []
        for gpu, process in processes.items():
            _, err = process.communicate()
            if process.returncode != 0:
                failures.append(f"{gpu}: {batch.errors_of(err.decode(errors='replace'))}")
        if failures:
            raise EmulationError(
                f"configuring {len(failures)} GPU namespaces failed: " + " | ".join(failures[:6])
            )

    def netns_paths(self) -> dict[str, str]:
        """GPU -> its network namespace (``/proc/<shell pid>/ns/net``), for setns(2) or
        ``nsenter --net=PATH``; valid while the emulation is up."""
        return {name: f"/proc/{host.pid}/ns/net" for name, host in self.hosts.items()}

    # -- running things in GPUs ----------------------------------------------------------

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``gpu``'s namespace, recorded so that teardown stops it."""
        if self.state is None:
            raise EmulationError("the emulation has not been started")
        process: subprocess.Popen[bytes] = self.host(gpu).popen(list(argv), **kwargs)
        with self._state_lock:
            self.state.add_process(f"{gpu}:{argv[0]}", process.pid, "worker")
        return process

    def run(
        self,
        node: str | None,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 30.0,
    ) -> Completed:
        """Run ``argv`` to completion in ``node``'s namespace: a GPU's own, or the root
        namespace for a switch or ``None`` (the executor protocol,
        orchestrator.emulation.executor)."""
        gpus = self.description.fabric.gpus if self.description is not None else {}
        if node is None or node not in gpus:
            return run_local(argv, input=input, timeout=timeout)
        process = self.popen(
            node,
            list(argv),
            stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = process.communicate(
                None if input is None else input.encode(), timeout=timeout
            )
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise EmulationError(
                f"{' '.join(argv)} in {node} did not end in {timeout:g} s"
            ) from None
        return Completed(
            tuple(argv),
            process.returncode,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
        )

    def cmd(self, gpu: str, argv: list[str]) -> str:
        """Run ``argv`` in ``gpu``'s shell and return its output (Mininet's ``cmd``)."""
        return str(self.host(gpu).cmd(shlex.join(argv)))

    def cli(self) -> None:
        """Mininet's interactive CLI on this fabric (returns when the user exits it)."""
        from mininet.cli import CLI

        CLI(self.net)

    # -- teardown ------------------------------------------------------------------------

    def stop(self) -> CleanReport:
        """Tear everything down; idempotent, never raises (errors are logged and reported)."""
        if self._stopped:
            return self.teardown_report or CleanReport()
        self._stopped = True
        began = time.monotonic()
        report = CleanReport()
        with self._signals_deferred():
            if self.controller is not None:
                try:
                    self.controller.stop()
                except Exception as err:
                    report.errors.append(f"stopping the controller: {err}")
            if self.state is not None:
                try:
                    report.merge(clean(self.state))
                except Exception as err:
                    report.errors.append(f"cleaning the run record: {err}")
            for node in self._mininet_nodes():
                with contextlib.suppress(Exception):
                    node.cleanup()  # close its pty and reap its shell (killed by clean)
            if self.state is not None:
                with contextlib.suppress(Exception):
                    prune_runs(self.state_base)
            if self.send_buffer is not None:
                try:
                    restore_send_buffer(self.send_buffer)
                except OSError as err:
                    report.errors.append(f"restoring ovs-vswitchd's send buffer: {err}")
            self.lock.release()
        self._restore_signal_handlers()
        atexit.unregister(self.stop)
        self.timings["teardown"] = time.monotonic() - began
        for line in report.errors:
            self.log(f"teardown: {line}")
        self.teardown_report = report
        return report

    def _mininet_nodes(self) -> list[Any]:
        if self.net is None:
            return list(self.hosts.values())
        return list(self.net.hosts) + list(self.net.switches)

    def _clean_leftovers(self) -> None:
        for line in unreadable_record_warnings(self.state_base):
            self.log(line)
        for leftover in unclean_runs(self.state_base):
            report = clean(leftover)
            self.leftovers.append(report)
            for line in report.lines():
                self.log(f"cleaned up after run {leftover.run_id}: {line}")

    # -- signals -------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return

        def terminate(signum: int, frame: FrameType | None) -> None:
            signals.note(signum)
            raise Terminated(signum)

        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._previous_handlers[signum] = signal.signal(signum, terminate)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler)
        self._previous_handlers.clear()

    @contextlib.contextmanager
    def _signals_deferred(self) -> Iterator[None]:
        """Teardown must finish: a second Ctrl-C or SIGTERM is noted, not obeyed."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def note(signum: int, frame: FrameType | None) -> None:
            signals.note(signum)
            self.log(f"{signal.Signals(signum).name} ignored: tearing down, please wait")

        saved = {}
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):
                saved[signum] = signal.signal(signum, note)
        try:
            yield
        finally:
            for signum, handler in saved.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(signum, handler)


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _disable_ipv6(names: list[str]) -> None:
    """No IPv6 on root-namespace ends: no DAD, RS or MLD packets reach the switches."""
    for name in names:
        with contextlib.suppress(OSError):
            Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")


def _raise_nofile_limit() -> None:
    """Mininet keeps two descriptors per node and each probe three: raise our own limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, NOFILE_WANTED) if hard != resource.RLIM_INFINITY else NOFILE_WANTED
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
