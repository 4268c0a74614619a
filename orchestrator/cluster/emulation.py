"""One fabric over several machines: the machine that holds the run, and its parts there.

::

    machines = cluster_machines(["localhost", "lab2"], inventory)
    with ClusterEmulation("astral-small", machines=machines) as emu:
        emu.popen("p0s1g0", argv)       # a worker on lab2, over SSH, in its GPU's namespace
        emu.placement.lines()           # who holds what, and the links cut between machines

The fabric is placed (orchestrator.cluster.placement), then built in parts at once: this
machine's part in this process, each other machine's by ``python -m
orchestrator.commands.cluster_part`` there over SSH (orchestrator.cluster.ssh), each an ordinary
:class:`~orchestrator.emulation.network.Emulation` of its share (its own run record, lock
and teardown there). A link cut between two machines is a VXLAN tunnel, one end on each,
named and shaped as the veth end it replaces (orchestrator.emulation.wiring.Tunnel). One
controller, here, bound to this machine's address towards the others, programs every
switch of every machine; readiness is then the single-machine rule: the controller has
programmed every switch, and every GPU (each part probing from its own) reaches every
other one through every NIC port.

A worker for a GPU on another machine is an SSH session running
:mod:`orchestrator.cluster.attach` there, which enters that GPU's namespace; its control
socket (the launcher's Unix socket here) is forwarded to a path there by the same session.
Stopping the session stops it; so does this process's death (its stdin closes).

Clocks: each part answers ``clock`` a few times at bring-up; the offset of its clock from
this one (its time minus the midpoint of the exchange, from the exchange with the
shortest round trip) is kept in the description's ``extra["cluster"]`` so that timelines
recorded on different machines can be set side by side.
"""

from __future__ import annotations

import ipaddress
import json
import queue
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from orchestrator.cluster.nodes import attached_host
from orchestrator.cluster.placement import Placement, place
from orchestrator.cluster.ssh import LOCAL, SshMachine
from orchestrator.cluster.trace import ClusterControl
from orchestrator.cluster.tunnelprobe import (
    PROBE_DEVICE,
    PROBE_NETWORK,
    TunnelProbe,
    device_commands,
    iperf3_rate,
    run_all,
)
from orchestrator.emulation.controller import free_port
from orchestrator.emulation.executor import Completed, run_local
from orchestrator.emulation.network import DESCRIPTION_FILE, Emulation
from orchestrator.emulation.pathtrace import (
    AppctlControl,
    Control,
    TraceError,
    VswitchdControl,
    open_control,
)
from orchestrator.emulation.share import Share
from orchestrator.emulation.wiring import Tunnel, Veth
from orchestrator.remote.inventory import Inventory, inventory_path, load_inventory
from topologies.errors import ConfigError, EmulationError

VXLAN_PORT = 4789
CLOCK_EXCHANGES = 5
PART_STOP_S = 120.0


@dataclass(frozen=True)
class ClusterMachine:
    """A machine of a cluster run: ``ssh`` None for this one."""

    name: str
    address: str  # its underlay address, which the other machines reach it at
    ssh: SshMachine | None


def cluster_machines(names: Sequence[str], inventory: Inventory) -> list[ClusterMachine]:
    """The machines of ``names`` (inventory names, or ``localhost`` for this one), with
    their underlay addresses; this machine's is the source address of its route to the
    first other one, which is where the controller listens."""
    if len(set(names)) != len(names):
        raise ConfigError(None, "cluster", "each machine once", ", ".join(names))
    remote = [SshMachine.of(inventory.machine(n)) for n in names if n != LOCAL]
    machines = []
    for name in names:
        if name == LOCAL:
            toward = resolve(remote[0].host) if remote else "127.0.0.1"
            machines.append(ClusterMachine(LOCAL, source_address(toward), None))
        else:
            ssh = next(r for r in remote if r.name == name)
            machines.append(ClusterMachine(name, resolve(ssh.host), ssh))
    return machines


