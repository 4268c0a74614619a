"""One fabric over two machines, for real: this one and a second made on it.

The second machine is :class:`~orchestrator.cluster.nsmachine.NamespaceMachine`: its own
network and mount namespaces, its own ``sshd`` (root by key, host key checked) and its own
Open vSwitch daemons and state directory, reached over a veth. ``astral`` is the same
checkout there (the machines share the file system), which is what ``astral remote setup``
makes on a real one.

- an experiment with ``cluster: [localhost, nstc]`` runs end to end: a direct all-to-all
  (every GPU to every other, across both machines) under path-pinned (whose source ports
  are chosen by asking each GPU's kernel, there too), every result verified (#wrong 0),
  every connection's path traced across both machines' switches, the bundle's ``run.json``
  holding the placement, each machine's part (its run record there, its clock offset) and
  its load; afterwards nothing of the run is left on either machine;
- ``astral fault`` from another terminal takes down a link of the other machine's share and
  a cut link (a tunnel end on each machine), and mends them;
- ``astral up --cluster`` killed with SIGKILL once ready: the other machine's part ends with
  its session and removes its share by itself; ``astral clean`` here removes this
  machine's and runs ``astral clean`` there; nothing is left on either;
- Mininet's CLI over both machines: a GPU there pings one here and the other way round.

Needs root, Open vSwitch and OpenSSH's server (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator import REPO
from orchestrator.cluster.nsmachine import SSHD, NamespaceMachine
from tests.integration.assertions import snapshot

pytestmark = pytest.mark.integration

MACHINE = "nstc"


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NamespaceMachine, Path]]:
    if not SSHD.exists():
        pytest.skip("no OpenSSH server (/usr/sbin/sshd) to make a second machine with")
    directory = tmp_path_factory.mktemp("cluster")
    with NamespaceMachine(directory / MACHINE, name=MACHINE) as second:
        inventory = second.inventory(directory / "machines.yaml", project=REPO)
        yield second, inventory


def astral(args: list[str], inventory: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ASTRAL_INVENTORY=str(inventory))
    argv = [sys.executable, "-m", "orchestrator.cli", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO, **kwargs)  # type: ignore[call-overload]


def second_bridges(machine: NamespaceMachine) -> set[str]:
    return set(machine.exec(["ovs-vsctl", "--timeout=20", "list-br"]).stdout.split())


def second_links(machine: NamespaceMachine) -> set[str]:
    out = machine.exec(["ip", "-o", "link", "show"]).stdout
    return {line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.splitlines()}


def worker_sockets(machine: NamespaceMachine) -> set[str]:
    """The sockets sshd made there for the workers' forwarded control channels."""
    out = machine.exec(["find", "/tmp", "-maxdepth", "1", "-name", "astral-*.sock"]).stdout
    return set(out.split())


def unfinished_runs(machine: NamespaceMachine | None) -> list[str]:
    """Run records whose status is not ``clean`` (the state directory of that machine)."""
    script = (
        "import json, pathlib\n"
        "for p in pathlib.Path('/run/astral/runs').glob('*/state.json'):\n"
        "    s = json.loads(p.read_text())\n"
        "    print(p.parent.name, s.get('status'))\n"
    )
    argv = ["python3", "-c", script]
    out = (
        machine.exec(argv).stdout
        if machine
        else subprocess.run(
            argv, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": ""}
        ).stdout
    )
    return [line for line in out.splitlines() if not line.endswith(" clean")]


