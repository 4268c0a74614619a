"""A validated fabric description as typed, frozen objects: what the generators, the planner
and the emulation read. :mod:`topologies.spec` turns the YAML a user writes into these (and
says what is wrong with it); nothing here parses or checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from topologies.errors import FabricSpecError
from topologies.units import format_rate

# Real speeds of the paper's fabric: 200G ports everywhere, NVLink 4.0 at 900 GB/s
# bidirectional = 3.6 Tbit/s one way.
DEFAULT_SPEEDS = {"nic": 200e9, "tor_agg": 200e9, "agg_core": 200e9, "nvlink": 3.6e12}
# 200G real -> 20 Mbit/s emulated: eight dual-ported GPUs then offer 320 Mbit/s in total,
# well inside what userspace OVS forwards on two cores (docs/fidelity.md).
DEFAULT_SCALE = 1e-4


@dataclass(frozen=True)
class SwitchSpec:
    """Switch radix and how its ports split between downlinks and uplinks."""

    radix: int
    down_ports: int

    @property
    def up_ports(self) -> int:
        return self.radix - self.down_ports


@dataclass(frozen=True)
class Speeds:
    """Real link rates per tier, bit/s."""

    nic: float = DEFAULT_SPEEDS["nic"]
    tor_agg: float = DEFAULT_SPEEDS["tor_agg"]
    agg_core: float = DEFAULT_SPEEDS["agg_core"]
    nvlink: float = DEFAULT_SPEEDS["nvlink"]


@dataclass(frozen=True)
class Oversubscription:
    """Down:up capacity ratio wanted at the ToR and aggregation tiers (1 = non-blocking)."""

    tor: float = 1.0
    agg: float = 1.0


@dataclass(frozen=True)
class EmulationSpec:
    """How real rates map onto the emulated links: emulated = real * scale."""

    scale: float = DEFAULT_SCALE

    def emulated(self, real_bps: float) -> float:
        return real_bps * self.scale


@dataclass(frozen=True)
class FabricSpec:
    """A validated fabric description. ``source`` is the file it came from, for messages."""

    name: str
    kind: str
    pods: int
    servers_per_pod: int | None
    gpus_per_server: int
    nic_ports: int
    switch: SwitchSpec
    speeds: Speeds = field(default_factory=Speeds)
    oversubscription: Oversubscription = field(default_factory=Oversubscription)
    emulation: EmulationSpec = field(default_factory=EmulationSpec)
    source: str = "<inline>"

    @property
    def rails(self) -> int:
        return self.gpus_per_server

    def error(
        self, key: str, expected: str, found: object = None, detail: str = ""
    ) -> FabricSpecError:
        """An error about this spec's ``key``, for generators' wiring checks."""
        return FabricSpecError(self.source, key, expected, found, detail=detail)

    def to_dict(self) -> dict[str, Any]:
        """The canonical YAML-able form (rates spelled like ``200G``)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "pods": self.pods,
            "servers_per_pod": self.servers_per_pod,
            "gpus_per_server": self.gpus_per_server,
            "nic_ports": self.nic_ports,
            "switch": {"radix": self.switch.radix, "down_ports": self.switch.down_ports},
            "speeds": {
                "nic": format_rate(self.speeds.nic),
                "tor_agg": format_rate(self.speeds.tor_agg),
                "agg_core": format_rate(self.speeds.agg_core),
                "nvlink": format_rate(self.speeds.nvlink),
            },
            "oversubscription": {
                "tor": self.oversubscription.tor,
                "agg": self.oversubscription.agg,
            },
            "emulation": {"scale": self.emulation.scale},
        }
