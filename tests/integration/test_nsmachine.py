"""The second machine on this host (orchestrator/cluster/nsmachine.py), for real.

One machine serves the module: reached over SSH with its host key checked strictly (the
OpenSSH client and the project's own paramiko connection), its Open vSwitch and its state
directory its own, its sysfs showing its own interfaces, pings across the veth at its MTU.
Two more, brought up and down within their tests (a tenth of a second each), show that
leaving the ``with`` block, normally or from an ``__enter__`` that failed half way, leaves
nothing behind: no process, interface, mount, bridge or directory of its making.

Needs root and Open vSwitch (tests/conftest.py). Machine names of their own (``nstest``...),
so that a developer's ``m2`` running alongside does not collide.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cluster.nsmachine import (
    PRIVSEP_DIR,
    NamespaceMachine,
    descendants,
    netns_id,
    processes_in,
)
from orchestrator.emulation.state import DEFAULT_STATE_DIR, proc_starttime
from orchestrator.remote.connection import Connection
from orchestrator.remote.inventory import load_inventory

pytestmark = pytest.mark.integration


def _out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def host_links() -> set[str]:
    return {
        line.split(":")[1].strip().split("@")[0] for line in _out(["ip", "-o", "link"]).splitlines()
    }


def host_mounts() -> set[str]:
    return set(_out(["findmnt", "-rn", "-o", "TARGET,SOURCE"]).splitlines())


def host_bridges() -> set[str]:
    return set(_out(["ovs-vsctl", "--timeout=20", "list-br"]).split())


def ssh_argv(machine: NamespaceMachine, known_hosts: Path, *command: str) -> list[str]:
    """The OpenSSH client, as strict as it gets: the key file, the known_hosts file, no
    prompt, an unknown host key refused."""
    return [
        "ssh", "-i", str(machine.client_key), "-p", str(machine.port),
        "-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
        f"root@{machine.address}", *command,
    ]  # fmt: skip


def ssh(
    machine: NamespaceMachine, known_hosts: Path, *command: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ssh_argv(machine, known_hosts, *command),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def ssh_popen(machine: NamespaceMachine, *command: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ssh_argv(machine, machine.known_hosts, *command),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def session_commands(sshd: int) -> list[str]:
    """The names of the processes sshd's sessions run now."""
    names = []
    for pid in descendants(sshd):
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return names


@dataclass(frozen=True)
class Snapshot:
    """What of the host's a machine could leave behind."""

    links: set[str]
    mounts: set[str]
    bridges: set[str]
    privsep: bool
    state_dir: bool

    @classmethod
    def take(cls) -> Snapshot:
        return cls(
            host_links(),
            host_mounts(),
            host_bridges(),
            PRIVSEP_DIR.exists(),
            DEFAULT_STATE_DIR.exists(),
        )


def assert_nothing_left(
    machine: NamespaceMachine, before: Snapshot, pids: list[int], namespace: tuple[int, int]
) -> None:
    after = Snapshot.take()
    # Other emulations may come and go meanwhile: what is new counts when it is ours (named
    # after the machine, or mounted from its directory).
    assert {link for link in after.links - before.links if machine.name in link} == set()
    assert {m for m in after.mounts - before.mounts if str(machine.directory) in m} == set()
    assert {bridge for bridge in after.bridges - before.bridges if machine.name in bridge} == set()
    assert (after.privsep, after.state_dir) == (before.privsep, before.state_dir)
    # exited (a zombie until init reaps it, which this VM's init does in its own time)
    assert [pid for pid in pids if proc_starttime(pid) is not None] == []
    assert processes_in(namespace) == []


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceMachine]:
    with NamespaceMachine(tmp_path_factory.mktemp("nsmachine"), name="nstest") as machine:
        yield machine


def test_ssh_logs_in_with_the_host_key_checked(machine: NamespaceMachine, tmp_path: Path) -> None:
    done = ssh(machine, machine.known_hosts, "readlink", "/proc/self/ns/net")
    assert done.returncode == 0, done.stderr
    holder_netns = Path(f"/proc/{machine.holder_pid}/ns/net").readlink()
    assert done.stdout.strip() == str(holder_netns)  # the session runs inside the machine
    # The same client without the recorded key is refused: the key is checked, not trusted.
    empty = tmp_path / "known_hosts"
    empty.touch()
    refused = ssh(machine, empty, "true")
    assert refused.returncode == 255
    assert "Host key verification failed" in refused.stderr


def test_the_project_connection_reaches_it_from_its_inventory(
    machine: NamespaceMachine, tmp_path: Path
) -> None:
    path = machine.inventory(tmp_path / "machines.yaml", project=tmp_path / "project")
    entry = load_inventory(path).machine(machine.name)
    assert (entry.host, entry.port, entry.user) == (machine.address, 22, "root")
    with Connection(entry) as connection:
        assert connection.accepted_key is None  # known already: nothing accepted
        assert connection.check(["ovs-vsctl", "get", "Open_vSwitch", ".", "external_ids:hostname"])
        assert connection.check(["ls", str(DEFAULT_STATE_DIR)]).split() == []


