"""Commands on a cluster fabric another process holds (``astral up --cluster``), from its
record: what ``astral fault`` needs to break it from another terminal.

The run's ``fabric.json`` says which machine holds each node (the placement), how to reach
each machine (the inventory it was read from) and the shells of the GPUs there (pid and
start time). A command for a node of this machine goes through the single-machine
:class:`~orchestrator.emulation.executor.NamespaceExecutor`; one for another machine's GPU
through :mod:`orchestrator.cluster.attach` over SSH, one for its switch to its root
namespace over SSH.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.cluster.cleanup import cluster_record
from orchestrator.cluster.ssh import LOCAL, SshMachine
from orchestrator.emulation.executor import CommandExecutor, Completed, NamespaceExecutor
from orchestrator.remote.inventory import load_inventory


class HeldClusterExecutor:
    """A :class:`CommandExecutor` over every machine of a held cluster fabric."""

    def __init__(self, cluster: dict[str, Any], local: NamespaceExecutor) -> None:
        self.where: dict[str, str] = dict(cluster["placement"]["where"])
        self.local = local
        self.machines: dict[str, SshMachine] = {}
        self.shells: dict[str, tuple[int, int]] = {}
        for name, entry in cluster["machines"].items():
            if name == LOCAL:
                continue
            machine = load_inventory(Path(entry["inventory"])).machine(name)
            self.machines[name] = SshMachine.of(machine)
            for gpu, (pid, starttime) in entry.get("shells", {}).items():
                self.shells[gpu] = (int(pid), int(starttime))

    def holds(self, node: str) -> bool:
        return self.where.get(node, LOCAL) == LOCAL

    def run(
        self,
        node: str | None,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 30.0,
    ) -> Completed:
        if node is None or self.holds(node):
            return self.local.run(node, argv, input=input, timeout=timeout)
        ssh = self.machines[self.where[node]]
        return ssh.run_in(self.shells.get(node), argv, input=input, timeout=timeout)

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        raise NotImplementedError("a held fabric's processes belong to its owner")


def held_executor(run_dir: Path, local: NamespaceExecutor) -> CommandExecutor:
    """The executor for the fabric recorded in ``run_dir``: every machine's, for a cluster."""
    cluster = cluster_record(run_dir)
    if cluster is None or "placement" not in cluster:
        return local
    return HeldClusterExecutor(cluster, local)
