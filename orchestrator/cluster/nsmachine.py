"""A second machine on this host: namespaces with their own sshd and Open vSwitch.

Multi-machine runs reach their machines over SSH and give each its own Open vSwitch. To
test them on one host, :class:`NamespaceMachine` makes a machine out of a network namespace
and a mount namespace, reached from the root namespace over a veth pair:

- a *holder* process (``unshare --net --mount``, then ``sleep``) keeps both namespaces
  alive; everything else enters them with ``nsenter -t HOLDER -n -m``. Before it sleeps it
  mounts a ``/run`` of its own (a tmpfs: sshd's privilege separation directory and ``ip
  netns``'s names are then the machine's, and nothing on the host can remove them from
  under it), then bind-mounts private directories under the machine's directory over
  Open vSwitch's run, configuration, log and database directories and over the project's
  state directory
  (``/run/astral``), so that the machine's daemons, their sockets and pid files, and a
  run's record and lock are its own, where the host's tools cannot reach them and the
  machine's tools reach nothing else. It also mounts a sysfs of its own over ``/sys`` (as
  ``ip netns exec`` does): sysfs shows the network devices of the namespace that mounted
  it, so without that ``/sys/class/net`` inside would list the host's interfaces (the
  host's cgroup mounts are moved onto the new sysfs, so they stay where they were).
  ``/proc`` needs nothing: ``/proc/net`` and ``/proc/sys/net`` follow the reader's
  namespace. Propagation is private: none of these mounts is seen by the host.
- a veth pair (``ast<name>-h`` here, ``ast<name>-m`` there) on the first of a few /30s of
  172.31.0.0/16 that no route of the host's overlaps (the fabric uses 10.0.0.0/8), with an
  MTU of 9000 so that tunnels across it have room for their headers;
- ``ovsdb-server`` and ``ovs-vswitchd`` started as ovs-ctl starts the host's (same log
  levels, ``--no-chdir``, nice -10, a raised file limit, userspace TSO enabled as setup.sh
  does), except: no ``--monitor`` (a monitor would restart a daemon that teardown stops),
  no ``--mlockall`` (a second ovs-vswitchd pinning all its memory helps nothing on a shared
  host), no SSL options (nothing here uses SSL) and no syslog (the logs stay in the
  machine's directory);
- ``sshd`` listening on the machine's address, port 22 (its own namespace), root by key
  only, with forwarding and tunnels allowed; its host key is written into ``known_hosts``
  beforehand, so that a client checks it strictly instead of trusting it on first use.

Leaving the ``with`` block (or an ``__enter__`` that fails half way) stops sshd and every
session it forked, both OVS daemons, any other process in the network namespace, then the
holder; deletes the veth pair; and removes the mount points it created on the host (none
of the mounts exists outside the namespace). The
machine's directory, with its keys and logs, is left to the caller.

:func:`keygen`, :func:`children` and :func:`descendants` are also what the loopback sshd of
the remote tests uses.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import resource
import select
import shlex
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from orchestrator import REPO
from orchestrator.emulation.state import DEFAULT_STATE_DIR, STATE_DIR_ENV, proc_starttime
from orchestrator.remote.hostkeys import known_name
from topologies.errors import EnvironmentProblem

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it
RUN_DIR = Path("/run")
OVS_SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
OVS_RUN_DIR = Path("/run/openvswitch")
OVS_RUN_DIR_VAR = Path("/var/run/openvswitch")  # the same directory where /var/run -> /run
OVS_ETC_DIR = Path("/etc/openvswitch")
OVS_LOG_DIR = Path("/var/log/openvswitch")
OVS_LIB_DIR = Path("/var/lib/openvswitch")  # bound over only where the host has it
OVS_LOG_LEVELS = ("-vconsole:emer", "-vsyslog:off", "-vfile:info")
OVS_MAX_FILES = 65535  # ovs-ctl's: a few descriptors per bridge and per port
OVS_NICE = -10  # ovs-ctl's priority for both daemons
MTU = 9000
SSH_PORT = 22
# /30s tried in turn: 172.31.0.0/16 is private, far from the fabric's 10.0.0.0/8 and from
# Docker's and libvirt's defaults (172.17.0.0/16, 192.168.122.0/24).
ROUTE_TYPES = {
    "unicast", "local", "broadcast", "multicast", "anycast",
    "blackhole", "unreachable", "prohibit", "throw", "nat",
}  # fmt: skip
CANDIDATE_NETWORKS = tuple(ipaddress.IPv4Network(f"172.31.{n}.0/30") for n in range(251, 255))
NAME = re.compile(r"[a-z][a-z0-9]{0,9}")  # "ast" + name + "-h" fits IFNAMSIZ (15)
# Variables that would point a tool inside at the host's daemons or run records.
HOST_ONLY_ENV = re.compile(rf"OVS_[A-Z]+DIR|{STATE_DIR_ENV}")
START_TIMEOUT = 10.0  # seconds for one step of the bring-up
STOP_TIMEOUT = 10.0  # seconds a process gets to exit on SIGTERM before SIGKILL
GONE_TIMEOUT = 60.0  # ... and to disappear after SIGKILL (blocked in the kernel on a busy host)


def sshd_config(
    port: int,
    address: str,
    host_key: Path,
    pid_file: Path,
    authorized_keys: Path,
    extra: Sequence[str] = (),
) -> str:
    """An ``sshd_config`` for a test server of ours: root by key only (no password, no
    keyboard-interactive, no PAM), on one address and port, SFTP in-process; ``extra``:
    more lines (forwarding, tunnels)."""
    lines = [
        f"Port {port}",
        f"ListenAddress {address}",
        f"HostKey {host_key}",
        f"PidFile {pid_file}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "AllowUsers root",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "PrintMotd no",
        *extra,
        "Subsystem sftp internal-sftp",
        "LogLevel VERBOSE",
    ]
    return "\n".join(lines) + "\n"


def keygen(path: Path, comment: str) -> None:
    """An ed25519 key pair without passphrase at ``path`` and ``path.pub`` (replaced)."""
    for stale in (path, path.with_name(path.name + ".pub")):
        stale.unlink(missing_ok=True)  # ssh-keygen would ask before overwriting
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: its children, theirs, and so on."""
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


