"""The run record: what a run created, written down before it is created.

Every run owns a directory ``<state dir>/runs/<run id>/`` (state dir: ``$ASTRAL_STATE_DIR``,
default ``/run/astral``, a tmpfs that a reboot empties along with the network it describes).
It holds ``state.json`` (this record), ``fabric.json`` (the generated fabric description) and
the controller's log. The record lists, each entry added *before* the resource exists:

    bridges      OVS bridges (tagged external_ids:astral-run=<run id>) and Linux bridges
    interfaces   root-namespace veth ends (deleting one end deletes its pair)
    link_group   a device group number (ip-link(8)) all our root-namespace devices join, so
                 that the kernel deletes them in one operation (one by one costs ~10 ms each)
    qdiscs       shapers on root-namespace interfaces (they go with their interface)
    hosts        each GPU's namespace: its shell (pid + /proc start time, so that a recycled
                 pid is never killed), the namespace's inode and its interface names
    processes    other processes: switch shells, the controller, workers

Beside it, ``faults.state.json`` (:class:`FaultRecord`) lists what faults added to the
running fabric (orchestrator/testbed/faults.py), each resource before it is created:
nftables tables, OpenFlow entries (by cookie), a restarted controller process, changed
shapers and interface states. It is a file of its own, locked while it changes, because
``astral fault`` adds to it from another process than the one holding the fabric.

:func:`clean` removes exactly what a record lists and nothing else, idempotently, whether
the run ended normally (the emulation's teardown calls it) or was killed (``astral clean``).
It also stops stray processes still inside a recorded GPU namespace (a worker started
there): a process counts as inside when its ``/proc/<pid>/ns/net`` is the recorded inode
*and* its ``/proc/<pid>/net/dev`` lists the recorded interfaces, so a recycled inode
number cannot match; and a record that was clean already is never searched, since another
run of the same fabric has namespaces with those very interface names.

System calls go through :class:`System`; unit tests pass a fake one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

STATE_DIR_ENV = "ASTRAL_STATE_DIR"
DEFAULT_STATE_DIR = Path("/run/astral")
STATE_FILE = "state.json"
FAULT_FILE = "faults.state.json"
HAND_IDS = 100  # faults applied by hand get ids from HAND_IDS + 1 (FaultRecord.next_id)
RUN_TAG = "astral-run"  # OVS external_ids key naming the run that created a bridge
VERSION = 1
KEEP_CLEAN_RUNS = 10


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def runs_dir(base: Path | None = None) -> Path:
    return (base or state_dir()) / "runs"


@dataclass
class ProcessRecord:
    """A process the run started. ``starttime`` is field 22 of /proc/<pid>/stat."""

    name: str
    pid: int
    starttime: int
    role: str = "process"  # switch | controller | worker | process
    group: bool = False  # leads its own process group: signal the whole group


@dataclass
class HostRecord:
    """A GPU's namespace, known by its shell and (to find strays) its inode and interfaces."""

    name: str
    pid: int | None = None
    starttime: int | None = None
    netns: int | None = None
    intfs: list[str] = field(default_factory=list)


@dataclass
class CleanReport:
    """What :func:`clean` did, per kind of resource."""

    killed: list[str] = field(default_factory=list)
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    qdiscs: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)  # what faults left: nft tables, entries
    skipped: list[str] = field(default_factory=list)  # recorded but not ours any more
    errors: list[str] = field(default_factory=list)

    @property
    def removed_anything(self) -> bool:
        return bool(self.killed or self.bridges or self.interfaces or self.qdiscs or self.faults)

    def merge(self, other: CleanReport) -> None:
        for name in ("killed", "bridges", "interfaces", "qdiscs", "faults", "skipped", "errors"):
            getattr(self, name).extend(getattr(other, name))

    def lines(self) -> list[str]:
        def summary(label: str, items: list[str]) -> str:
            more = f", ... ({len(items)} in all)" if len(items) > 8 else ""
            shown = ", ".join(items[:8]) + more
            return f"{label}: {shown}"

        out = []
        for label, items in (
            ("stopped processes", self.killed),
            ("deleted bridges", self.bridges),
            ("deleted interfaces", self.interfaces),
            ("removed qdiscs", self.qdiscs),
            ("removed what faults added", self.faults),
            ("left alone (not ours any more)", self.skipped),
            ("errors", self.errors),
        ):
            if items:
                out.append(summary(label, items))
        return out or ["nothing to remove"]