def cluster_of(names: Sequence[str], inventory: Path | None = None) -> list[ClusterMachine]:
    """:func:`cluster_machines` of the inventory ``--inventory``/``$ASTRAL_INVENTORY``/
    ``machines.yaml`` names (orchestrator.remote.inventory); ``localhost`` needs none."""
    if all(name == LOCAL for name in names):
        return cluster_machines(names, Inventory(Path("<none>"), {}))
    return cluster_machines(names, load_inventory(inventory_path(inventory)))


def resolve(host: str) -> str:
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        try:
            return socket.gethostbyname(host)
        except OSError as err:
            raise EmulationError(f"cluster: cannot resolve {host!r}: {err}") from None


def source_address(destination: str) -> str:
    """The address this machine sends from towards ``destination`` (``ip route get``)."""
    result = subprocess.run(
        ["ip", "-o", "route", "get", destination], capture_output=True, text=True, check=False
    )
    words = result.stdout.split()
    if result.returncode != 0 or "src" not in words:
        raise EmulationError(f"cluster: no route from this machine to {destination}")
    return words[words.index("src") + 1]


def tunnels_of(
    placement: Placement,
    veths: Sequence[Veth],
    addresses: dict[str, str],
    vni_base: int,
    udp_port: int = VXLAN_PORT,
) -> dict[str, list[Tunnel]]:
    """Per machine, its ends of the links ``placement`` cuts: one VNI per link."""
    ends: dict[str, list[Tunnel]] = {m: [] for m in placement.machines}
    cut = [v for v in veths if placement.machine_of(v.a_node) != placement.machine_of(v.b_node)]
    for index, veth in enumerate(cut):
        a_machine, b_machine = placement.machine_of(veth.a_node), placement.machine_of(veth.b_node)
        vni, rate = vni_base + index, veth.rate_bps
        ends[a_machine].append(
            Tunnel(
                node=veth.a_node, port=veth.a_port, intf=veth.a_intf, host=None, mac=None,
                local=addresses[a_machine], remote=addresses[b_machine], vni=vni,
                udp_port=udp_port, rate_bps=rate,
            )
        )  # fmt: skip
        ends[b_machine].append(
            Tunnel(
                node=veth.b_node, port=veth.b_port, intf=veth.b_intf, host=veth.b_host,
                mac=veth.b_mac, local=addresses[b_machine], remote=addresses[a_machine],
                vni=vni, udp_port=udp_port, rate_bps=rate,
            )
        )  # fmt: skip
    return ends


@dataclass(frozen=True)
class MachineLoad:
    """One machine's part of an experiment's load, and what its calibration says it
    carries (``safe_bps`` None: not calibrated)."""

    machine: str
    hop_bps: float
    tunnel_bps: float
    safe_bps: float | None

    @property
    def share(self) -> float | None:
        return self.hop_bps / self.safe_bps if self.safe_bps else None

    def line(self) -> str:
        tunnels = f", tunnels {self.tunnel_bps / 1e6:.0f} Mbit/s"
        if self.safe_bps is None:
            return (
                f"{self.machine}: offered {self.hop_bps / 1e6:.0f} hop-Mbit/s{tunnels}; "
                "not calibrated there (astral calibrate --on it)"
            )
        verdict = "within" if self.hop_bps <= self.safe_bps else "ABOVE"
        return (
            f"{self.machine}: offered {self.hop_bps / 1e6:.0f} hop-Mbit/s{tunnels} = "
            f"{self.share:.0%} of its safe share ({self.safe_bps / 1e6:.0f}): {verdict} it"
        )