def test_an_experiment_runs_across_two_machines(
    machine: tuple[NamespaceMachine, Path], tmp_path: Path
) -> None:
    second, inventory = machine
    before_here = snapshot()
    links_there = second_links(second)
    sockets_there = worker_sockets(second)
    experiment = {
        "name": "cluster",
        "fabric": "astral-small",
        "policies": ["path-pinned"],  # the sources' routes asked there (pinning)
        "collectives": ["all-to-all"],  # every GPU to every other: across both machines
        "sizes": {"min": "256K", "max": "256K"},
        "iterations": 1,
        "warmup": 1,
        "scale": 0.6e-4,
        "cluster": ["localhost", MACHINE],
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(experiment), encoding="utf-8")
    out = tmp_path / "bundle"
    done = astral(
        ["run", str(path), "--no-calibrate", "--no-plots", "--force", "--out", str(out)],
        inventory,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "over localhost, nstc" in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    cells = summary["configurations"]
    assert len(cells) == 1
    assert all(cell["wrong"] == 0 and cell["verified"] for cell in cells)
    run = json.loads((out / "run.json").read_text())
    cluster = run["cluster"]
    assert set(cluster["machines"]) == {"localhost", MACHINE}
    there = cluster["machines"][MACHINE]
    assert there["run_id"] and abs(there["clock_offset_s"]) < 0.05  # one host, one clock
    placement = cluster["placement"]
    assert placement["cut_count"] > 0 and cluster["tunnels"] == placement["cut_count"]
    assert {load["machine"] for load in cluster["loads"]} == {"localhost", MACHINE}
    held = {node: m for node, m in placement["where"].items()}
    traced = [t for t in run["path_traces"] if t["connections"]]
    assert traced and all(t["outcomes"] == {"traced": t["connections"]} for t in traced)
    assert set(held.values()) == {"localhost", MACHINE}
    # nothing left on either machine
    after_here = snapshot()
    assert after_here.bridges == before_here.bridges
    assert not {n for n in after_here.links - before_here.links if "-eth" in n}
    assert second_bridges(second) == set()
    assert second_links(second) == links_there
    assert worker_sockets(second) == sockets_there
    assert unfinished_runs(second) == []


def test_a_killed_cluster_is_cleaned_on_both_machines(
    machine: tuple[NamespaceMachine, Path], tmp_path: Path
) -> None:
    second, inventory = machine
    before_here = snapshot()
    links_there = second_links(second)
    env = dict(os.environ, ASTRAL_INVENTORY=str(inventory))
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "up", "--cluster", f"localhost,{MACHINE}",
         "--hold", "600"],
        env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "ready:" not in (tmp_path / "up.log").read_text():
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            assert time.monotonic() < deadline, "the cluster did not come up in 2 minutes"
            time.sleep(0.2)
        assert second_bridges(second)  # its share is up there
        # astral fault from another terminal breaks a link of the other machine's share
        # (both ends there) and a cut link (one end on each machine), then mends them
        for link in ("p1s0g0-p1r0t0", "p0r0a0-c1"):
            applied = astral(["fault", "apply", "link-down", link], inventory, timeout=60)
            assert applied.returncode == 0, applied.stdout + applied.stderr
        assert "state DOWN" in second.exec(["ip", "link", "show", "dev", "p1r0t0-eth1"]).stdout
        assert "state DOWN" in second.exec(["ip", "link", "show", "dev", "c1-eth1"]).stdout
        cleared = astral(["fault", "clear", "--all"], inventory, timeout=60)
        assert cleared.returncode == 0, cleared.stdout + cleared.stderr
        assert "state DOWN" not in second.exec(["ip", "link", "show", "dev", "p1r0t0-eth1"]).stdout
        os.kill(up.pid, signal.SIGKILL)
        up.wait()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        log.close()
    # its part there ends with its session and tears its share down
    deadline = time.monotonic() + 60
    while second_bridges(second) and time.monotonic() < deadline:
        time.sleep(0.2)
    cleaned = astral(["clean"], inventory, timeout=300)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert f"{MACHINE}: " in cleaned.stdout  # astral clean ran there too
    after_here = snapshot()
    assert after_here.bridges == before_here.bridges
    assert not {n for n in after_here.links - before_here.links if "-eth" in n}
    assert unfinished_runs(None) == []
    assert second_bridges(second) == set()
    assert second_links(second) == links_there
    assert unfinished_runs(second) == []


def test_the_cli_reaches_every_machines_gpus(machine: tuple[NamespaceMachine, Path]) -> None:
    """Mininet's CLI over the cluster: a GPU of the other machine (the cluster edition's
    remote host, entering the namespace there) pings one of this machine's."""
    second, inventory = machine
    commands = "p1s0g0 ping -c1 -W5 10.0.0.1\np0s0g0 ping -c1 -W5 10.0.1.1\nexit\n"
    done = astral(
        ["up", "--cluster", f"localhost,{MACHINE}", "--cli"], inventory, input=commands, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(rf"  {MACHINE} .*\n\s+servers\s+p1s0 p1s1\n", done.stdout), done.stdout
    output = done.stdout + done.stderr  # Mininet's CLI writes its nodes' output to stderr
    assert output.count("1 packets transmitted, 1 received") == 2, output
    assert second_bridges(second) == set()