#: a record's keys and the JSON types :func:`clean` relies on (to_dict writes them so)
_RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "owner_pid": (int,),
    "command": (list,),
    "created": (int, float),
    "status": (str,),
    "bridges": (list,),
    "interfaces": (list,),
    "qdiscs": (list,),
    "hosts": (dict,),
    "processes": (list,),
    "extra": (dict,),
}
_REQUIRED = ("run_id", "owner_pid")


def record_problem(data: object) -> str | None:
    """What keeps ``data`` from being a run record :func:`clean` can act on, None when
    nothing does: a record of the wrong shape would have it remove the wrong names, or
    stop half-way."""
    if not isinstance(data, dict):
        return f"expected a JSON object, found {type(data).__name__}"
    if data.get("version") != VERSION:
        return f"key 'version': expected {VERSION}, found {data.get('version')!r}"
    for key in _REQUIRED:
        if key not in data:
            return f"key '{key}': missing"
    for key, types in _RECORD_TYPES.items():
        value = data.get(key)
        if key in data and (not isinstance(value, types) or isinstance(value, bool)):
            names = "/".join("array" if t is list else "object" if t is dict else t.__name__
                             for t in types)  # fmt: skip
            return f"key '{key}': expected {names}, found {value!r}"
    for key in ("interfaces", "qdiscs", "command"):
        if not all(isinstance(v, str) for v in data.get(key, [])):
            return f"key '{key}': expected an array of names, found {data[key]!r}"
    for b in data.get("bridges", []):
        if not (isinstance(b, dict) and isinstance(b.get("name"), str)):
            return f"key 'bridges': expected objects with a 'name', found {b!r}"
    for key in ("hosts", "processes"):
        members = data.get(key, {})
        for member in members.values() if isinstance(members, dict) else members:
            if not isinstance(member, dict):
                return f"key '{key}': expected objects, found {member!r}"
    return None


