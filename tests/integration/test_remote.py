"""Remote runs against a real sshd on loopback (tests/integration/sshd.py starts it).

The "remote" machine is this one, reached over SSH on 127.0.0.1 as root by key, with its
project in a temporary directory that ``astral remote setup`` fills (once per module: it
makes that copy's own .venv, about a minute; the later set-up is the idempotent one). Then,
as a user would, through the ``astral`` command in subprocesses: a small run there with its
bundle fetched home; Ctrl-C here mid-run (torn down there: no run record, bridge, interface
or process left; what exists of the bundle fetched); a connection dropped mid-run (the run
finishes there and ``astral remote fetch`` gets it); host keys unknown (refused, then
accepted and recorded) and changed (refused, even with --accept-new-host-key); a wrong user;
a command that fails there; a server that goes silent (the idle timeout).

Needs root and Open vSwitch (tests/conftest.py). Runs there wait for the machine's run lock
like any other; a run refused with exit status 5 (another run holds it) is retried.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from orchestrator.emulation.state import RunState
from orchestrator.remote.hostkeys import known_name
from orchestrator.remote.jobs import JOBS_DIR
from orchestrator.results.store import ResultsBundle
from tests.helpers import REPO
from tests.integration.assertions import leftovers, snapshot
from tests.integration.sshd import LoopbackSshd, keygen
from topologies.description import FabricDescription

pytestmark = pytest.mark.integration

LOCK_WAIT = 600.0
RUN_WAIT = 300.0

TINY = """\
name: remote-tiny
fabric: astral-small
policies: [ecmp]
collectives: [{op: all-reduce, algorithm: ring}]
sizes: {min: 64K, max: 64K}
iterations: 1
warmup: 1
"""

# Long enough to be interrupted or cut off mid-run (tens of seconds), short to finish.
LONGER = """\
name: remote-longer
fabric: astral-small
policies: [ecmp, path-pinned]
collectives: [{op: all-reduce, algorithm: ring}]
sizes: {min: 64K, max: 1M}
iterations: 2
warmup: 1
"""

# Cut off right after it starts: one policy, two sizes are enough to still be running.
CUT_OFF = """\
name: remote-cut-off
fabric: astral-small
policies: [ecmp]
collectives: [{op: all-reduce, algorithm: ring}]
sizes: {min: 64K, max: 128K}
iterations: 1
warmup: 1
"""

# The shared machine may hold a calibration that refuses these loads; the remote side
# does not see the test session's $ASTRAL_CALIBRATION, so runs there are forced.
RUN_FLAGS = ("--no-calibrate", "--no-plots", "--force")


@dataclass
class Loopback:
    sshd: LoopbackSshd
    inventory: Path
    project: Path
    here: Path  # the working directory here: results/ is fetched into it
    setup: subprocess.CompletedProcess[str]


def astral(
    *args: str, inventory: Path, cwd: Path, timeout: float = RUN_WAIT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args, "--inventory", str(inventory)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopback]:
    base = tmp_path_factory.mktemp("remote")
    here = base / "here"
    here.mkdir()
    with LoopbackSshd(base / "sshd") as sshd:
        inventory = sshd.inventory(base / "machines.yaml", base / "project")
        setup = astral(
            "remote", "setup", "loopback", "--accept-new-host-key",
            inventory=inventory, cwd=here, timeout=900,
        )  # fmt: skip
        assert setup.returncode == 0, setup.stdout + setup.stderr
        yield Loopback(sshd, inventory, base / "project", here, setup)
        sessions = sshd.sessions()
    # a session's process ends once its client has gone, which may be a moment after the
    # last test (a busy machine: seconds); one that outlives that is a leak
    deadline = time.monotonic() + 15.0
    while [
        pid for pid in sessions if Path(f"/proc/{pid}").exists()
    ] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in sessions if Path(f"/proc/{pid}").exists()]


def run_there(
    loopback: Loopback, experiment: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "experiment.yaml"
    path.write_text(experiment)
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        result = astral(
            "run", str(path), "--on", "loopback", *RUN_FLAGS,
            inventory=loopback.inventory, cwd=loopback.here,
        )  # fmt: skip
        if result.returncode != 5 or time.monotonic() > deadline:
            return result
        time.sleep(2)


def job_of(output: str) -> str:
    match = re.search(r"as job (\S+) ", output)
    assert match, output
    return match.group(1)


def job_processes(project: Path, job: str, wait: float = 10.0) -> list[int]:
    """The job's supervisor and command processes still alive there after up to ``wait``
    seconds (the supervisor writes the status file a moment before it exits)."""
    deadline = time.monotonic() + wait
    while True:
        alive = []
        for name in ("pid", "child"):
            file = project / JOBS_DIR / job / name
            if file.exists() and _running(int(file.read_text())):
                alive.append(int(file.read_text()))
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- set-up and a run ------------------------------------------------------------------------


def test_setup_copies_the_tracked_files_and_is_idempotent(loopback: Loopback) -> None:
    first = loopback.setup
    assert "setup: ready in" in first.stdout
    assert "host key ssh-ed25519 SHA256:" in first.stderr  # accepted on first use...
    assert loopback.sshd.known_hosts.read_text().startswith(
        known_name("127.0.0.1", loopback.sshd.port)
    )  # ... and recorded
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    for name in tracked:
        if (REPO / name).is_file():
            assert (loopback.project / name).read_bytes() == (REPO / name).read_bytes(), name
    assert os.access(loopback.project / "setup.sh", os.X_OK)
    assert not (loopback.project / ".git").exists()  # no git needed there
    again = astral("remote", "setup", "loopback", inventory=loopback.inventory, cwd=loopback.here)
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r": 0 of \d+ tracked files sent", again.stderr), again.stderr
    assert "Python environment: up to date" in again.stdout


def test_a_small_run_there_streams_its_table_and_brings_the_bundle_home(
    loopback: Loopback, tmp_path: Path
) -> None:
    result = run_there(loopback, TINY, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# astral run 'remote-tiny': ok" in result.stdout  # the table, streamed here
    job = job_of(result.stderr)
    local = loopback.here / "results" / job
    assert f"bundle fetched from loopback: results/{job}" in result.stderr
    there = loopback.project / "results" / job
    names = sorted(p.relative_to(there) for p in there.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(local) for p in local.rglob("*") if p.is_file())
    assert (local / "results.sqlite").read_bytes() == (there / "results.sqlite").read_bytes()
    with ResultsBundle.open(local) as bundle:
        assert bundle.run.status == "ok"
        (configuration,) = bundle.configurations()
    assert configuration.size == 65536
    summary = json.loads((local / "summary.json").read_text())
    assert summary["configurations"][0]["wrong"] == 0
    assert job_processes(loopback.project, job) == []
    # fetched again later: the same bundle, nothing copied twice
    again = astral(
        "remote", "fetch", "loopback", job, inventory=loopback.inventory, cwd=loopback.here
    )
    assert again.returncode == 0, again.stderr
    assert "(0 files copied)" in again.stderr
    assert "# astral run 'remote-tiny': ok" in again.stdout  # its output, replayed


def test_a_study_there_brings_its_whole_bundle_home(loopback: Loopback, tmp_path: Path) -> None:
    """A study (orchestrator/study) runs there as here; its bundle comes home whole: the
    study's files and every variant's bundle."""
    study = TINY.replace("name: remote-tiny", "name: remote-study") + (
        "sweep: {host_ports: [balanced, hash]}\n"
    )
    result = run_there(loopback, study, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# study verdict" not in result.stdout  # it has no checks
    local = loopback.here / "results" / job_of(result.stderr)
    document = json.loads((local / "study.json").read_text())
    assert [v["status"] for v in document["variants"]] == ["ok", "ok"]
    for variant in document["variants"]:
        with ResultsBundle.open(local / variant["bundle"]) as bundle:
            assert bundle.run.status == "ok"
    assert (local / "report.txt").is_file() and (local / "summary.json").is_file()


def test_up_there_holds_and_tears_down(loopback: Loopback) -> None:
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        result = astral(
            "up", "--on", "loopback", "--hold", "0", inventory=loopback.inventory, cwd=loopback.here
        )
        if result.returncode != 5 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ready: 8 GPUs reach each other" in result.stdout
    assert "torn down in" in result.stderr


def test_a_command_that_fails_there_exits_with_its_status(loopback: Loopback) -> None:
    result = astral(
        "doctor", "--on", "loopback", "no-such-fabric.yaml",
        inventory=loopback.inventory, cwd=loopback.here,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no-such-fabric.yaml: expected an existing fabric file" in result.stderr


# -- Ctrl-C and a lost connection -----------------------------------------------------------


class Started:
    """``astral run EXP --on loopback`` in the background, once the fabric is up there."""

    def __init__(self, loopback: Loopback, experiment: Path, then: str | None = None) -> None:
        """``then``: after the fabric is up, also wait for a line matching it."""
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            # this attempt's own: a refused one (exit 5) had a job of its own
            self.lines: queue.Queue[str | None] = queue.Queue()
            self.output: list[str] = []
            self.process = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli", "run", str(experiment),
                 "--on", "loopback", *RUN_FLAGS, "--inventory", str(loopback.inventory)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=loopback.here,
            )  # fmt: skip
            assert self.process.stdout is not None
            threading.Thread(target=_pump, args=(self.process.stdout, self.lines)).start()
            self.run_dir = self._wait_for(r"fabric up in [\d.]+ s \((\S+)\)")
            if self.run_dir is not None:
                self.job = job_of("".join(self.output))
                if then is not None and self._wait_for(f"({then})") is None:
                    raise AssertionError(f"no {then!r} line:\n{self.text()}")
                return
            status = self.process.wait()
            if status != 5 or time.monotonic() > deadline:
                raise AssertionError(f"no run started there ({status}):\n{self.text()}")
            time.sleep(2)

    def _wait_for(self, pattern: str) -> str | None:
        deadline = time.monotonic() + RUN_WAIT
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                return None
            self.output.append(line)
            match = re.search(pattern, line)
            if match:
                return match.group(1)
        return None

    def finish(self, timeout: float = RUN_WAIT) -> int:
        status = self.process.wait(timeout=timeout)
        while (line := self.lines.get(timeout=10)) is not None:
            self.output.append(line)
        return status

    def text(self) -> str:
        return "".join(self.output)


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def test_ctrl_c_here_tears_down_there_and_fetches_what_exists(
    loopback: Loopback, tmp_path: Path
) -> None:
    experiment = tmp_path / "longer.yaml"
    experiment.write_text(LONGER)
    before = snapshot()
    # once the first table is out, so that the bundle has something to fetch
    started = Started(loopback, experiment, then=r"# all-reduce \(ring\), policy ecmp")
    started.process.send_signal(signal.SIGINT)
    status = started.finish()
    output = started.text()
    assert status == 130, output  # the run's own status there
    assert "SIGINT here: passing it to the run on loopback" in output
    state = RunState.load(Path(started.run_dir))
    assert state.status == "clean", output
    nodes = list(FabricDescription.read(state.run_dir / "fabric.json").fabric.nodes())
    assert leftovers(before, state, nodes) == []
    assert job_processes(loopback.project, started.job) == []
    local = loopback.here / "results" / started.job
    with ResultsBundle.open(local) as bundle:
        assert bundle.run.status == "interrupted"


def test_a_lost_connection_leaves_the_run_finishing_and_fetch_gets_it(
    loopback: Loopback, tmp_path: Path
) -> None:
    experiment = tmp_path / "cut-off.yaml"
    experiment.write_text(CUT_OFF)
    started = Started(loopback, experiment)
    loopback.sshd.drop_connections()
    status = started.finish(timeout=120)
    output = started.text()
    assert status == 8, output
    assert "connection lost" in output
    assert f"astral remote fetch loopback {started.job}" in output
    assert job_processes(loopback.project, started.job, wait=0) != []  # still running there
    fetched = astral(
        "remote", "fetch", "loopback", started.job,
        inventory=loopback.inventory, cwd=loopback.here,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert "# astral run 'remote-cut-off': ok" in fetched.stdout
    with ResultsBundle.open(loopback.here / "results" / started.job) as bundle:
        assert bundle.run.status == "ok"
        assert len(bundle.configurations()) == 2  # one policy x 64K, 128K
    assert job_processes(loopback.project, started.job) == []


# -- security and timeouts -----------------------------------------------------------------


def test_an_unknown_host_key_is_refused_until_accepted_and_then_recorded(
    loopback: Loopback, tmp_path: Path
) -> None:
    """A second sshd (a host key of its own) in front of the same set-up project."""
    setup_job = job_of_setup(loopback)
    with LoopbackSshd(tmp_path / "sshd") as other:
        inventory = other.inventory(tmp_path / "machines.yaml", loopback.project)
        fetch = ("remote", "fetch", "loopback", setup_job)
        refused = astral(*fetch, inventory=inventory, cwd=tmp_path)
        assert refused.returncode == 8
        assert "host key of [127.0.0.1]:" in refused.stderr and "is unknown" in refused.stderr
        assert "--accept-new-host-key" in refused.stderr
        assert not other.known_hosts.exists()  # nothing recorded without asking
        accepted = astral(*fetch, "--accept-new-host-key", inventory=inventory, cwd=tmp_path)
        assert accepted.returncode == 0, accepted.stderr
        assert "accepted and recorded in" in accepted.stderr
        assert "setup: ready in" in accepted.stdout  # the connection did go through
        recorded = other.known_hosts.read_text()
        host_key = Path(f"{other.host_key}.pub").read_text().split()[1]
        assert recorded.split() == [known_name("127.0.0.1", other.port), "ssh-ed25519", host_key]
        later = astral(*fetch, inventory=inventory, cwd=tmp_path)
        assert later.returncode == 0 and "accepted" not in later.stderr


def test_a_changed_host_key_is_refused_even_when_accepting_new_ones(
    loopback: Loopback, tmp_path: Path
) -> None:
    setup_job = job_of_setup(loopback)
    with LoopbackSshd(tmp_path / "sshd") as other:
        inventory = other.inventory(tmp_path / "machines.yaml", loopback.project)
        keygen(tmp_path / "impostor", "another machine")
        impostor = (tmp_path / "impostor.pub").read_text().split()
        line = f"{known_name('127.0.0.1', other.port)} {impostor[0]} {impostor[1]}\n"
        other.known_hosts.write_text(line)
        for extra in ((), ("--accept-new-host-key",)):
            refused = astral(
                "remote", "fetch", "loopback", setup_job, *extra, inventory=inventory, cwd=tmp_path
            )
            assert refused.returncode == 8
            assert "has CHANGED" in refused.stderr, refused.stderr
            assert "ssh-keygen -R" in refused.stderr
            assert refused.stdout == ""
        assert other.known_hosts.read_text() == line


def test_a_wrong_user_is_refused_by_name(loopback: Loopback, tmp_path: Path) -> None:
    inventory = tmp_path / "machines.yaml"
    text = loopback.inventory.read_text().replace("user: root", "user: nobody")
    inventory.write_text(text)
    refused = astral("doctor", "--on", "loopback", inventory=inventory, cwd=tmp_path)
    assert refused.returncode == 8
    assert "user 'nobody' was refused with the key" in refused.stderr


def test_a_silent_server_is_an_idle_timeout(loopback: Loopback, tmp_path: Path) -> None:
    """The server stops answering once a command runs there (its session processes
    stopped, as a network that drops everything would look): the next SFTP request of the
    follow loop waits timeouts.idle, then says so; the command there finishes anyway."""
    inventory = tmp_path / "machines.yaml"
    inventory.write_text(loopback.inventory.read_text() + "    timeouts: {idle: 3}\n")
    jobs = loopback.project / JOBS_DIR
    before = set(os.listdir(jobs))
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "doctor", "--on", "loopback",
         "--inventory", str(inventory)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until doctor runs there (its pid file written)
        started = [job for job in set(os.listdir(jobs)) - before if (jobs / job / "pid").exists()]
        if started:
            break
        time.sleep(0.02)
    time.sleep(1.0)  # the launcher has returned the pid: this side is following the job
    stopped = []
    for pid in loopback.sshd.sessions():
        with contextlib.suppress(ProcessLookupError):  # a short command's, just ended
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
    try:
        began = time.monotonic()
        out, err = process.communicate(timeout=60)
        waited = time.monotonic() - began
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert started and stopped
    assert process.returncode == 8, out + err
    assert "no answer within 3 s (timeouts.idle)" in err
    assert f"astral remote fetch loopback {started[0]}" in err
    assert waited >= 2.5
    status = jobs / started[0] / "status"
    deadline = time.monotonic() + 120
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    # doctor finished there (0, or 3 should a check FAIL on the shared machine)
    assert json.loads(status.read_text())["exit_status"] in (0, 3)


def job_of_setup(loopback: Loopback) -> str:
    return job_of(loopback.setup.stderr)
