"""One machine's share of a fabric spread over several (orchestrator.cluster), as data.

An :class:`~orchestrator.emulation.network.Emulation` given a share creates only the nodes
of ``nodes``, the links with both ends among them, and one VXLAN tunnel end per link cut
between this machine and another (:class:`~orchestrator.emulation.wiring.Tunnel`); its
switches connect to the cluster's one controller at ``controller`` instead of starting
their own. Everything else (the run record, shapers, teardown, ``astral clean``) is the
single-machine code, on this machine's part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.emulation.wiring import Tunnel


@dataclass(frozen=True)
class Share:
    machine: str
    nodes: frozenset[str]
    tunnels: tuple[Tunnel, ...]
    controller: tuple[str, int]  # the cluster controller's address and OpenFlow port

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "nodes": sorted(self.nodes),
            "tunnels": [vars(t) for t in self.tunnels],
            "controller": list(self.controller),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Share:
        host, port = data["controller"]
        return cls(
            machine=str(data["machine"]),
            nodes=frozenset(data["nodes"]),
            tunnels=tuple(Tunnel(**t) for t in data["tunnels"]),
            controller=(str(host), int(port)),
        )