def netns_id(pid: int) -> tuple[int, int] | None:
    """The network namespace of ``pid`` (device and inode of /proc/PID/ns/net), or None
    when there is no such process."""
    try:
        stat = os.stat(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def processes_in(namespace: tuple[int, int]) -> list[int]:
    """Every process whose network namespace is ``namespace``."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and netns_id(int(entry.name)) == namespace
    ]


def route_destinations(routes: str) -> list[ipaddress.IPv4Network]:
    """The destinations of ``ip -4 route show table all`` (``default`` left out: every
    private range is under it), whatever the route's type (``local``, ``broadcast``...)."""
    found = []
    for line in routes.splitlines():
        words = line.split()
        if words and words[0] in ROUTE_TYPES:
            words = words[1:]
        if not words or words[0] == "default":
            continue
        with contextlib.suppress(ValueError):
            found.append(ipaddress.IPv4Network(words[0], strict=False))
    return found


def free_network(
    taken: Iterable[ipaddress.IPv4Network],
    candidates: Sequence[ipaddress.IPv4Network] = CANDIDATE_NETWORKS,
) -> ipaddress.IPv4Network | None:
    """The first of ``candidates`` that overlaps none of ``taken``, or None."""
    taken = list(taken)
    for candidate in candidates:
        if not any(candidate.overlaps(network) for network in taken):
            return candidate
    return None


def machine_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for processes inside: this one without what points at the host's
    OVS directories or run records (inside, the defaults are the machine's own)."""
    return {key: value for key, value in environ.items() if not HOST_ONLY_ENV.fullmatch(key)}


def _signal(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` runs, at most ``timeout`` seconds; those still running."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        # A zombie has exited: its parent (init, for daemons) reaps it when it will.
        left = [pid for pid in pids if proc_starttime(pid) is not None]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def _as_ovs_ctl_starts_daemons() -> None:
    """In the child before exec, what ovs-ctl does before starting a daemon: ``nice -n
    -10`` and ``ulimit -n 65535`` (never lowering it; where the hard limit may not be raised,
    a container without CAP_SYS_RESOURCE, up to it)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, OVS_NICE)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, OVS_MAX_FILES)
    for limits in ((want, max(hard, want)), (max(soft, min(want, hard)), hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        except (ValueError, OSError):
            continue
        return


class NamespaceMachine:
    """``with NamespaceMachine(directory) as machine:`` a second machine on this host.

    ``directory`` holds what is the machine's own: the directories bound over OVS's and the
    state directory, the keys, ``known_hosts``, sshd's configuration and every log. It is
    made if missing and never removed.
    """

    def __init__(self, directory: Path, name: str = "m2") -> None:
        if not NAME.fullmatch(name):
            raise ValueError(f"machine name {name!r}: expected 1 to 10 of [a-z0-9], a letter first")
        self.directory = directory
        self.name = name
        self.host_interface = f"ast{name}-h"
        self.machine_interface = f"ast{name}-m"
        self.mtu = MTU
        self.port = SSH_PORT
        self.network: ipaddress.IPv4Network | None = None
        self.host_key = directory / "ssh" / "host_ed25519"
        self.client_key = directory / "ssh" / "client_ed25519"
        self.known_hosts = directory / "ssh" / "known_hosts"
        self.sshd_config = directory / "ssh" / "sshd_config"
        self.sshd_log = directory / "ssh" / "sshd.log"
        self.ovs_dir = directory / "ovs"
        # (private directory, where it is bound inside)
        self.binds: list[tuple[Path, Path]] = [
            (self.ovs_dir / "run", OVS_RUN_DIR),
            (self.ovs_dir / "etc", OVS_ETC_DIR),
            (self.ovs_dir / "log", OVS_LOG_DIR),
            (directory / "astral", DEFAULT_STATE_DIR),
        ]
        if OVS_LIB_DIR.is_dir():
            self.binds.append((self.ovs_dir / "lib", OVS_LIB_DIR))
        if OVS_RUN_DIR_VAR.resolve() != OVS_RUN_DIR:  # /var/run is no symlink to /run here
            self.binds.append((self.ovs_dir / "run", OVS_RUN_DIR_VAR))
        self.holder: subprocess.Popen[bytes] | None = None
        self.sshd: subprocess.Popen[bytes] | None = None
        self._namespace: tuple[int, int] | None = None
        self._made_dirs: list[Path] = []  # on the host, to remove (if empty) on exit
        self._made_veth = False

    # -- what callers use ----------------------------------------------------------------

    @property
    def address(self) -> str:
        """The machine's IPv4 address on the veth (``172.31.251.2``)."""
        return str(self._network()[2])

    @property
    def host_address(self) -> str:
        """The root namespace's end (``172.31.251.1``)."""
        return str(self._network()[1])

    @property
    def holder_pid(self) -> int:
        if self.holder is None:
            raise RuntimeError(f"machine {self.name} is not up")
        return self.holder.pid

    def exec(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = 60.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the machine (both namespaces) to its end, output captured. It
        starts in ``/`` (entering a mount namespace moves a process there), as root, with
        this process's environment less what names the host's OVS directories or state
        directory (:func:`machine_env`)."""
        return subprocess.run(
            self._inside(argv),
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            env=machine_env(),
        )

    def pids(self) -> list[int]:
        """Every process that lives in the machine's network namespace (the holder too)."""
        return processes_in(self._namespace) if self._namespace else []

    def inventory(self, path: Path, project: Path = REPO, name: str | None = None) -> Path:
        """An inventory file (docs/remote.md) naming this machine ``name`` (its own name by
        default): its address, root by the client key, its host key in ``known_hosts``."""
        lines = [
            "machines:",
            f"  {name or self.name}:",
            f"    host: {self.address}",
            f"    port: {self.port}",
            "    user: root",
            f"    key: {self.client_key}",
            f"    project: {project}",
            f"    known_hosts: {self.known_hosts}",
        ]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    # -- bring-up ------------------------------------------------------------------------

    def __enter__(self) -> NamespaceMachine:
        try:
            self._check_free()
            self._start_holder()
            self._add_veth()
            self._start_ovs()
            self._start_sshd()
        except BaseException:
            self._teardown()
            raise
        return self

    def _network(self) -> ipaddress.IPv4Network:
        if self.network is None:
            raise RuntimeError(f"machine {self.name} is not up")
        return self.network

    def _inside(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", "-t", str(self.holder_pid), "-n", "-m", "--", *argv]

    def _make_host_dir(self, path: Path) -> None:
        """``path`` made on the host if missing, with what is missing above it, each
        remembered for removal on exit."""
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir(mode=0o755)
            self._made_dirs.append(directory)

    def _check_free(self) -> None:
        """The interface names unused, a /30 no route overlaps, sshd and OVS installed."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for program in (SSHD, OVS_SCHEMA):
            if not program.exists():
                raise EnvironmentProblem(f"machine {self.name}: {program} is missing")
        for interface in (self.host_interface, self.machine_interface):
            if Path("/sys/class/net", interface).exists():
                raise EnvironmentProblem(
                    f"machine {self.name}: interface {interface} exists already (another "
                    "machine of that name, or one left by a killed process: ip link del it)"
                )
        routes = _run(["ip", "-4", "route", "show", "table", "all"]).stdout
        self.network = free_network(route_destinations(routes))
        if self.network is None:
            tried = ", ".join(map(str, CANDIDATE_NETWORKS))
            raise EnvironmentProblem(f"machine {self.name}: every network is routed ({tried})")

    def _start_holder(self) -> None:
        """The process that keeps the namespaces, after mounting what is private inside."""
        # A /run of its own, as a machine has: sshd's privilege separation directory, `ip
        # netns`'s names and the bound run directories below are then the machine's, and
        # another machine (or a test's sshd) removing the host's /run/sshd cannot break it.
        script = ["set -e", "mount -t tmpfs -o mode=0755 astral-machine-run /run"]
        script.append(f"mkdir -m 0755 {PRIVSEP_DIR}")
        for private, target in self.binds:
            private.mkdir(parents=True, exist_ok=True)
            if RUN_DIR in target.resolve().parents:
                script.append(f"mkdir -p {shlex.quote(str(target))}")
            else:
                self._make_host_dir(target)
            script.append(f"mount --bind {shlex.quote(str(private))} {shlex.quote(str(target))}")
        cgroup = self.directory / "cgroup"  # a mount point, only inside and only for a moment
        cgroup.mkdir(parents=True, exist_ok=True)
        moved = shlex.quote(str(cgroup))
        script += [
            f"if mountpoint -q /sys/fs/cgroup; then mount --rbind /sys/fs/cgroup {moved}; fi",
            "mount -t sysfs sysfs /sys",
            f"if mountpoint -q {moved}; then mount --move {moved} /sys/fs/cgroup; fi",
            "ip link set lo up",
            "echo ready",
            "exec sleep infinity",
        ]
        log = (self.directory / "holder.log").open("wb")
        with log:
            self.holder = subprocess.Popen(
                ["unshare", "--net", "--mount", "--propagation", "private", "--",
                 "sh", "-c", "\n".join(script)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
            )  # fmt: skip
        assert self.holder.stdout is not None
        with self.holder.stdout as out:
            ready, _, _ = select.select([out], [], [], START_TIMEOUT)
            line = out.readline() if ready else b""
        if line != b"ready\n":
            raise EnvironmentProblem(
                f"machine {self.name}: its namespaces could not be set up; see "
                f"{self.directory / 'holder.log'}"
            )
        self._namespace = netns_id(self.holder.pid)

    def _add_veth(self) -> None:
        network = self._network()
        prefix = network.prefixlen
        _run(
            ["ip", "link", "add", self.host_interface, "mtu", str(self.mtu), "type", "veth",
             "peer", "name", self.machine_interface, "mtu", str(self.mtu),
             "netns", str(self.holder_pid)]
        )  # fmt: skip
        self._made_veth = True
        _run(
            ["ip", "-batch", "-"],
            input=(
                f"addr add {self.host_address}/{prefix} dev {self.host_interface}\n"
                f"link set {self.host_interface} up\n"
            ),
        )
        self.exec(
            ["ip", "-batch", "-"],
            input=(
                f"addr add {self.address}/{prefix} dev {self.machine_interface}\n"
                f"link set {self.machine_interface} up\n"
            ),
        )

    def _start_ovs(self) -> None:
        """ovsdb-server on a new database, its settings, then ovs-vswitchd; both answering.

        Inside, the default paths are the machine's (its directories are bound over them),
        so the daemons are named by the usual paths and ``ovs-vsctl`` needs no option."""
        database = self.ovs_dir / "etc" / "conf.db"
        database.unlink(missing_ok=True)
        _run(["ovsdb-tool", "create", str(database), str(OVS_SCHEMA)])
        for stale in (self.ovs_dir / "run").glob("*"):
            stale.unlink()  # pid files and sockets of an earlier machine in this directory
        common = ["--no-chdir", *OVS_LOG_LEVELS, "--detach"]
        self._start_daemon(
            "ovsdb-server",
            [
                str(OVS_ETC_DIR / "conf.db"),
                f"--remote=punix:{OVS_RUN_DIR / 'db.sock'}",
                "--remote=db:Open_vSwitch,Open_vSwitch,manager_options",
                *common,
            ],
        )
        self.exec(
            [
                "ovs-vsctl", "--no-wait", "init", "--", "set", "Open_vSwitch", ".",
                "other_config:userspace-tso-enable=true",
                f"external_ids:system-id={uuid.uuid4()}",
                f"external_ids:hostname={self.name}",
                f"external_ids:rundir={OVS_RUN_DIR}",
            ]
        )  # fmt: skip
        self._start_daemon("ovs-vswitchd", [f"unix:{OVS_RUN_DIR / 'db.sock'}", *common])
        for check in (
            ["ovs-vsctl", "--timeout=20", "show"],
            ["ovs-appctl", "--timeout=20", "-t", "ovs-vswitchd", "version"],
        ):
            result = self.exec(check, check=False, timeout=30)
            if result.returncode != 0:
                raise EnvironmentProblem(
                    f"machine {self.name}: `{shlex.join(check)}` failed inside: "
                    f"{result.stderr.strip()}; see {self.directory / 'ovs' / 'log'}"
                )

    def _start_daemon(self, daemon: str, argv: list[str]) -> None:
        full = [
            daemon,
            *argv,
            f"--log-file={OVS_LOG_DIR / (daemon + '.log')}",
            f"--pidfile={OVS_RUN_DIR / (daemon + '.pid')}",
        ]
        # --detach returns once the daemon is ready, its standard streams closed.
        result = subprocess.run(
            self._inside(full),
            capture_output=True,
            text=True,
            check=False,
            timeout=START_TIMEOUT * 3,
            env=machine_env(),
            preexec_fn=_as_ovs_ctl_starts_daemons,
        )
        if result.returncode != 0:
            raise EnvironmentProblem(
                f"machine {self.name}: {daemon} did not start: {result.stderr.strip()}; see "
                f"{self.directory / 'ovs' / 'log' / (daemon + '.log')}"
            )

    def _start_sshd(self) -> None:
        ssh = self.host_key.parent
        ssh.mkdir(parents=True, exist_ok=True)
        keygen(self.host_key, f"astral-{self.name}-host")
        keygen(self.client_key, f"astral-{self.name}-client")
        authorized = ssh / "authorized_keys"
        authorized.write_text(Path(f"{self.client_key}.pub").read_text(), encoding="ascii")
        kind, key = Path(f"{self.host_key}.pub").read_text(encoding="ascii").split()[:2]
        self.known_hosts.write_text(
            f"{known_name(self.address, self.port)} {kind} {key}\n", encoding="ascii"
        )
        self.sshd_config.write_text(
            sshd_config(
                self.port,
                self.address,
                self.host_key,
                ssh / "sshd.pid",
                authorized,
                extra=(
                    "UseDNS no",
                    "PermitTunnel yes",
                    "AllowTcpForwarding yes",
                    "AllowStreamLocalForwarding yes",
                    "StreamLocalBindUnlink yes",
                ),
            ),
            encoding="ascii",
        )
        log = self.sshd_log.open("ab")
        with log:
            self.sshd = subprocess.Popen(
                self._inside([str(SSHD), "-D", "-e", "-f", str(self.sshd_config)]),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=machine_env(),
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and self.sshd.poll() is None:
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.address, self.port), timeout=1),
            ):
                return
            time.sleep(0.02)
        raise EnvironmentProblem(f"machine {self.name}: sshd did not start; see {self.sshd_log}")

    # -- teardown ------------------------------------------------------------------------

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._teardown()

    def _teardown(self) -> None:
        """Everything :meth:`__enter__` made, in reverse, each step whatever the others did."""
        steps = (
            self._stop_sshd,
            self._stop_ovs,
            self._stop_the_rest,
            self._delete_veth,
            self._stop_holder,
            self._remove_made_dirs,
        )
        errors: list[BaseException] = []
        for step in steps:
            try:
                step()
            except Exception as error:  # one failed step must not leave the others' things
                errors.append(error)
        if errors:
            raise errors[0]

    def _stop_sshd(self) -> None:
        if self.sshd is None:
            return
        sessions = descendants(self.sshd.pid)
        self.sshd.terminate()
        try:
            self.sshd.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.sshd.kill()
            self.sshd.wait()
        _signal(sessions, signal.SIGKILL)
        _wait_gone(sessions, GONE_TIMEOUT)
        self.sshd = None

    def _stop_ovs(self) -> None:
        """Both daemons by their pid files, ovs-vswitchd first: SIGTERM (they exit cleanly,
        removing their pid files and sockets), SIGKILL if they have not within a while."""
        for daemon in ("ovs-vswitchd", "ovsdb-server"):
            pid_file = self.ovs_dir / "run" / f"{daemon}.pid"
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            if self._namespace is None or netns_id(pid) != self._namespace:
                continue  # gone already, and the pid maybe someone else's by now
            self._stop([pid])

    def _stop_the_rest(self) -> None:
        """Whatever else lives in the network namespace (sessions' leftovers, a caller's)."""
        if self.holder is not None:
            self._stop([pid for pid in self.pids() if pid != self.holder.pid])

    def _stop(self, pids: list[int]) -> None:
        _signal(pids, signal.SIGTERM)
        left = _wait_gone(pids, STOP_TIMEOUT)
        _signal(left, signal.SIGKILL)
        _wait_gone(left, GONE_TIMEOUT)

    def _delete_veth(self) -> None:
        if self._made_veth and Path("/sys/class/net", self.host_interface).exists():
            _run(["ip", "link", "del", self.host_interface])  # its peer goes with it
        self._made_veth = False

    def _stop_holder(self) -> None:
        if self.holder is None:
            return
        self.holder.kill()
        self.holder.wait()
        self.holder = None
        # The namespaces went with their last process; so did every mount in them.
        self._namespace = None

    def _remove_made_dirs(self) -> None:
        for path in reversed(self._made_dirs):
            with contextlib.suppress(OSError):  # not empty: someone else's now
                path.rmdir()
        self._made_dirs = []


def _run(argv: Sequence[str], *, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """A command on the host, its output captured; failure raises with its stderr."""
    result = subprocess.run(argv, input=input, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise EnvironmentProblem(f"`{shlex.join(argv)}` failed: {result.stderr.strip()}")
    return result