@dataclass
class RunState:
    """The record of one run, saved atomically to ``<run dir>/state.json`` on every change."""

    run_dir: Path
    run_id: str
    owner_pid: int
    owner_starttime: int | None
    command: list[str]
    created: float
    status: str = "starting"  # starting | up | tearing-down | clean
    link_group: int | None = None  # device group (ip-link(8)) of our root interfaces
    bridges: list[dict[str, str]] = field(default_factory=list)  # {"name", "kind"}
    interfaces: list[str] = field(default_factory=list)
    qdiscs: list[str] = field(default_factory=list)
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    processes: list[ProcessRecord] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.run_dir / STATE_FILE

    # -- creation and persistence ------------------------------------------------------

    @classmethod
    def create(
        cls, base: Path | None = None, command: list[str] | None = None, now: float | None = None
    ) -> RunState:
        """A new run directory under ``base`` (default: :func:`state_dir`), saved at once."""
        now = time.time() if now is None else now
        pid = os.getpid()
        run_id = time.strftime("%Y%m%dT%H%M%S", time.localtime(now)) + f"-{pid}"
        run_dir = runs_dir(base) / run_id
        run_dir.mkdir(parents=True, exist_ok=False)
        state = cls(
            run_dir=run_dir,
            run_id=run_id,
            owner_pid=pid,
            owner_starttime=proc_starttime(pid),
            command=list(command if command is not None else _own_command()),
            created=now,
        )
        state.save()
        return state

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "run_id": self.run_id,
            "owner_pid": self.owner_pid,
            "owner_starttime": self.owner_starttime,
            "command": self.command,
            "created": self.created,
            "status": self.status,
            "link_group": self.link_group,
            "bridges": self.bridges,
            "interfaces": self.interfaces,
            "qdiscs": self.qdiscs,
            "hosts": {name: asdict(host) for name, host in self.hosts.items()},
            "processes": [asdict(p) for p in self.processes],
            "extra": self.extra,
        }

    def save(self) -> None:
        """Write atomically: a run killed mid-write leaves the previous complete record."""
        fd, tmp = tempfile.mkstemp(dir=self.run_dir, prefix=".state-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(self.to_dict(), out, indent=1)
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, run_dir: Path) -> RunState:
        """The record in ``run_dir``; ValueError (naming the file and key) when it is not
        one this version writes, OSError when it cannot be read."""
        data = json.loads((run_dir / STATE_FILE).read_text(encoding="utf-8"))
        problem = record_problem(data)
        if problem is not None:
            raise ValueError(f"{run_dir / STATE_FILE}: {problem}")
        return cls(
            run_dir=run_dir,
            run_id=data["run_id"],
            owner_pid=data["owner_pid"],
            owner_starttime=data.get("owner_starttime"),
            command=list(data.get("command", [])),
            created=data.get("created", 0.0),
            status=data.get("status", "starting"),
            link_group=data.get("link_group"),
            bridges=list(data.get("bridges", [])),
            interfaces=list(data.get("interfaces", [])),
            qdiscs=list(data.get("qdiscs", [])),
            hosts={name: HostRecord(**h) for name, h in data.get("hosts", {}).items()},
            processes=[ProcessRecord(**p) for p in data.get("processes", [])],
            extra=dict(data.get("extra", {})),
        )

    # -- recording (call these *before* creating the resource) ---------------------------

    def set_status(self, status: str) -> None:
        self.status = status
        self.save()

    def add_bridges(self, bridges: Iterable[tuple[str, str]]) -> None:
        """Record bridges ``(name, kind)``, kind ``ovs`` or ``linux``."""
        known = {b["name"] for b in self.bridges}
        self.bridges += [{"name": n, "kind": k} for n, k in bridges if n not in known]
        self.save()

    def add_interfaces(self, names: Iterable[str]) -> None:
        known = set(self.interfaces)
        self.interfaces += [n for n in names if n not in known]
        self.save()

    def add_qdiscs(self, intfs: Iterable[str]) -> None:
        known = set(self.qdiscs)
        self.qdiscs += [n for n in intfs if n not in known]
        self.save()

    def add_hosts(self, hosts: dict[str, list[str]]) -> None:
        """Record GPU namespaces about to be created, with their interface names."""
        for name, intfs in hosts.items():
            self.hosts.setdefault(name, HostRecord(name, intfs=list(intfs)))
        self.save()

    def set_host_process(self, name: str, pid: int, netns: int | None, save: bool = True) -> None:
        host = self.hosts.setdefault(name, HostRecord(name))
        host.pid, host.starttime, host.netns = pid, proc_starttime(pid), netns
        if save:
            self.save()

    def add_process(
        self,
        name: str,
        pid: int,
        role: str = "process",
        group: bool = False,
        starttime: int | None = None,
        save: bool = True,
    ) -> None:
        starttime = proc_starttime(pid) if starttime is None else starttime
        if starttime is None:
            return  # already gone: nothing to clean
        self.processes = [p for p in self.processes if p.pid != pid]
        self.processes.append(ProcessRecord(name, pid, starttime, role, group))
        if save:
            self.save()


@dataclass
class FaultResource:
    """One thing a fault added to the fabric. ``kind``:

    - ``nft``: an nftables netdev table ``name`` on ``node`` (a GPU: in its namespace,
      which takes the table with it; a switch: the root namespace);
    - ``openflow``: entries with ``cookie`` on bridge ``name``;
    - ``process``: a process (``pid``, ``starttime``), a controller restarted by a fault;
    - ``shaping`` / ``link-state``: interface ``name``'s shaper or state, changed (they go
      with the interface; recorded so that a person sees what a fault touched).
    """

    kind: str
    name: str
    node: str | None = None
    cookie: int | None = None
    pid: int | None = None
    starttime: int | None = None

    def label(self) -> str:
        where = f" on {self.node}" if self.node else ""
        if self.kind == "openflow" and self.cookie is not None:
            return f"openflow entries cookie={self.cookie:#x} on {self.name}"
        if self.kind == "process":
            return f"process {self.name} ({self.pid})"
        return f"{self.kind} {self.name}{where}"


