"""The remote side's pure parts and its far-side process, without SSH.

The inventory's validation (every error names file and key), the parser of ``vagrant
ssh-config`` on the format Vagrant documents and prints, the known_hosts line written on
acceptance (checked against ``ssh-keygen`` itself), where files named on a command line go
there, and ``orchestrator/remote/job.py`` (the process a job is there) run for real on this
machine: exit status, output files, a forwarded SIGINT, the command timeout. The SSH parts
are tested against a real sshd in tests/integration/test_remote.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from orchestrator.remote import vagrant
from orchestrator.remote.hostkeys import fingerprint, known_name, record
from orchestrator.remote.inventory import DEFAULT_PROJECT, parse_inventory
from orchestrator.remote.jobs import check_job_id
from orchestrator.remote.operations import place
from tests.helpers import REPO
from topologies.errors import InventoryError, RemoteError

SOURCE = Path("/somewhere/machines.yaml")


def inventory(machine: dict[str, object]) -> object:
    return {"machines": {"lab": machine}}


def error_of(document: object) -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(document, SOURCE)
    return caught.value


# -- the inventory -------------------------------------------------------------------------


def test_a_machine_gets_its_defaults() -> None:
    machine = parse_inventory(inventory({"host": "lab1.example.org"}), SOURCE).machine("lab")
    endpoint = machine.endpoint()
    assert (endpoint.host, endpoint.port, endpoint.user, endpoint.key_file) == (
        "lab1.example.org", 22, "root", None,
    )  # fmt: skip
    assert machine.project == DEFAULT_PROJECT
    assert machine.known_hosts == Path("~/.ssh/known_hosts").expanduser()
    assert not machine.uses_sudo(endpoint)
    assert machine.timeouts.connect > 0 and machine.timeouts.idle > 0


def test_local_paths_are_relative_to_the_inventory_and_sudo_follows_the_user() -> None:
    machine = parse_inventory(
        inventory({
            "host": "10.0.0.5", "port": 2200, "user": "lab", "key": "keys/id",
            "known_hosts": "/etc/astral/known_hosts", "project": "/srv/astral",
            "timeouts": {"connect": 3, "idle": 4.5, "command": 60},
        }),
        SOURCE,
    ).machine("lab")  # fmt: skip
    assert machine.key_file == Path("/somewhere/keys/id")
    assert machine.known_hosts == Path("/etc/astral/known_hosts")
    assert machine.uses_sudo(machine.endpoint())
    assert (machine.timeouts.connect, machine.timeouts.idle, machine.timeouts.command) == (
        3.0, 4.5, 60.0,
    )  # fmt: skip


# (a machine, the key path its error names, what it says was expected); test_schema.py
# checks that the inventory's JSON Schema refuses them too
BAD_MACHINES: list[tuple[dict[str, object], str, str]] = [
    ({}, "machines.lab.host", "a host name or address"),
    ({"host": "h", "colour": 1}, "machines.lab.colour", "one of the keys"),
    ({"host": "h", "port": 0}, "machines.lab.port", "a port between 1 and 65535"),
    ({"host": "h", "port": "22"}, "machines.lab.port", "a port between 1 and 65535"),
    ({"host": "h; reboot"}, "machines.lab.host", "a host name or address"),
    ({"host": "h", "user": "root -oProxyCommand=x"}, "machines.lab.user", "a user name"),
    ({"host": "h", "project": "a; rm -rf ~"}, "machines.lab.project", "a path there"),
    ({"host": "h", "project": "$(reboot)"}, "machines.lab.project", "a path there"),
    ({"host": "h", "project": "../elsewhere"}, "machines.lab.project", "without '..'"),
    ({"host": "h", "project": "/"}, "machines.lab.project", "not '/'"),
    ({"host": "h", "project": "-rf"}, "machines.lab.project", "without '..'"),
    ({"host": "h", "password": "hunter2"}, "machines.lab.password", "no password"),
    ({"host": "h", "sudo": "yes"}, "machines.lab.sudo", "true or false"),
    ({"host": "h", "timeouts": {"idle": 0}}, "machines.lab.timeouts.idle", "seconds > 0"),
    ({"host": "h", "timeouts": {"slow": 1}}, "machines.lab.timeouts.slow", "one of the keys"),
    ({"vagrant": ".", "host": "h"}, "machines.lab.host", "beside 'vagrant'"),
    ({"host": "h", "vagrant_machine": "m"}, "machines.lab.vagrant_machine", "'vagrant: DIR'"),
]


@pytest.mark.parametrize(("machine", "key", "expected"), BAD_MACHINES)
def test_a_bad_machine_names_the_file_the_key_and_what_was_expected(
    machine: dict[str, object], key: str, expected: str
) -> None:
    error = error_of(inventory(machine))
    assert error.file == str(SOURCE)
    assert error.key == key
    assert expected in str(error)


def test_the_document_itself_is_checked() -> None:
    assert error_of([]).key == "" and "a mapping" in str(error_of([]))
    assert error_of({}).key == "machines"
    assert error_of({"machines": {"bad name": {"host": "h"}}}).key == "machines.bad name"


def test_an_unknown_machine_lists_the_known_ones() -> None:
    parsed = parse_inventory({"machines": {"a": {"host": "h"}, "b": {"host": "h"}}}, SOURCE)
    with pytest.raises(InventoryError, match=r"a machine it lists \(a, b\)"):
        parsed.machine("c")


def test_a_missing_inventory_file_says_which(tmp_path: Path) -> None:
    from orchestrator.remote.inventory import load_inventory

    with pytest.raises(InventoryError, match="no such file") as caught:
        load_inventory(tmp_path / "machines.yaml")
    assert caught.value.file == str(tmp_path / "machines.yaml")


def test_the_shipped_inventory_names_the_vagrant_vm() -> None:
    from orchestrator.remote.inventory import load_inventory

    machine = load_inventory(REPO / "machines.yaml").machine("vm")
    assert machine.vagrant == REPO
    assert machine.known_hosts == REPO / ".vagrant" / "known_hosts"
    assert machine.project == "/home/vagrant/astral-testbed"  # where the Vagrantfile puts it


# -- vagrant ssh-config ----------------------------------------------------------------------

# As `vagrant ssh-config` prints it (Vagrant's documentation, and Vagrant 2.3's output for a
# VirtualBox machine); the second block is a multi-machine Vagrantfile's.
SSH_CONFIG = """\
Host default
  HostName 127.0.0.1
  User vagrant
  Port 2222
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  PasswordAuthentication no
  IdentityFile /home/me/astral-testbed/.vagrant/machines/default/virtualbox/private_key
  IdentitiesOnly yes
  LogLevel FATAL
  PubkeyAcceptedKeyTypes +ssh-rsa
  HostKeyAlgorithms +ssh-rsa

