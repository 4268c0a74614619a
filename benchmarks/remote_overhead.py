"""The cost of running an experiment over SSH instead of here: the same run, side by side.

    sudo .venv/bin/python benchmarks/remote_overhead.py [--repeat N] [--project DIR]

Starts a real sshd on loopback (tests/integration/sshd.py: its own host key, authorized key
and config, stopped at the end), sets up a copy of this checkout in a temporary directory
(or reuses ``--project DIR`` if it was set up before: ``astral remote setup`` is
idempotent, the first one makes the copy's .venv, about a minute), then runs a tiny
experiment (astral-small, one policy, all-reduce, 64 KiB, one iteration) alternately here
(``astral run``) and there (``astral run --on loopback``), N times each, and prints each
wall time, the medians and their ratio. The remote run does the same emulation on the same
machine, so the difference is the remote path's own cost: connecting, uploading, starting
the job, following it over SFTP, fetching the bundle.

A run refused because another holds the machine's run lock (exit 5) is retried and not
counted. On a shared machine the figures move with what else runs: compare the ratio, and
say what ran beside it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator import REPO
from tests.integration.sshd import LoopbackSshd

EXPERIMENT = """\
name: overhead-tiny
fabric: astral-small
policies: [ecmp]
collectives: [{op: all-reduce, algorithm: ring}]
sizes: {min: 64K, max: 64K}
iterations: 1
warmup: 1
"""
FLAGS = ["--no-calibrate", "--no-plots", "--force", "--quiet"]


def astral(args: list[str], cwd: Path) -> tuple[int, float, str]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True, cwd=cwd
    )
    return done.returncode, time.monotonic() - began, done.stderr


def timed(args: list[str], cwd: Path) -> float:
    """Wall seconds of one successful ``astral ARGS`` (lock refusals retried)."""
    while True:
        status, seconds, err = astral(args, cwd)
        if status == 0:
            return seconds
        if status != 5:
            raise SystemExit(f"astral {' '.join(args)} exited {status}:\n{err}")
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--project", type=Path, help="a copy set up before (reused)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        project = args.project or base / "project"
        experiment = base / "tiny.yaml"
        experiment.write_text(EXPERIMENT)
        with LoopbackSshd(base / "sshd") as sshd:
            inventory = sshd.inventory(base / "machines.yaml", project)
            on = ["--inventory", str(inventory)]
            status, seconds, err = astral(
                ["remote", "setup", "loopback", "--accept-new-host-key", *on], REPO
            )
            if status != 0:
                raise SystemExit(f"astral remote setup failed ({status}):\n{err}")
            print(f"remote setup: {seconds:.1f} s")
            here: list[float] = []
            there: list[float] = []
            for i in range(args.repeat):
                out = base / f"local-{i}"
                here.append(timed(["run", str(experiment), "--out", str(out), *FLAGS], base))
                there.append(timed(["run", str(experiment), "--on", "loopback", *FLAGS, *on], base))
                print(f"run {i + 1}: here {here[-1]:.2f} s, over SSH {there[-1]:.2f} s")
    local, remote = statistics.median(here), statistics.median(there)
    print(
        f"median: here {local:.2f} s, over SSH {remote:.2f} s: +{remote - local:.2f} s, "
        f"ratio {remote / local:.2f}"
    )


if __name__ == "__main__":
    main()