@dataclass
class FaultEntry:
    """One active fault: what was asked (``params``: its keys as written) and what it added."""

    id: int
    kind: str
    target: str
    params: dict[str, Any] = field(default_factory=dict)
    applied: float | None = None  # epoch seconds
    owner: str = "run"  # run (a scheduled fault) | astral fault (by hand)
    resources: list[FaultResource] = field(default_factory=list)


class FaultRecord:
    """``<run dir>/faults.state.json``: the active faults of one run and what they added,
    and the processes faults started that outlive them (``kept``: a controller restarted
    when its crash ended runs until the fabric goes).

    Every change is a read-modify-write under an exclusive ``flock`` of the file's lock
    file, so two processes (the run and ``astral fault``) never lose each other's entries.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / FAULT_FILE
        self._lock_path = Path(run_dir) / (FAULT_FILE + ".lock")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[tuple[list[FaultEntry], list[FaultResource]]]:
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries, kept = self._read()
            before = ([asdict(e) for e in entries], [asdict(r) for r in kept])
            yield entries, kept
            if ([asdict(e) for e in entries], [asdict(r) for r in kept]) != before:
                self._write(entries, kept)

    def _read(self) -> tuple[list[FaultEntry], list[FaultResource]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return [], []
        entries = []
        for raw in data.get("faults", []):
            resources = [FaultResource(**r) for r in raw.pop("resources", [])]
            entries.append(FaultEntry(**raw, resources=resources))
        return entries, [FaultResource(**r) for r in data.get("kept", [])]

    def _write(self, entries: list[FaultEntry], kept: list[FaultResource]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".faults-", suffix=".json")
        document = {
            "version": VERSION,
            "faults": [asdict(e) for e in entries],
            "kept": [asdict(r) for r in kept],
        }
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=1)
        os.replace(tmp, self.path)

    def entries(self) -> list[FaultEntry]:
        if not self.path.exists():
            return []
        with self._locked() as (entries, _):
            return list(entries)

    def kept(self) -> list[FaultResource]:
        """Processes faults started that outlive them (see the class docstring)."""
        if not self.path.exists():
            return []
        with self._locked() as (_, kept):
            return list(kept)

    def add(self, entry: FaultEntry) -> None:
        """Record a fault about to be applied (its id unique among the active ones)."""
        with self._locked() as (entries, _):
            if any(e.id == entry.id for e in entries):
                raise ValueError(f"fault {entry.id} is already active")
            entries.append(entry)

    def add_resource(self, fault_id: int, resource: FaultResource) -> None:
        """Record a resource of fault ``fault_id`` *before* creating it."""
        with self._locked() as (entries, _):
            for entry in entries:
                if entry.id == fault_id:
                    if resource not in entry.resources:
                        entry.resources.append(resource)
                    return
            raise ValueError(f"no active fault {fault_id}")

    def set_applied(self, fault_id: int, when: float) -> None:
        with self._locked() as (entries, _):
            for entry in entries:
                if entry.id == fault_id:
                    entry.applied = when

    def remove(self, fault_id: int) -> None:
        """The fault is undone: nothing of it is left to clean but the processes it
        started, which move to ``kept``."""
        with self._locked() as (entries, kept):
            for entry in entries:
                if entry.id == fault_id:
                    kept += [r for r in entry.resources if r.kind == "process"]
            entries[:] = [e for e in entries if e.id != fault_id]

    def forget_kept(self) -> None:
        with self._locked() as (_, kept):
            kept.clear()

    def next_id(self) -> int:
        """An id for a fault applied by hand (``astral fault apply``): above every active
        one and above HAND_IDS, so that it never meets the id of an experiment's fault
        (their positions in ``faults:``) on the same fabric."""
        return max((e.id for e in self.entries()), default=HAND_IDS) + 1


def _own_command() -> list[str]:
    try:
        raw = Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def proc_starttime(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if there is no such process."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        # fields[0] is field 3 (state): a zombie has exited and counts as gone.
        return None if fields[0] == "Z" else int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return None


# -- the system, behind an interface so that the logic is testable without root ------------


class System(Protocol):
    def starttime(self, pid: int) -> int | None: ...
    def kill(self, pid: int, sig: int, group: bool = False) -> None: ...
    def pids(self) -> list[int]: ...
    def netns_inode(self, pid: int) -> int | None: ...
    def net_devices(self, pid: int) -> set[str]: ...
    def ovs_bridges(self) -> dict[str, dict[str, str]]: ...
    def delete_ovs_bridges(self, names: list[str]) -> Callable[[], list[str]]: ...
    def links(self) -> set[str]: ...
    def delete_links(self, names: list[str]) -> list[str]: ...
    def link_group_members(self, group: int) -> set[str]: ...
    def delete_link_group(self, group: int) -> list[str]: ...
    def delete_nft_table(self, table: str) -> list[str]: ...
    def delete_flows(self, bridge: str, cookie: int) -> list[str]: ...
    def sleep(self, seconds: float) -> None: ...


class LinuxSystem:
    """The real thing: /proc, signals, ovs-vsctl, ip and tc."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc

    def starttime(self, pid: int) -> int | None:
        return proc_starttime(pid, self.proc)

    def kill(self, pid: int, sig: int, group: bool = False) -> None:
        try:
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def pids(self) -> list[int]:
        return [int(p) for p in os.listdir(self.proc) if p.isdigit()]

    def netns_inode(self, pid: int) -> int | None:
        try:
            return os.stat(self.proc / str(pid) / "ns" / "net").st_ino
        except OSError:
            return None

    def net_devices(self, pid: int) -> set[str]:
        try:
            lines = (self.proc / str(pid) / "net" / "dev").read_text().splitlines()[2:]
        except OSError:
            return set()
        return {line.split(":", 1)[0].strip() for line in lines}

    def ovs_bridges(self) -> dict[str, dict[str, str]]:
        result = _run(
            [
                "ovs-vsctl",
                "--timeout=10",
                "--format=json",
                "--columns=name,external_ids",
                "list",
                "Bridge",
            ]
        )
        if result.returncode != 0:
            return {}
        data = json.loads(result.stdout)
        bridges = {}
        for name, ids in data.get("data", []):
            # external_ids is ["map", [[key, value], ...]]
            bridges[name] = {k: v for k, v in ids[1]} if isinstance(ids, list) else {}
        return bridges

    def delete_ovs_bridges(self, names: list[str]) -> Callable[[], list[str]]:
        """Start deleting; the returned function waits until ovs-vswitchd has applied it."""
        if not names:
            return list
        argv = ["ovs-vsctl", "--timeout=120"]
        for i, name in enumerate(names):
            argv += ([] if i == 0 else ["--"]) + ["--if-exists", "del-br", name]
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )

        def wait() -> list[str]:
            _, err = process.communicate()
            return [] if process.returncode == 0 else [f"ovs-vsctl del-br: {err.strip()}"]

        return wait

    def links(self) -> set[str]:
        return _link_names(_run(["ip", "-o", "link", "show"]).stdout)

    def delete_links(self, names: list[str]) -> list[str]:
        return _batch(["ip", "-force", "-batch", "-"], [f"link del dev {n}" for n in names])

    def link_group_members(self, group: int) -> set[str]:
        return _link_names(_run(["ip", "-o", "link", "show", "group", str(group)]).stdout)

    def delete_link_group(self, group: int) -> list[str]:
        result = _run(["ip", "link", "delete", "group", str(group)])
        return [] if result.returncode == 0 else [f"ip link delete group: {result.stderr.strip()}"]

    def delete_nft_table(self, table: str) -> list[str]:
        """Delete a root-namespace netdev table (gone already: fine)."""
        result = _run(["nft", "delete", "table", "netdev", table])
        if result.returncode == 0 or "No such file or directory" in result.stderr:
            return []
        return [f"nft delete table netdev {table}: {result.stderr.strip()}"]

    def delete_flows(self, bridge: str, cookie: int) -> list[str]:
        """Delete exactly the entries with ``cookie`` on ``bridge``."""
        result = _run(
            ["ovs-ofctl", "-O", "OpenFlow13", "del-flows", bridge, f"cookie={cookie:#x}/-1"]
        )
        return (
            []
            if result.returncode == 0
            else [f"ovs-ofctl del-flows {bridge}: {result.stderr.strip()}"]
        )

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)