Host web
  HostName 192.168.121.17
  User vagrant
  Port 22
  IdentityFile "/home/me/my vms/.vagrant/machines/web/libvirt/private_key"
"""


def test_vagrant_ssh_config_gives_address_port_user_and_key() -> None:
    config = vagrant.parse_ssh_config(SSH_CONFIG, "default", "test")
    assert config == vagrant.SshConfig(
        host="127.0.0.1",
        port=2222,
        user="vagrant",
        key_file=Path("/home/me/astral-testbed/.vagrant/machines/default/virtualbox/private_key"),
    )
    web = vagrant.parse_ssh_config(SSH_CONFIG, "web", "test")
    assert (web.host, web.port) == ("192.168.121.17", 22)
    assert web.key_file == Path("/home/me/my vms/.vagrant/machines/web/libvirt/private_key")


def test_vagrant_ssh_config_problems_are_sentences() -> None:
    single = SSH_CONFIG.split("\n\n")[0]
    assert vagrant.parse_ssh_config(single, None, "test").port == 2222
    with pytest.raises(RemoteError, match="several machines"):
        vagrant.parse_ssh_config(SSH_CONFIG, None, "test")
    with pytest.raises(RemoteError, match="no machine 'db'; it lists default, web"):
        vagrant.parse_ssh_config(SSH_CONFIG, "db", "test")
    with pytest.raises(RemoteError, match="no 'Host' block"):
        vagrant.parse_ssh_config("", None, "test")
    with pytest.raises(RemoteError, match="no Port"):
        vagrant.parse_ssh_config("Host x\n  HostName h\n  User u\n", None, "test")


def test_a_vagrant_machine_without_vagrant_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    machine = parse_inventory(inventory({"vagrant": "/tmp"}), SOURCE).machine("lab")
    with pytest.raises(RemoteError, match="'vagrant' is not on PATH"):
        machine.endpoint()


@pytest.mark.skipif(shutil.which("vagrant") is None, reason="vagrant is not installed here")
def test_real_vagrant_ssh_config(tmp_path: Path) -> None:
    """With Vagrant installed: $ASTRAL_VAGRANT_DIR (a directory whose VM is up) is parsed
    from Vagrant's real output; without a VM, the error says to 'vagrant up'."""
    directory = os.environ.get("ASTRAL_VAGRANT_DIR")
    if directory:
        config = vagrant.ssh_config(Path(directory))
        assert config.port > 0 and config.user and config.key_file is not None
        assert config.key_file.is_file()
        return
    shutil.copy(REPO / "Vagrantfile", tmp_path / "Vagrantfile")
    with pytest.raises(RemoteError, match="vagrant up"):
        vagrant.ssh_config(tmp_path)


# -- host keys, names, places ----------------------------------------------------------------


