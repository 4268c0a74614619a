"""The planner's data: what it is told (:class:`PlanInput`) and what it answers for one
fabric (:class:`Plan`).

Each kind computes its plan in its generator module (``Generator.plan``, with the min-cuts
of :mod:`topologies.generators.cuts`); :mod:`topologies.planner` compares the kinds, and its
docstring states once the assumptions behind the numbers (links, transceivers, bisection).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from topologies.fabricspec import DEFAULT_SPEEDS, FabricSpec
from topologies.model import LinkKind, Tier


@dataclass(frozen=True)
class PlanInput:
    """What the planner is told: switch radix and split, port speed, rails, NIC ports, pods."""

    radix: int = 256
    port_speed: float = 200e9
    rails: int = 8
    nic_ports: int = 2
    pods: int = 8
    down_ports: int | None = None  # default radix / 2
    servers_per_pod: int | None = None  # default: as many as the radix allows
    oversubscription_tor: float = 1.0
    oversubscription_agg: float = 1.0
    nvlink: float = DEFAULT_SPEEDS["nvlink"]

    @property
    def down(self) -> int:
        """Down ports per switch: as told, else half the radix."""
        return self.radix // 2 if self.down_ports is None else self.down_ports


@dataclass(frozen=True)
class Plan:
    """Closed-form dimensions of one fabric."""

    spec: FabricSpec
    servers_per_pod: int
    switches: dict[Tier, int]  # network tiers, and NVLINK = one per server
    links: dict[LinkKind, int]
    max_hops: int
    cuts: dict[str, float] = field(default_factory=dict)  # bit/s one way, aligned cuts only
    gpus_per_tor: int = 0

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def pods(self) -> int:
        return self.spec.pods

    @property
    def servers(self) -> int:
        return self.spec.pods * self.servers_per_pod

    @property
    def gpus(self) -> int:
        return self.servers * self.spec.rails

    @property
    def gpus_per_pod(self) -> int:
        return self.servers_per_pod * self.spec.rails

    @property
    def gpus_per_plane(self) -> int:
        """GPUs of one rail in one pod (Astral's rail plane)."""
        return self.servers_per_pod

    @property
    def gpu_bandwidth(self) -> float:
        return self.spec.nic_ports * self.spec.speeds.nic

    @property
    def server_bandwidth(self) -> float:
        return self.spec.rails * self.gpu_bandwidth

    @property
    def network_switches(self) -> int:
        return sum(n for tier, n in self.switches.items() if tier is not Tier.NVLINK)

    @property
    def switch_links(self) -> int:
        return self.links.get(LinkKind.TOR_AGG, 0) + self.links.get(LinkKind.AGG_CORE, 0)

    @property
    def network_links(self) -> int:
        return self.switch_links + self.links.get(LinkKind.NIC, 0)

    @property
    def switch_transceivers(self) -> int:
        return 2 * self.switch_links

    @property
    def nic_transceivers(self) -> int:
        return 2 * self.links.get(LinkKind.NIC, 0)

    @property
    def transceivers(self) -> int:
        return self.switch_transceivers + self.nic_transceivers

    @property
    def bisection(self) -> float | None:
        return min(self.cuts.values()) if self.cuts else None

    @property
    def worst_cut(self) -> str | None:
        return min(self.cuts, key=lambda name: self.cuts[name]) if self.cuts else None

    @property
    def bisection_per_gpu(self) -> float | None:
        bisection = self.bisection
        return None if bisection is None else bisection / (self.gpus // 2)

    def tier_ratios(self) -> dict[Tier, float]:
        """Down:up capacity of each tier that has uplinks (1.0 = non-blocking)."""
        speeds, over = self.spec.speeds, self.spec.oversubscription
        nic = self.links.get(LinkKind.NIC, 0) * speeds.nic
        tor_agg = self.links.get(LinkKind.TOR_AGG, 0) * speeds.tor_agg / over.tor
        agg_core = self.links.get(LinkKind.AGG_CORE, 0) * speeds.agg_core / over.agg
        ratios = {}
        if tor_agg:
            ratios[Tier.TOR] = nic / tor_agg
        if agg_core:
            ratios[Tier.AGG] = tor_agg / agg_core
        return ratios

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "spec": self.spec.to_dict(),
            "pods": self.pods,
            "servers_per_pod": self.servers_per_pod,
            "servers": self.servers,
            "gpus": self.gpus,
            "gpus_per_tor": self.gpus_per_tor,
            "gpus_per_plane": self.gpus_per_plane,
            "gpus_per_pod": self.gpus_per_pod,
            "gpu_bandwidth": self.gpu_bandwidth,
            "server_bandwidth": self.server_bandwidth,
            "switches": {tier.value: n for tier, n in self.switches.items()},
            "network_switches": self.network_switches,
            "links": {kind.value: n for kind, n in self.links.items()},
            "network_links": self.network_links,
            "transceivers": {
                "switch_to_switch": self.switch_transceivers,
                "nic_to_tor": self.nic_transceivers,
                "total": self.transceivers,
            },
            "tier_ratios": {tier.value: r for tier, r in self.tier_ratios().items()},
            "max_hops": self.max_hops,
            "cuts": dict(self.cuts),
            "bisection": self.bisection,
            "bisection_per_gpu": self.bisection_per_gpu,
            "worst_cut": self.worst_cut,
        }


def nonzero(counts: dict[Any, int]) -> dict[Any, int]:
    """``counts`` without the tiers or link kinds a fabric does not have."""
    return {key: n for key, n in counts.items() if n}
