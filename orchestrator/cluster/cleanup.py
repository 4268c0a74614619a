"""``astral clean`` for a cluster run: the other machines' parts, from the run's record.

A cluster run's own record (this machine's ``state.json``) holds its part here and the SSH
sessions of the other machines' parts. Cleaning it ends those sessions, and a part whose
session ends tears its share down by itself (orchestrator.commands.cluster_part). What a
part could not remove (it was killed too, or its machine lost the connection first) is in
that machine's own record: :func:`clean_other_machines` runs ``astral clean`` there for
every machine the run's ``fabric.json`` names, through the inventory the run used.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from orchestrator.cluster.ssh import LOCAL, SshMachine
from orchestrator.remote.inventory import load_inventory
from topologies.errors import AstralError

BUSY_EXIT = 5  # another run (the part, still tearing down) holds that machine's lock
RETRY_S = 60.0


def cluster_record(run_dir: Path) -> dict[str, Any] | None:
    """The ``cluster`` record of a run's fabric description, None for a one-machine run."""
    try:
        document = json.loads((run_dir / "fabric.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    cluster = document.get("extra", {}).get("cluster")
    return cluster if isinstance(cluster, dict) else None


def clean_other_machines(run_dir: Path) -> list[str]:
    """``astral clean`` on every other machine of the run in ``run_dir``; its output, one
    line per line, each prefixed with the machine's name."""
    cluster = cluster_record(run_dir)
    if cluster is None:
        return []
    lines = []
    for name, entry in cluster.get("machines", {}).items():
        if name == LOCAL or not isinstance(entry, dict) or not entry.get("inventory"):
            continue
        try:
            machine = load_inventory(Path(entry["inventory"])).machine(name)
            ssh = SshMachine.of(machine)
        except AstralError as err:
            lines.append(f"{name}: cannot reach it to clean: {err}")
            continue
        deadline = time.monotonic() + RETRY_S
        while True:
            done = ssh.run(ssh.astral(["clean"]), timeout=RETRY_S + 30)
            if done.returncode != BUSY_EXIT or time.monotonic() > deadline:
                break
            time.sleep(1.0)  # its part is still tearing down
        output = (done.stdout + done.stderr).strip().splitlines()
        lines += [f"{name}: {line}" for line in output or [f"exit status {done.returncode}"]]
    return lines