def test_its_open_vswitch_is_its_own(machine: NamespaceMachine) -> None:
    bridge = "nstestbr0"
    inside = set(machine.exec(["ovs-vsctl", "list-br"]).stdout.split())
    assert inside == set()  # none of the host's bridges
    tso = ["ovs-vsctl", "get", "Open_vSwitch", ".", "other_config:userspace-tso-enable"]
    assert machine.exec(tso).stdout.strip() == '"true"'  # as setup.sh sets the host's
    machine.exec(
        ["ovs-vsctl", "--timeout=20", "add-br", bridge,
         "--", "set", "bridge", bridge, "datapath_type=netdev"]
    )  # fmt: skip
    try:
        assert machine.exec(["ovs-vsctl", "list-br"]).stdout.split() == [bridge]
        assert bridge not in host_bridges()
        # ovs-vswitchd there made its interface, in the machine's namespace only
        assert bridge in machine.exec(["ip", "-o", "link"]).stdout
        assert bridge not in host_links()
    finally:
        machine.exec(["ovs-vsctl", "--timeout=20", "del-br", bridge])
    assert machine.exec(["ovs-vsctl", "list-br"]).stdout.split() == []


def test_its_state_directory_is_private(machine: NamespaceMachine) -> None:
    probe = "nstest-probe"
    machine.exec(["touch", str(DEFAULT_STATE_DIR / probe)])
    try:
        assert (machine.directory / "astral" / probe).exists()
        assert not (DEFAULT_STATE_DIR / probe).exists()
    finally:
        (machine.directory / "astral" / probe).unlink()


def test_its_sysfs_lists_its_own_interfaces(machine: NamespaceMachine) -> None:
    listed = set(machine.exec(["ls", "/sys/class/net"]).stdout.split())
    names = {
        line.split(":")[1].strip().split("@")[0]
        for line in machine.exec(["ip", "-o", "link"]).stdout.splitlines()
    }
    assert listed == names
    assert machine.machine_interface in listed and machine.host_interface not in listed


def test_ping_both_ways_at_the_mtu(machine: NamespaceMachine) -> None:
    assert machine.mtu == 9000
    jumbo = str(machine.mtu - 28)  # IPv4 and ICMP headers; -M do: no fragmenting
    _out(["ping", "-c", "1", "-W", "2", "-M", "do", "-s", jumbo, machine.address])
    machine.exec(["ping", "-c", "1", "-W", "2", "-M", "do", "-s", jumbo, machine.host_address])
    for where, interface in (
        (_out(["ip", "-o", "link", "show", machine.host_interface]), machine.host_interface),
        (
            machine.exec(["ip", "-o", "link", "show", machine.machine_interface]).stdout,
            machine.machine_interface,
        ),
    ):
        assert f"mtu {machine.mtu} " in where, interface


def test_exit_leaves_nothing(tmp_path: Path) -> None:
    before = Snapshot.take()
    with NamespaceMachine(tmp_path / "machine", name="nsgone") as gone:
        namespace = netns_id(gone.holder_pid)
        assert namespace is not None and gone.sshd is not None
        bridge = "nsgonebr0"
        gone.exec(
            ["ovs-vsctl", "--timeout=20", "add-br", bridge,
             "--", "set", "bridge", bridge, "datapath_type=netdev"]
        )  # fmt: skip
        # a session left open, and a process started inside that nobody stops
        session = ssh_popen(gone, "sleep", "600")
        stray = subprocess.Popen(
            ["nsenter", "-t", str(gone.holder_pid), "-n", "-m", "--", "sleep", "600"],
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 10
            while "sleep" not in session_commands(gone.sshd.pid):
                assert time.monotonic() < deadline, "the session's command did not start"
                time.sleep(0.05)
            pids = gone.pids() + descendants(gone.sshd.pid)
            assert {stray.pid, gone.holder_pid} <= set(pids)
        except BaseException:
            session.kill()
            stray.kill()
            raise
    try:
        assert_nothing_left(gone, before, pids, namespace)
        assert stray.wait(timeout=5) != 0  # killed
        assert session.wait(timeout=10) == 255  # the server went away under it
    finally:
        session.kill()
        stray.kill()


def test_a_failed_bring_up_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sshd fails to start after the namespaces, the veth and OVS are up."""
    before = Snapshot.take()
    seen: list[int] = []
    namespaces: list[tuple[int, int] | None] = []

    def broken_sshd(machine: NamespaceMachine) -> None:
        seen.extend(machine.pids())
        namespaces.append(netns_id(machine.holder_pid))
        raise RuntimeError("sshd: no")

    monkeypatch.setattr(NamespaceMachine, "_start_sshd", broken_sshd)
    failing = NamespaceMachine(tmp_path / "machine", name="nsfail")
    with pytest.raises(RuntimeError, match="sshd: no"), failing:
        pytest.fail("entered")
    assert len(seen) == 3  # the holder, ovsdb-server and ovs-vswitchd were up
    namespace = namespaces[0]
    assert namespace is not None
    assert_nothing_left(failing, before, seen, namespace)