class RemotePart:
    """A machine's part of the fabric, run there over one SSH session
    (orchestrator.commands.cluster_part)."""

    def __init__(self, machine: ClusterMachine, log_path: Path) -> None:
        assert machine.ssh is not None
        self.machine = machine
        self.ssh = machine.ssh
        self.log_path = log_path
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.process: subprocess.Popen[str] | None = None
        self.up: dict[str, Any] = {}

    def start(self, order: dict[str, Any]) -> None:
        remote = ["env", "-C", str(self.ssh.project), self.ssh.python]
        remote += ["-m", "orchestrator.commands.cluster_part"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.ssh.argv(remote),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,  # a Ctrl-C here reaches the part as a session's end
            )
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        self.send(order)

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                continue
        self.events.put({"event": "gone"})

    def send(self, command: dict[str, Any]) -> None:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the part is gone: expect() says so

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                got = self.events.get(timeout=max(0.0, left))
            except queue.Empty:
                raise EmulationError(
                    f"{self.machine.name}: no '{event}' from its part in {timeout:g} s "
                    f"(its log: {self.log_path})"
                ) from None
            if got.get("event") == event:
                return got
            if got.get("event") == "error":
                raise EmulationError(f"{self.machine.name}: {got.get('message')}")
            if got.get("event") == "gone":
                raise EmulationError(
                    f"{self.machine.name}: its part ended (its log: {self.log_path}):\n"
                    + _tail(self.log_path)
                )

    def stop(self, timeout: float = PART_STOP_S) -> tuple[list[str], list[str]]:
        """Ask the part to tear down; what its teardown reported, and its errors (or why
        it did not report)."""
        if self.process is None:
            return [], []
        lines: list[str] = []
        errors: list[str] = []
        if self.process.poll() is None:
            self.send({"cmd": "stop"})
            try:
                down = self.expect("down", timeout)
                lines = [f"{self.machine.name}: {line}" for line in down.get("report", [])]
                errors = [f"{self.machine.name}: {e}" for e in down.get("errors", [])]
            except EmulationError as err:
                errors = [str(err)]
        with_stdin = self.process.stdin
        if with_stdin is not None:
            with_stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return lines, errors


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ClusterEmulation(Emulation):
    """An :class:`Emulation` whose fabric is spread over ``machines`` (see the module
    docstring); the same surface: ``popen``/``run`` reach GPUs on any machine."""

    def __init__(self, fabric: Any = None, *, machines: Sequence[ClusterMachine], **kwargs: Any):
        super().__init__(fabric, **kwargs)
        if not machines:
            raise EmulationError("cluster: no machines")
        self.machines = {m.name: m for m in machines}
        self.placement: Placement | None = None
        self.parts: dict[str, RemotePart] = {}
        self.shells: dict[str, tuple[str, int, int]] = {}  # GPU -> (machine, pid, starttime)
        self.clock_offsets: dict[str, float] = {}
        self._controller_port = 0
        self._forwards: dict[str, subprocess.Popen[bytes]] = {}
        # machine -> the worker sockets sshd made there for our -R forwards: sshd leaves
        # the file behind when the session ends, so the teardown removes it
        self._socket_files: dict[str, list[str]] = {}
        self.tunnel_probes: dict[str, TunnelProbe] = {}
        self.part_reports: list[str] = []  # what each other machine's teardown removed
        self._cpu_since: dict[str, float] = {}
        self._cpu_kept: dict[str, list[dict[str, Any]]] = {}
        self._orders: dict[str, dict[str, Any]] = {}

    # -- bring-up ------------------------------------------------------------------------

    def _plan_share(self) -> None:
        assert self.description is not None and self.wiring is not None
        placement = place(self.description, list(self.machines))
        self.placement = placement
        addresses = {name: m.address for name, m in self.machines.items()}
        controller = self.machines.get(LOCAL)
        listen = (
            controller.address if controller else source_address(next(iter(addresses.values())))
        )
        self._controller_port = free_port(listen)
        vni_base = random.randrange(1 << 20, 1 << 23)
        ends = tunnels_of(placement, self.wiring.veths, addresses, vni_base)
        shares = {
            name: Share(
                machine=name,
                nodes=frozenset(placement.share(name).gpus + placement.share(name).switches),
                tunnels=tuple(ends[name]),
                controller=(listen, self._controller_port),
            )
            for name in self.machines
        }
        self.share = shares.get(LOCAL) or Share(
            LOCAL, frozenset(), (), (listen, self._controller_port)
        )
        self.description.extra["cluster"] = {
            "machines": {n: {"address": m.address} for n, m in self.machines.items()},
            "placement": placement.to_dict(),
            "tunnels": len(placement.cut_links()),
            "vxlan": {"port": VXLAN_PORT, "vni_base": vni_base},
        }
        for name, share in shares.items():
            if name != LOCAL:
                self._orders[name] = {"share": share.to_dict()}

    def _start_controller(self) -> None:
        assert self.state is not None and self.description is not None and self.share is not None
        listen, port = self.share.controller
        self._spawn_controller(listen, port=port)
        # the other machines build their parts while this one builds its own
        description = self.description.to_dict()
        for name, order in self._orders.items():
            machine = self.machines[name]
            part = RemotePart(machine, self.state.run_dir / f"part-{name}.log")
            self.parts[name] = part
            part.start(
                {
                    **order,
                    "description": description,
                    "policy": self.policy,
                    "ready_timeout": self.ready_timeout,
                    "lock_wait": self.lock_wait,
                }
            )
            if part.process is not None:
                self.state.add_process(f"part-{name}", part.process.pid, "worker")
            self._start_master(name)

    def _start_master(self, name: str) -> None:
        """A master SSH connection to ``name`` for the commands run there to completion
        (faults, pinning's route queries: orchestrator.cluster.ssh); without one they
        log in each time, which still works."""
        assert self.state is not None
        machine = self.machines[name]
        assert machine.ssh is not None
        control = self.state.run_dir / f"ssh-{name}.ctl"
        master = subprocess.Popen(
            machine.ssh.master_argv(control),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._forwards[f"master-{name}"] = master
        with self._state_lock:
            self.state.add_process(f"ssh-master-{name}", master.pid, "worker")
        self.machines[name] = replace(machine, ssh=replace(machine.ssh, control=control))

    def _wait_programmed(self) -> None:
        assert self.controller is not None and self.description is not None
        for name, part in self.parts.items():
            up = part.expect("up", self.ready_timeout * 2)
            part.up = up
            for gpu, (pid, starttime) in up["shells"].items():
                self.shells[gpu] = (name, int(pid), int(starttime))
            self.clock_offsets[name] = self._clock_offset(part)
        cluster = self.description.extra["cluster"]
        for name, part in self.parts.items():
            ssh = part.ssh
            cluster["machines"][name].update(
                {
                    "inventory": str(ssh.machine.source),
                    "shells": part.up["shells"],
                    "run_id": part.up.get("run_id"),
                    "datapath": part.up.get("datapath"),
                    "clock_offset_s": round(self.clock_offsets[name], 6),
                    "timings": part.up.get("timings"),
                    "calibration": part.up.get("calibration"),
                    "doctor": part.up.get("doctor"),
                }
            )
        local = cluster["machines"].get(LOCAL)
        if local is not None:
            local["datapath"] = self.datapath.describe() if self.datapath else None
        self._probe_tunnels()
        # the record the bundle keeps: who held what, with the clocks' offsets
        assert self.state is not None
        self.description.write(self.state.run_dir / DESCRIPTION_FILE)
        dpids = [
            s.dpid for s in self.description.fabric.switches.values() if s.tier.value != "nvlink"
        ]
        self.controller.wait_programmed(dpids, timeout=self.ready_timeout)

    def doctor_lines(self) -> list[str]:
        """What ``astral doctor``'s checks said on each other machine of its share (a FAIL
        stops that machine's part before it builds anything)."""
        lines = []
        for name, part in self.parts.items():
            results = part.up.get("doctor") or []
            warnings = [r for r in results if not r.startswith("OK ")]
            lines.append(f"doctor {name}: {len(results) - len(warnings)} of {len(results)} OK")
            lines += [f"doctor {name}: {r}" for r in warnings]
        return lines

    def machine_loads(
        self, offered_hop_bps: float, local_safe_bps: float | None = None
    ) -> list[MachineLoad]:
        """An experiment's offered switch-hop load (orchestrator.calibration.capacity) as
        each machine carries it: in proportion to its switches' share of the fabric's
        switch hop load, with its tunnels' rate beside it; against that machine's own
        calibration (this machine's: ``local_safe_bps``)."""
        assert self.placement is not None and self.description is not None
        shares = self.placement.shares()
        switching = sum(s.hop_load_bps - s.tunnel_bps for s in shares) or 1.0
        machines = self.description.extra.get("cluster", {}).get("machines", {})
        loads = []
        for share in shares:
            part = (share.hop_load_bps - share.tunnel_bps) / switching
            calibration = machines.get(share.machine, {}).get("calibration") or {}
            safe = local_safe_bps if share.machine == LOCAL else calibration.get("safe_bps")
            loads.append(MachineLoad(share.machine, offered_hop_bps * part, share.tunnel_bps, safe))
        return loads

    def _probe_tunnels(self) -> None:
        """One probe per machine this one shares cut links with (orchestrator.cluster
        .tunnelprobe); the figures go into the record, a pair short of capacity into the
        log. Pairs of two other machines are not probed (docs/cluster.md)."""
        assert self.placement is not None and self.state is not None
        assert self.description is not None and self.state.link_group is not None
        cluster = self.description.extra["cluster"]
        vni = cluster["vxlan"]["vni_base"] - 1
        local = self.machines.get(LOCAL)
        if local is None:
            return
        for name, part in self.parts.items():
            cut = [
                link
                for link in self.placement.cut_links()
                if {self.machine_of(link.a), self.machine_of(link.b)} == {LOCAL, name}
            ]
            load = 2 * sum(self.description.emulated_rate(link) for link in cut)
            probe = self._probe_tunnel(part, local.address, vni, load)
            self.tunnel_probes[name] = probe
            cluster["machines"][name]["tunnel"] = probe.to_dict()
            if not probe.enough:
                self.log(probe.line())

    def _probe_tunnel(self, part: RemotePart, here: str, vni: int, load: float) -> TunnelProbe:
        assert self.state is not None and self.state.link_group is not None
        there = part.machine.address
        part.send(
            {
                "cmd": "tunnel-probe", "vni": vni, "local": there, "remote": here,
                "address": PROBE_NETWORK.format(2), "udp_port": VXLAN_PORT,
            }
        )  # fmt: skip
        self.state.add_interfaces([PROBE_DEVICE])
        commands = device_commands(
            self.state.link_group, vni, here, there, PROBE_NETWORK.format(1), VXLAN_PORT
        )
        measured, problem = None, ""
        try:
            part.expect("tunnel-probe-ready", 30)
            failed = run_all(commands)
            if failed is not None:
                problem = f"the probe's device here: {failed.stderr.strip()}"
            else:
                server = PROBE_NETWORK.format(2).split("/")[0]
                measured = iperf3_rate(server, PROBE_NETWORK.format(1).split("/")[0])
        except (EmulationError, OSError) as err:
            problem = str(err)
        finally:
            run_local(["ip", "link", "del", "dev", PROBE_DEVICE])
            part.send({"cmd": "tunnel-probe-done"})
        part.expect("tunnel-probe-done", 30)
        return TunnelProbe(part.machine.name, measured, load, problem)

    def cpu_samples(self, machine: str) -> list[dict[str, Any]]:
        """The CPU samples ``machine``'s part took since its last answer, on this
        machine's clock (orchestrator.testbed.cpuload's fields): the saturation flag of
        each machine's share is judged from its own."""
        part = self.parts[machine]
        offset = self.clock_offsets.get(machine, 0.0)
        since = self._cpu_since.get(machine, 0.0)
        part.send({"cmd": "cpu", "since": since + offset})
        samples = part.expect("cpu", 30.0)["samples"]
        if samples:
            self._cpu_since[machine] = float(samples[-1]["t"]) - offset
        self._cpu_kept.setdefault(machine, []).extend(
            {**x, "t": float(x["t"]) - offset} for x in samples if float(x["t"]) - offset > since
        )
        return list(self._cpu_kept[machine])

    def _clock_offset(self, part: RemotePart) -> float:
        best = (float("inf"), 0.0)
        for _ in range(CLOCK_EXCHANGES):
            sent = time.time()
            part.send({"cmd": "clock"})
            there = float(part.expect("clock", 30.0)["time"])
            back = time.time()
            best = min(best, (back - sent, there - (sent + back) / 2))
        return best[1]

    def _wait_reachable(self) -> None:
        for part in self.parts.values():
            part.send({"cmd": "probe", "timeout": self.ready_timeout})
        rounds = [self.probe(self.ready_timeout)] if self.hosts else []
        for part in self.parts.values():
            rounds.append(int(part.expect("probed", self.ready_timeout + 30)["rounds"]))
        self.timings["reachable_rounds"] = max(rounds, default=0)

    # -- running things on GPUs ----------------------------------------------------------

    def machine_of(self, node: str) -> str:
        assert self.placement is not None
        return self.placement.machine_of(node)

    def holds(self, node: str) -> bool:
        """Whether ``node`` is on this machine (its switch reachable over OpenFlow here)."""
        return self.placement is None or self.machine_of(node) == LOCAL

    def _remote(self, gpu: str) -> tuple[SshMachine, int, int] | None:
        if gpu not in self.shells:
            return None
        name, pid, starttime = self.shells[gpu]
        ssh = self.machines[name].ssh
        assert ssh is not None
        return ssh, pid, starttime

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        remote = self._remote(gpu)
        if remote is None:
            return super().popen(gpu, argv, **kwargs)
        if self.state is None:
            raise EmulationError("the emulation has not been started")
        ssh, pid, starttime = remote
        argv = list(argv)
        forwards = []
        if "--socket" in argv:  # a worker: its control socket, forwarded from there
            at = argv.index("--socket") + 1
            there = f"/tmp/astral-{self.state.run_id}-{gpu}.sock"
            forwards.append((there, argv[at]))
            argv[at] = there
            self._socket_files.setdefault(ssh.name, []).append(there)
        if argv and argv[0] == sys.executable:  # this checkout's interpreter: that one's
            argv[0] = ssh.python
        kwargs.pop("cwd", None)
        kwargs.pop("env", None)
        kwargs["stdin"] = subprocess.PIPE  # the session lives as long as this pipe
        kwargs.setdefault("start_new_session", True)
        process = ssh.popen(
            ssh.attach(pid, starttime, argv),
            forwards=forwards,
            logged_in=self.state.run_dir / f"ssh-{gpu}.up",
            **kwargs,
        )
        with self._state_lock:
            self.state.add_process(f"{gpu}:{argv[0]}@{ssh.name}", process.pid, "worker")
        return process

    def run(
        self,
        node: str | None,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 30.0,
    ) -> Completed:
        if node is None or self.placement is None or self.machine_of(node) == LOCAL:
            return super().run(node, argv, input=input, timeout=timeout)
        ssh = self.machines[self.machine_of(node)].ssh
        assert ssh is not None
        remote = self._remote(node)
        shell = (remote[1], remote[2]) if remote is not None else None  # None: a switch
        return ssh.run_in(shell, argv, input=input, timeout=timeout)

    def cli(self) -> None:
        """Mininet's CLI over every machine's GPUs: the other machines' as the cluster
        edition's remote hosts (orchestrator.cluster.nodes), made when it opens."""
        assert self.state is not None
        for gpu, (machine, pid, _) in sorted(self.shells.items()):
            if gpu in self.net.nameToNode:
                continue
            ssh = self.machines[machine].ssh
            assert ssh is not None
            try:
                host = attached_host(gpu, ssh, pid)
            except ImportError as err:
                self.log(f"the CLI reaches this machine's GPUs only: {err}")
                break
            self.net.hosts.append(host)
            self.net.nameToNode[gpu] = host
            if host.shell is not None:
                with self._state_lock:
                    self.state.add_process(f"{gpu}-cli@{machine}", host.shell.pid, "worker")
        super().cli()

    # -- path tracing --------------------------------------------------------------------

    def open_control(self) -> Control:
        """Every machine's ovs-vswitchd for a path trace (orchestrator.cluster.trace)."""
        assert self.placement is not None
        return ClusterControl(list(self.machines), self._open_control, self.machine_of)

    def _open_control(self, machine: str) -> Control:
        ssh = self.machines[machine].ssh
        if ssh is None:
            return open_control(self)
        remote = str(self.parts[machine].up.get("control") or "")
        if not remote or self.state is None:
            return AppctlControl(_MachineExecutor(ssh))
        local = self.state.run_dir / f"ovs-{machine}.ctl"
        if machine not in self._forwards:
            forward = subprocess.Popen(
                ssh.forward_argv(str(local), remote),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._forwards[machine] = forward
            with self._state_lock:
                self.state.add_process(f"trace-{machine}", forward.pid, "worker")
            deadline = time.monotonic() + 15
            while not local.exists() and forward.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        try:
            return VswitchdControl(local)
        except TraceError:
            return AppctlControl(_MachineExecutor(ssh))

    # -- teardown ------------------------------------------------------------------------

    def stop(self) -> Any:
        if self._stopped:
            return super().stop()
        threads = []
        results: dict[str, tuple[list[str], list[str]]] = {}
        for name, part in self.parts.items():

            def stop_part(name: str = name, part: RemotePart = part) -> None:
                results[name] = part.stop()

            thread = threading.Thread(target=stop_part, daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(PART_STOP_S + 15)
        socket_errors = self._remove_socket_files()
        for forward in self._forwards.values():
            forward.terminate()
            forward.wait()
        report = super().stop()
        for name in self.parts:
            lines, errors = results.get(name, ([], [f"{name}: its part did not report"]))
            self.part_reports += lines + errors
            report.errors += errors
        report.errors += socket_errors
        return report

    def _remove_socket_files(self) -> list[str]:
        """Remove the worker sockets sshd created on the other machines for the runs'
        ``-R`` forwards (over the master connection while it still lives); what could
        not be removed is reported, not left silently."""
        errors = []
        for name, paths in self._socket_files.items():
            ssh = self.machines[name].ssh
            if ssh is None or not paths:
                continue
            done = ssh.run(["rm", "-f", "--", *sorted(set(paths))], timeout=15)
            if done.returncode == 0:
                self.part_reports.append(f"{name}: removed {len(set(paths))} worker socket(s)")
            else:
                errors.append(
                    f"{name}: could not remove the worker sockets {' '.join(sorted(set(paths)))}:"
                    f" {done.stderr.strip() or f'status {done.returncode}'}"
                )
        self._socket_files.clear()
        return errors


class _MachineExecutor:
    """Commands in another machine's root namespace (a CommandExecutor for ovs-appctl)."""

    def __init__(self, ssh: SshMachine) -> None:
        self.ssh = ssh

    def run(
        self,
        node: str | None,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 30.0,
    ) -> Completed:
        return self.ssh.run(argv, input=input, timeout=timeout)

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        raise NotImplementedError