def test_an_accepted_key_is_one_known_hosts_line_ssh_keygen_reads(tmp_path: Path) -> None:
    key_file = tmp_path / "host"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True)
    key = paramiko.Ed25519Key.from_private_key_file(str(key_file))
    known = tmp_path / "ssh" / "known_hosts"
    record(known, known_name("127.0.0.1", 2222), key)
    record(known, known_name("lab1", 22), key)
    assert known.stat().st_mode & 0o777 == 0o600
    lines = known.read_text().splitlines()
    public = (tmp_path / "host.pub").read_text().split()
    assert lines == [f"[127.0.0.1]:2222 {public[0]} {public[1]}", f"lab1 {public[0]} {public[1]}"]
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-F", "[127.0.0.1]:2222", "-f", str(known)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert fingerprint(key).split()[1] in listed


def test_run_names_cannot_carry_shell_syntax() -> None:
    assert check_job_id("20261201T223000-default") == "20261201T223000-default"
    for bad in ("../../etc", "x; reboot", "$(id)", "-rf", ""):
        with pytest.raises(RemoteError, match="not a run name"):
            check_job_id(bad)


def test_files_named_on_the_command_line_go_to_plain_places(tmp_path: Path) -> None:
    inside = place(REPO / "experiments" / "default.yaml", "files/J")
    assert inside.there == "experiments/default.yaml"
    (tmp_path / "fabrics").mkdir()
    experiment = tmp_path / "mine.yaml"
    fabric = tmp_path / "fabrics" / "small.yaml"
    experiment.write_text("")
    fabric.write_text("")
    assert place(experiment, "files/J").there == "files/J/mine.yaml"
    assert place(fabric, "files/J", base=tmp_path).there == "files/J/fabrics/small.yaml"
    with pytest.raises(RemoteError, match="neither in this checkout nor under"):
        place(fabric, "files/J", base=tmp_path / "elsewhere")
    odd = tmp_path / "my experiment;.yaml"
    odd.write_text("")
    with pytest.raises(RemoteError, match="rename it"):
        place(odd, "files/J")


def test_a_run_there_carries_the_fabric_and_workload_files_its_experiment_names(
    tmp_path: Path,
) -> None:
    from orchestrator.commands.remote import experiment_uploads
    from orchestrator.run.experiment import load_experiment

    (tmp_path / "w").mkdir()
    workload = (REPO / "workloads" / "gpt3-like.yaml").read_text()
    (tmp_path / "w" / "mine.yaml").write_text(workload.replace("gpt3-like", "mine"))
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(
        "name: replay\nfabric: astral-small\npolicy: ecmp\nworkload: w/mine.yaml\n"
    )
    uploads = experiment_uploads(experiment, [load_experiment(experiment)], "files/J")
    assert [u.there for u in uploads] == [
        "files/J/exp.yaml",
        "topologies/presets/astral-small.yaml",  # in the checkout there already: same place
        "files/J/w/mine.yaml",  # where the experiment names it, relative to itself
    ]


# -- the far side's job process, run here ----------------------------------------------------

JOB = str(REPO / "orchestrator" / "remote" / "job.py")


def start_job(directory: Path, *command: str, timeout: float = 60) -> int:
    """job.py as jobs.py starts it there: it returns once the detached process is up."""
    done = subprocess.run(
        ["/usr/bin/python3", JOB, str(directory), str(directory.parent), f"{timeout:g}", *command],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return int(done.stdout)


def ended(directory: Path, wait: float = 30) -> dict[str, object]:
    deadline = time.monotonic() + wait
    while not (directory / "status").exists():
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.05)
    status: dict[str, object] = json.loads((directory / "status").read_text())
    return status


def test_a_job_runs_detached_and_records_its_output_and_status(tmp_path: Path) -> None:
    job = tmp_path / "job"
    pid = start_job(job, "sh", "-c", "echo out; echo err >&2; pwd; exit 3")
    assert int((job / "pid").read_text()) == pid
    assert os.getsid(pid) == pid  # a session of its own: an SSH session's end misses it
    status = ended(job)
    assert status["exit_status"] == 3 and status["timed_out"] is False
    assert (job / "stdout").read_text() == f"out\n{tmp_path}\n"
    assert (job / "stderr").read_text() == "err\n"


SIGINT_AWARE = """\
import signal, sys, time
def stop(signum, frame):
    print("tearing down", flush=True)
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
print("running", flush=True)
time.sleep(60)
"""


def test_sigint_to_a_job_reaches_its_command(tmp_path: Path) -> None:
    job = tmp_path / "job"
    pid = start_job(job, sys.executable, "-c", SIGINT_AWARE)
    deadline = time.monotonic() + 20
    while "running" not in ((job / "stdout").read_text() if (job / "stdout").exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(pid, signal.SIGINT)
    assert ended(job)["exit_status"] == 130
    assert (job / "stdout").read_text() == "running\ntearing down\n"


def test_a_job_past_its_timeout_is_stopped(tmp_path: Path) -> None:
    job = tmp_path / "job"
    start_job(job, "sleep", "30", timeout=0.5)
    status = ended(job)
    assert status["timed_out"] is True
    assert status["exit_status"] == 128 + signal.SIGTERM