def _link_names(ip_output: str) -> set[str]:
    """Interface names in ``ip -o link show`` output ("12: p0r0t0-eth1@if11: <...>")."""
    names = set()
    for line in ip_output.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.add(parts[1].strip().split("@", 1)[0])
    return names


def _batch(argv: list[str], lines: list[str]) -> list[str]:
    """Run an ``ip``/``tc`` batch (names are validated identifiers: emulation.wiring)."""
    if not lines:
        return []
    result = _run(argv, "\n".join(lines) + "\n")
    if result.returncode == 0:
        return []
    # "Cannot find device" means someone (the kernel, with its pair) was first: fine.
    return [
        line
        for line in result.stderr.splitlines()
        if line.strip() and "Cannot find device" not in line and "Command failed" not in line
    ]


# -- cleaning ---------------------------------------------------------------------------


def _alive(system: System, pid: int | None, starttime: int | None) -> bool:
    return pid is not None and starttime is not None and system.starttime(pid) == starttime


def _stop(system: System, targets: list[tuple[str, int, bool]], grace: float) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left.

    Targets are ``(name, pid, group)``; ``group``: signal the process group it leads.
    """
    starts = {pid: (system.starttime(pid), group) for _, pid, group in targets}
    for pid, (_, group) in starts.items():
        system.kill(pid, signal.SIGTERM, group)
    deadline = grace
    while deadline > 0 and any(system.starttime(p) == s for p, (s, _) in starts.items()):
        system.sleep(0.05)
        deadline -= 0.05
    for pid, (start, group) in starts.items():
        if start is not None and system.starttime(pid) == start:
            system.kill(pid, signal.SIGKILL, group)


def _strays(state: RunState, system: System, exclude: set[int]) -> list[tuple[str, int, bool]]:
    """Processes inside a recorded GPU namespace that are not recorded themselves."""
    inodes = {h.netns: h for h in state.hosts.values() if h.netns is not None}
    if not inodes:
        return []
    strays = []
    for pid in system.pids():
        if pid in exclude or pid == os.getpid():
            continue
        inode = system.netns_inode(pid)
        host = inodes.get(inode) if inode is not None else None
        if host is None:
            continue
        # The inode alone could be a recycled number: the interfaces must match as well.
        if host.intfs and not set(host.intfs) <= system.net_devices(pid):
            continue
        strays.append((f"{host.name}:{pid}", pid, False))
    return strays


def clean_faults(state: RunState, system: System | None = None, grace: float = 2.0) -> CleanReport:
    """Remove what the run's fault record lists, and nothing else: the processes faults
    started (by pid and start time), the root namespace's nftables tables (by their
    unique names) and OpenFlow entries (by cookie, on bridges still tagged with this run).
    A GPU's tables go with its namespace, shapers and interface states with their
    interfaces. Safe to call again; part of :func:`clean`."""
    system = system or LinuxSystem()
    report = CleanReport()
    faults = FaultRecord(state.run_dir)
    if not faults.path.exists():
        return report
    entries = faults.entries()
    processes = [r for e in entries for r in e.resources if r.kind == "process"]
    alive = [
        (r.label(), r.pid, True)
        for r in processes + faults.kept()
        if r.pid is not None and _alive(system, r.pid, r.starttime)
    ]
    _stop(system, alive, grace)
    report.faults += [label for label, _, _ in alive]
    bridges_now = system.ovs_bridges() if entries else {}
    for entry in entries:
        errors: list[str] = []
        for resource in entry.resources:
            if resource.kind == "nft" and resource.node is None:
                errors += system.delete_nft_table(resource.name)
                report.faults.append(resource.label())
            elif (
                resource.kind == "openflow"
                and resource.cookie is not None
                and bridges_now.get(resource.name, {}).get(RUN_TAG) == state.run_id
            ):
                errors += system.delete_flows(resource.name, resource.cookie)
                report.faults.append(resource.label())
        report.errors += errors
        if not errors:
            faults.remove(entry.id)
    faults.forget_kept()
    return report


def clean(
    state: RunState, system: System | None = None, grace: float = 2.0, settle: float = 15.0
) -> CleanReport:
    """Remove exactly what ``state`` records; safe to call again (and from any process)."""
    system = system or LinuxSystem()
    report = CleanReport()
    # A record cleaned before: its namespaces are gone and their inode numbers may belong
    # to another run's namespaces now, with the same interface names (the same fabric):
    # never look for strays in them.
    cleaned_before = state.status == "clean"
    if not cleaned_before:
        state.set_status("tearing-down")

    # 0. What faults added (the fault record): a controller they restarted, nftables
    #    tables in the root namespace, OpenFlow entries.
    report.merge(clean_faults(state, system, grace))

    # 1. Processes: recorded ones (only if the pid still has its recorded start time), then
    #    strays inside our namespaces. Host shells go last among the recorded ones: while
    #    they live, their namespaces (and so the stray search) stay valid.
    recorded: list[tuple[str, int, bool]] = []
    for process in state.processes:
        if _alive(system, process.pid, process.starttime):
            recorded.append((process.name, process.pid, process.group))
        elif system.starttime(process.pid) is not None:
            report.skipped.append(f"pid {process.pid} ({process.name}: recycled)")
    hosts: list[tuple[str, int]] = []
    for host in state.hosts.values():
        if _alive(system, host.pid, host.starttime):
            assert host.pid is not None
            hosts.append((host.name, host.pid))
        elif host.pid is not None and system.starttime(host.pid) is not None:
            report.skipped.append(f"pid {host.pid} ({host.name}: recycled)")
    exclude = {pid for _, pid, _ in recorded} | {pid for _, pid in hosts}
    strays = [] if cleaned_before else _strays(state, system, exclude)
    _stop(system, recorded + strays, grace)
    for _, pid in hosts:  # shells: nothing to save, SIGKILL at once
        system.kill(pid, signal.SIGKILL)
    report.killed += [f"{name} ({pid})" for name, pid, _ in recorded + strays]
    report.killed += [f"{name} ({pid})" for name, pid in hosts]

    # 2. OVS bridges carrying our tag (a bridge of the same name without it is not ours).
    #    ovs-vswitchd removes their ports one by one (tens of ms each on the userspace
    #    datapath); step 3 runs meanwhile, and step 4 waits for it.
    ovs = [b["name"] for b in state.bridges if b["kind"] == "ovs"]
    ours: list[str] = []
    wait_for_ovs: Callable[[], list[str]] = list
    if ovs:
        existing = system.ovs_bridges()
        for name in ovs:
            if name not in existing:
                continue
            if existing[name].get(RUN_TAG) == state.run_id:
                ours.append(name)
            else:
                report.skipped.append(f"bridge {name} (not tagged {RUN_TAG}={state.run_id})")
        wait_for_ovs = system.delete_ovs_bridges(ours)
        report.bridges += ours

    # 3. Interfaces: root veth ends, Linux bridges and (userspace datapath) the OVS bridges'
    #    tap devices. They share a device group, so the kernel deletes them all in one
    #    operation, if the group holds nothing else; anything left goes one by one.
    links = system.links()
    linux = [b["name"] for b in state.bridges if b["kind"] == "linux" and b["name"] in links]
    veths = [name for name in state.interfaces if name in links]
    taps = [name for name in ours if name in links]
    ours_by_kernel = set(veths) | set(linux) | set(taps)
    if state.link_group is not None and ours_by_kernel:
        members = system.link_group_members(state.link_group)
        strangers = members - set(state.interfaces) - {b["name"] for b in state.bridges}
        if members and not strangers:
            report.errors += system.delete_link_group(state.link_group)
        elif strangers:
            report.skipped += [f"interface {n} (in our device group, not ours)" for n in strangers]
    remaining = system.links()
    report.errors += system.delete_links([n for n in veths + linux if n in remaining])
    report.bridges += linux
    report.interfaces += veths
    report.qdiscs += [name for name in state.qdiscs if name in links]

    # 4. Wait until ovs-vswitchd and the kernel are done: a name still present would make
    #    the next run's preflight refuse to start.
    report.errors += wait_for_ovs()
    waited = 0.0
    pending = [n for n in veths + linux + taps if n in system.links()]
    while pending and waited < settle:
        system.sleep(0.05)
        waited += 0.05
        current = system.links()
        pending = [n for n in pending if n in current]
    if pending:
        report.errors.append("still present after deletion: " + ", ".join(pending[:12]))

    if not report.errors:
        state.set_status("clean")
    return report


def unclean_runs(base: Path | None = None) -> list[RunState]:
    """Records of runs that did not finish cleaning up, oldest first."""
    found = []
    directory = runs_dir(base)
    if not directory.is_dir():
        return []
    for run_dir in sorted(directory.iterdir()):
        if not (run_dir / STATE_FILE).is_file():
            continue
        try:
            state = RunState.load(run_dir)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if state.status != "clean":
            found.append(state)
    return found


def unreadable_runs(base: Path | None = None) -> list[tuple[Path, str]]:
    """Records that exist but cannot be read or are not a record (each file and what is
    wrong), oldest first: what :func:`unclean_runs` leaves out, and what their runs left
    behind is unknown, so ``astral clean`` reports them instead of saying all is clean."""
    found = []
    directory = runs_dir(base)
    if not directory.is_dir():
        return []
    for run_dir in sorted(directory.iterdir()):
        path = run_dir / STATE_FILE
        if not path.is_file():
            continue
        try:
            RunState.load(run_dir)
        except (OSError, ValueError, KeyError, TypeError) as err:
            text = str(err) if isinstance(err, ValueError) and str(path) in str(err) else None
            found.append((path, _after(text, f"{path}: ") if text else _describe(err)))
    return found


def unreadable_record_warnings(base: Path | None = None) -> list[str]:
    """A warning per run record under ``base`` (default the state dir) that cannot be read:
    a bring-up cleans up after the readable ones only, so what an unreadable one's run left
    (bridges, links, processes) stays, and the user must hear which file and why."""
    try:
        found = unreadable_runs(base)
    except OSError as err:  # the records' directory itself
        return [f"WARNING: cannot read the run records in {runs_dir(base)}: {err.strerror}"]
    return [
        f"WARNING: unreadable run record {path}: {problem} (skipped: what its run left is "
        "unknown; `astral clean` reports it, remove what it names by hand)"
        for path, problem in found
    ]


def _after(text: str, prefix: str) -> str:
    return text[len(prefix) :] if text.startswith(prefix) else text


def _describe(err: Exception) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"not JSON ({err.msg}, line {err.lineno})"
    if isinstance(err, OSError):
        return f"cannot be read ({err.strerror or err})"
    return f"not a run record ({type(err).__name__}: {err})"


def live_runs(base: Path | None = None) -> list[RunState]:
    """Records of fabrics up right now (status ``up``, their owner still running), oldest
    first: what ``astral fault`` acts on."""
    return [
        state
        for state in unclean_runs(base)
        if state.status == "up" and _alive(LinuxSystem(), state.owner_pid, state.owner_starttime)
    ]


def prune_runs(base: Path | None = None, keep: int = KEEP_CLEAN_RUNS) -> list[Path]:
    """Delete the directories of all but the ``keep`` newest clean runs."""
    directory = runs_dir(base)
    if not directory.is_dir():
        return []
    clean_dirs = []
    for run_dir in sorted(directory.iterdir()):
        try:
            if RunState.load(run_dir).status == "clean":
                clean_dirs.append(run_dir)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    doomed = clean_dirs[:-keep] if keep else clean_dirs
    for run_dir in doomed:
        shutil.rmtree(run_dir, ignore_errors=True)
    return doomed
