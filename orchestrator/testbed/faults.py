"""Faults applied to a running fabric: by hand (``astral fault``) or on a schedule (a run).

:class:`FaultInjector` applies and undoes one :class:`~orchestrator.testbed.faultspec.FaultSpec`
by real means, through the seams below it: links and switches through
:class:`~orchestrator.emulation.faults.LinkFaults` (interface state, the HTB class at another
rate, an nftables netdev table, OpenFlow entries with the fault's cookie), the controller
through a :class:`ControllerHandle` (its process killed, started again), a straggler through
:class:`Stragglers` (the launcher tells the rank's worker to enter every operation late).
Everything a fault adds is written into the run's fault record
(:class:`~orchestrator.emulation.state.FaultRecord`) *before* it is created, so that
``astral clean`` removes it after a kill -9; undoing a fault removes its entry.

Faults on the same component compose: what a link, a port, a GPU or the controller is
left with is what the faults still *active* in the record imply, whoever applied them (a
run's schedule or ``astral fault``). A slowed link runs at the most restrictive rate of
the link-slow faults on it, a port stays down while a link-down or switch-down holds it,
a GPU is as late as its latest straggler, the controller stays dead while a crash is
active. So undoing one fault never undoes another (:meth:`FaultInjector.undo` computes
the state from the remaining faults). A flap does not hold its link down: it toggles it,
and its ups leave down what another fault holds down.

The schedule a run follows is orchestrator/testbed/faultschedule.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from orchestrator.emulation.controller import ControllerProcess, controller_env
from orchestrator.emulation.faults import (
    End,
    FabricFaults,
    LinkFaults,
    fault_cookie,
    link_ends,
    loss_table,
)
from orchestrator.emulation.state import (
    FaultEntry,
    FaultRecord,
    FaultResource,
    ProcessRecord,
    RunState,
    proc_starttime,
)
from orchestrator.emulation.wiring import intf_name
from orchestrator.testbed.faultspec import (
    FaultSpec,
    parse_fault,
)
from orchestrator.testbed.testbed import Testbed
from orchestrator.worker.launcher import Launcher
from topologies.description import FabricDescription
from topologies.errors import AstralError, EmulationError
from topologies.model import Fabric, Link
from topologies.spec import _Reader


class FaultError(EmulationError):
    """A fault could not be applied or undone (its commands failed, or it has no means)."""


# --- the controller and the workers ---------------------------------------------------------


class ControllerHandle(Protocol):
    """What ``controller-crash`` needs: kill the controller process, start it again."""

    def kill(self) -> str: ...

    def restart(self, record: Callable[[FaultResource], None]) -> str: ...


class OwnController:
    """The controller of a fabric this process holds (a run's): SIGKILL to its process
    group, then :meth:`ControllerProcess.start` on the same port (the emulation's
    ``on_start`` records the new process in the run record, as at bring-up)."""

    def __init__(self, controller: ControllerProcess) -> None:
        self.controller = controller

    def kill(self) -> str:
        pid = self.controller.pid
        if pid is None or not self.controller.running():
            raise FaultError("the controller is not running")
        os.killpg(pid, signal.SIGKILL)  # our child, not reaped: the pid is still its own
        self.controller.stop()  # reaps it
        return f"controller pid {pid} killed (SIGKILL)"

    def restart(self, record: Callable[[FaultResource], None]) -> str:
        if self.controller.running():
            return f"controller already running (pid {self.controller.pid})"
        self.controller.start()
        return f"controller restarted (pid {self.controller.pid}, port {self.controller.port})"


class RecordedController:
    """The controller of a fabric another process holds (``astral up``), found in its run
    record: killed by pid (checked against its recorded start time), started again with the
    same command line (kept in the run directory meanwhile, since the crash may be cleared
    by another ``astral fault``), in its own session, its output appended to the
    controller's log. The new process goes into the fault record, where it stays after the
    fault (``kept``) until the fabric is torn down or cleaned."""

    ARGV_FILE = "controller.argv.json"

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.record = FaultRecord(state.run_dir)

    def _current(self) -> ProcessRecord:
        alive = [
            p
            for p in self.state.processes
            if p.role == "controller" and proc_starttime(p.pid) == p.starttime
        ]
        started = [r for e in self.record.entries() for r in e.resources] + self.record.kept()
        for r in started:
            if r.kind != "process" or r.pid is None or r.starttime is None:
                continue
            if proc_starttime(r.pid) == r.starttime:
                alive.append(ProcessRecord(r.name, r.pid, r.starttime, "controller", True))
        if not alive:
            raise FaultError(f"no running controller in the run record of {self.state.run_id}")
        return alive[-1]

    def kill(self) -> str:
        process = self._current()
        raw = Path(f"/proc/{process.pid}/cmdline").read_bytes()
        argv = [part.decode() for part in raw.split(b"\0") if part]
        (self.state.run_dir / self.ARGV_FILE).write_text(json.dumps(argv), encoding="utf-8")
        os.killpg(process.pid, signal.SIGKILL)
        return f"controller pid {process.pid} killed (SIGKILL)"

    def restart(self, record: Callable[[FaultResource], None]) -> str:
        try:
            argv = json.loads((self.state.run_dir / self.ARGV_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise FaultError(
                "the controller's command line is unknown (was it killed by a fault?)"
            ) from None
        log: IO[bytes]
        with open(self.state.run_dir / "controller.log", "ab") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=controller_env(),
                start_new_session=True,
            )
        starttime = proc_starttime(process.pid)
        record(FaultResource("process", "controller", pid=process.pid, starttime=starttime))
        return f"controller restarted (pid {process.pid})"


class Stragglers:
    """Which GPUs enter every operation late, and by how much, kept across launches: the
    runner attaches each launcher while it runs, and a fault's lateness reaches the
    workers at once (``Launcher.set_late``), or as soon as the next launch starts."""

    def __init__(self, gpus: Sequence[str]) -> None:
        self.ranks = {gpu: rank for rank, gpu in enumerate(gpus)}
        self.late: dict[str, float] = {}
        self._launcher: Launcher | None = None
        self._lock = threading.Lock()

    def set(self, gpu: str, seconds: float) -> None:
        if gpu not in self.ranks:
            raise FaultError(f"{gpu} is not a rank of this run")
        with self._lock:
            self.late[gpu] = seconds
            if self._launcher is not None:
                self._launcher.set_late(self.ranks[gpu], seconds)

    def attach(self, launcher: Launcher) -> None:
        with self._lock:
            self._launcher = launcher
            for gpu, seconds in self.late.items():
                if seconds:
                    launcher.set_late(self.ranks[gpu], seconds)

    def detach(self) -> None:
        with self._lock:
            self._launcher = None


def spec_of(entry: FaultEntry, fabric: Fabric, read: _Reader) -> FaultSpec:
    """The fault an active record entry describes (its kind, target and keys as written),
    validated again: how a fault applied by another process is undone."""
    raw: dict[str, Any] = {"kind": entry.kind, **entry.params}
    if entry.target:
        raw["target"] = entry.target
    return parse_fault(read, raw, fabric, "fault", entry.id)


# --- one fault, applied and undone ----------------------------------------------------------


class FaultInjector:
    """Applies and undoes faults on one running fabric (see the module docstring)."""

    def __init__(
        self,
        links: LinkFaults,
        description: FabricDescription,
        record: FaultRecord,
        run_id: str,
        *,
        controller: ControllerHandle | None = None,
        stragglers: Stragglers | None = None,
        owner: str = "run",
    ) -> None:
        self.links = links
        self.description = description
        self.record = record
        self.run_id = run_id
        self.controller = controller
        self.stragglers = stragglers
        self.owner = owner

    def apply(self, fault: FaultSpec) -> str:
        """Put ``fault`` in effect; returns what was done, in a phrase."""
        self.record.add(
            FaultEntry(fault.id, fault.kind, fault.target_text, fault.params(), owner=self.owner)
        )
        try:
            detail = self._apply(fault)
        except BaseException:
            with contextlib.suppress(AstralError, OSError):
                self._undo(fault)  # leave nothing half-applied
            self.record.remove(fault.id)
            raise
        self.record.set_applied(fault.id, time.time())
        return detail

    def prepare(self, fault: FaultSpec) -> None:
        """What can be done ahead of ``fault``'s instant so that applying it then is quick
        (a blackhole: the OpenFlow connection to its switch opened)."""
        if fault.kind == "blackhole" and fault.target.switch is not None:
            self.links.prepare_blackhole(fault.target.switch)

    def close(self) -> None:
        """Let go of what :meth:`prepare` holds (after the last undo)."""
        self.links.close()

    def undo(self, fault: FaultSpec) -> str:
        """Take ``fault`` out of effect; its record entry goes once it is undone."""
        detail = self._undo(fault)
        self.record.remove(fault.id)
        return detail

    def flap(self, fault: FaultSpec, up: bool) -> str:
        """One half of a flap: the link down or up again (its ends another active fault
        holds down stay down)."""
        if not up:
            for link in fault.target.links:
                self.links.set_link_state(link, False)
            return "link down"
        return self._links_up(fault.target.links, self.active_faults(fault.id))

    def active_faults(self, but: int | None = None) -> list[FaultSpec]:
        """The faults the record holds as active, but ``but``, as specs: what the state
        of a component is computed from when one of its faults changes."""
        read = _Reader("fault record")
        out = []
        for entry in self.record.entries():
            if entry.id == but:
                continue
            with contextlib.suppress(AstralError):  # written by us: valid unless stale
                out.append(spec_of(entry, self.description.fabric, read))
        return out

    def held_down(self, others: Sequence[FaultSpec]) -> dict[End, int]:
        """The link ends ``others`` hold down, each with the id of a fault holding it."""
        held: dict[End, int] = {}
        fabric = self.description.fabric
        for other in others:
            if other.kind == "link-down":
                for link in other.target.links:
                    for end in link_ends(link):
                        held.setdefault(end, other.id)
            elif other.kind == "switch-down" and other.target.switch is not None:
                switch = other.target.switch
                for link in fabric.links_of(switch):
                    held.setdefault((switch, link.port_of(switch)), other.id)
        return held

    def _links_up(self, links: Sequence[Link], others: Sequence[FaultSpec]) -> str:
        held = self.held_down(others)
        kept: set[int] = set()
        for link in links:
            ends = link_ends(link)
            free = [end for end in ends if end not in held]
            kept.update(held[end] for end in ends if end in held)
            if free == ends:
                self.links.set_link_state(link, True)
            elif free:
                self.links.set_port_state(free, True)
        return "link up" + _still(kept, "down")

    def slowest(self, end: End, faults: Sequence[FaultSpec]) -> float | None:
        """The most restrictive rate fraction the link-slow ``faults`` put on ``end``
        (None: none of them slows it)."""
        fractions = [
            f.rate
            for f in faults
            if f.kind == "link-slow" and f.rate is not None and end in self._ends(f)
        ]
        return min(fractions, default=None)

    def _reshape(self, fault: FaultSpec, faults: Sequence[FaultSpec]) -> None:
        """Each end of ``fault``'s links shaped at the rate ``faults`` imply (the link's
        own where none slows it)."""
        for link in fault.target.links:
            ends = self._ends_of(fault, link) or link_ends(link)
            groups: dict[float | None, list[End]] = {}
            for end in ends:
                groups.setdefault(self.slowest(end, faults), []).append(end)
            for fraction, group in groups.items():
                if fraction is None:
                    self.links.restore_link_rate(link, group)
                else:
                    rate = self.description.emulated_rate(link) * fraction
                    self.links.set_link_rate(link, rate, group)

    def _resource(self, fault: FaultSpec, resource: FaultResource) -> None:
        self.record.add_resource(fault.id, resource)

    def _ends(self, fault: FaultSpec) -> list[tuple[str, int]]:
        if fault.target.ends:
            return list(fault.target.ends)
        return [end for link in fault.target.links for end in link_ends(link)]

    def _gpu_or_root(self, node: str) -> str | None:
        return node if node in self.description.fabric.gpus else None

    def _apply(self, fault: FaultSpec) -> str:
        kind, target = fault.kind, fault.target
        if kind in ("link-down", "link-flap"):
            for node, port in self._ends(fault):
                name = intf_name(node, port)
                self._resource(fault, FaultResource("link-state", name, self._gpu_or_root(node)))
            for link in target.links:
                self.links.set_link_state(link, False)
            return "link down"
        if kind == "link-slow":
            assert fault.rate is not None
            for node, port in self._ends(fault):
                name = intf_name(node, port)
                self._resource(fault, FaultResource("shaping", name, self._gpu_or_root(node)))
            others = self.active_faults(fault.id)
            self._reshape(fault, [*others, fault])
            slower = {
                o.id
                for o in others
                if o.kind == "link-slow"
                and o.rate is not None
                and o.rate < fault.rate
                and set(self._ends(o)) & set(self._ends(fault))
            }
            return f"HTB rate x {fault.rate:g} on {len(self._ends(fault))} link end(s)" + _still(
                slower, "slower"
            )
        if kind == "link-loss":
            assert fault.probability is not None
            table = loss_table(self.run_id, fault.id)
            for node, _ in self._ends(fault):
                self._resource(fault, FaultResource("nft", table, self._gpu_or_root(node)))
            for link in target.links:
                self.links.add_link_loss(table, link, fault.probability, self._ends_of(fault, link))
            gpus = self.description.fabric.gpus
            how = sorted(
                {"lost after the GPU sends" if n in gpus else "drop" for n, _ in self._ends(fault)}
            )
            return f"nftables netdev table {table}: egress {', '.join(how)} p={fault.probability:g}"
        if kind == "switch-down":
            assert target.switch is not None
            self._resource(fault, FaultResource("link-state", target.switch))
            self.links.set_switch_state(target.switch, False)
            return "every port down"
        if kind == "straggler":
            assert target.gpu is not None and fault.delay is not None
            if self.stragglers is None:
                raise FaultError(
                    "a straggler needs a run's workers: use it in an experiment's faults:"
                )
            late = [fault.delay, *self._lateness(target.gpu, self.active_faults(fault.id))]
            self.stragglers.set(target.gpu, max(late))
            rank = self.stragglers.ranks[target.gpu]
            return f"rank {rank} enters every operation {fault.delay * 1e3:g} ms late"
        if kind == "blackhole":
            assert target.switch is not None and fault.destination is not None
            cookie = fault_cookie(fault.id)
            addresses = self.addresses(fault.destination)
            self._resource(fault, FaultResource("openflow", target.switch, cookie=cookie))
            self.links.add_blackhole(target.switch, addresses, cookie)
            return f"drop to {', '.join(addresses)} (cookie {cookie:#x})"
        if kind == "controller-crash":
            if self.controller is None:
                raise FaultError("no controller to crash")
            crashes = self._crashes(self.active_faults(fault.id))
            if crashes:
                return "controller already down" + _still(crashes, "crashed")
            return self.controller.kill()
        raise FaultError(f"unknown fault kind {kind}")

    def _lateness(self, gpu: str, faults: Sequence[FaultSpec]) -> list[float]:
        return [
            f.delay
            for f in faults
            if f.kind == "straggler" and f.target.gpu == gpu and f.delay is not None
        ]

    @staticmethod
    def _crashes(faults: Sequence[FaultSpec]) -> set[int]:
        return {f.id for f in faults if f.kind == "controller-crash"}

    def _ends_of(self, fault: FaultSpec, link: Link) -> list[tuple[str, int]] | None:
        """A one-direction fault's end on ``link`` (None: both ends)."""
        if not fault.target.ends:
            return None
        return [end for end in fault.target.ends if end in link_ends(link)]

    def _undo(self, fault: FaultSpec) -> str:
        kind, target = fault.kind, fault.target
        if kind in ("link-down", "link-flap"):
            return self._links_up(target.links, self.active_faults(fault.id))
        if kind == "link-slow":
            others = self.active_faults(fault.id)
            self._reshape(fault, others)
            slow = {
                o.id
                for o in others
                if o.kind == "link-slow" and set(self._ends(o)) & set(self._ends(fault))
            }
            return "HTB rate restored" + _still(slow, "slowed")
        if kind == "link-loss":
            table = loss_table(self.run_id, fault.id)
            for link in target.links:
                self.links.remove_link_loss(table, link, self._ends_of(fault, link))
            return f"nftables table {table} deleted"
        if kind == "switch-down":
            assert target.switch is not None
            switch = target.switch
            held = self.held_down(self.active_faults(fault.id))
            ports = [
                (switch, link.port_of(switch)) for link in self.description.fabric.links_of(switch)
            ]
            free = sorted(end for end in ports if end not in held)
            kept = {held[end] for end in ports if end in held}
            if not kept:
                self.links.set_switch_state(switch, True)
            elif free:
                self.links.set_port_state(free, True)
            return "every port up" if not kept else "ports up" + _still(kept, "down")
        if kind == "straggler":
            assert target.gpu is not None
            late = self._lateness(target.gpu, self.active_faults(fault.id))
            if self.stragglers is not None:
                self.stragglers.set(target.gpu, max(late, default=0.0))
            if late:
                return f"{max(late) * 1e3:g} ms late still (another straggler)"
            return "on time again"
        if kind == "blackhole":
            assert target.switch is not None
            self.links.remove_blackhole(target.switch, fault_cookie(fault.id))
            return "entries deleted"
        if kind == "controller-crash":
            if self.controller is None:
                raise FaultError("no controller to restart")
            crashes = self._crashes(self.active_faults(fault.id))
            if crashes:
                return "controller left down" + _still(crashes, "crashed")
            return self.controller.restart(lambda r: self._resource(fault, r))
        raise FaultError(f"unknown fault kind {kind}")

    def addresses(self, gpu: str) -> list[str]:
        """Every address of ``gpu`` the fabric carries: its fabric address and each NIC
        port's (a blackhole must catch whichever the senders use)."""
        plan = self.description.addresses[gpu]
        found = [plan.fabric_ip, *(nic.ip for nic in plan.nics)]
        return list(dict.fromkeys(found))


def _still(ids: set[int], how: str) -> str:
    """`` (still down: fault 102)``: which active faults keep a component as it is."""
    if not ids:
        return ""
    word = "fault" if len(ids) == 1 else "faults"
    return f" (still {how}: {word} {', '.join(map(str, sorted(ids)))})"


def injector_on(testbed: Testbed, gpus: Sequence[str]) -> tuple[FaultInjector, Stragglers]:
    """An injector for the fabric ``testbed`` holds, its controller this process's, with
    the stragglers of a run on ``gpus`` (rank i plays gpus[i])."""
    emulation = testbed.emulation
    if emulation.state is None or emulation.controller is None:
        raise FaultError("the testbed is not up")
    stragglers = Stragglers(gpus)
    injector = FaultInjector(
        FabricFaults(emulation, testbed.description, openflow=True),
        testbed.description,
        FaultRecord(testbed.run_dir),
        emulation.state.run_id,
        controller=OwnController(emulation.controller),
        stragglers=stragglers,
    )
    return injector, stragglers
