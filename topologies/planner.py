"""Dimension a full-size fabric in closed form, from the switch radix and the port speed.

No graph is built: every count is the arithmetic the generators' loops carry out (the
shared sizing helpers live in ``topologies.generators``), so a plan for 512K GPUs takes
microseconds; ``tests/unit/test_planner.py`` checks, on small specs of every kind, that the
counts, the maximum hops and the bisection cuts equal those of the generated fabric.

The paper's fabric (docs/astral.md; our reading of its numbers): 51.2 Tbit/s switches as
256 x 200G, half down, half up; 8 rails; dual-ToR::

    GPUs per ToR            D                       = 128
    GPUs per rail plane     D ToRs x D ports / 2    = 8,192   (64 dual-ToR pairs)
    GPUs per pod            x 8 rails               = 65,536
    GPUs                    x 8 pods                = 524,288 (about 512K)
    bandwidth per server    8 NICs x 2 x 200G       = 3.2 Tbit/s

Assumptions, stated once:

- **Links** are counted per cable: a NIC port to its ToR is one NIC link (a dual-ToR GPU
  has two), a switch-to-switch cable is one link of its tier. NVLink is inside the server
  and counted apart (one NVLink switch per server), not as network.
- **Transceivers**: 2 per switch-to-switch link (one optic at each end). NIC-to-ToR links
  are counted the same way, 2 per link (one in the NIC port, one in the ToR port), and
  reported separately: in a rail-optimized fabric a rail's ToR sits in another rack than
  most of its servers, so these are optical too; if they were copper (DAC), drop them.
  One transceiver per 200G port; breakout optics (one 800G module for 4 x 200G) would
  divide the count by the breakout factor.
- **Bisection** is the same quantity ``topologies.properties`` computes by max-flow: the
  least capacity across each balanced cut aligned with the fabric (``pods``, ``servers``,
  ``rails``), minimised. Here each cut is a closed-form min-cut, derived for the tree-like
  tiers (per ToR: cut its GPUs or its uplinks, whichever is cheaper), and only computed
  when the halves fall on whole pods / servers / rails (an even number of them).
- **Comparing kinds at one GPU count** uses the same radix, port speed, rails and NIC ports
  for every kind, except that a fat-tree host has one NIC port (so half the bandwidth per
  GPU) and a fat-tree switch splits k/2 down, k/2 up. Each kind takes the fewest pods it
  needs; the two-tier kinds (rail-optimized, rail-only) cannot exceed what one spine layer
  terminates and are reported as out of reach beyond it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from topologies.errors import FabricSpecError
from topologies.generators import default_registry
from topologies.generators.astral import astral_servers_per_pod, cores_per_group, has_core
from topologies.generators.common import ceil_div, tor_groups
from topologies.generators.fat_tree import fat_tree_cores_per_group, fat_tree_servers_per_pod
from topologies.generators.rail_only import rail_only_servers_per_pod, rail_only_spines_per_rail
from topologies.generators.rail_optimized import (
    rail_optimized_servers_per_pod,
    rail_optimized_spines,
)
from topologies.model import LinkKind, Tier
from topologies.spec import DEFAULT_SPEEDS, FabricSpec, parse_fabric_spec

KINDS = ("astral", "fat-tree", "rail-optimized", "rail-only")
SOURCE = "astral topo plan"


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

    def spec(
        self,
        kind: str = "astral",
        *,
        pods: int | None = None,
        servers_per_pod: int | None = None,
        use_input_servers: bool = True,
    ) -> FabricSpec:
        """The FabricSpec of ``kind`` these inputs describe, shape-checked and wire-checked.

        Raises FabricSpecError (source ``astral topo plan``) with the spec's key names.
        """
        fat_tree = kind == "fat-tree"
        two_tier = kind in ("rail-optimized", "rail-only")
        servers = servers_per_pod
        if servers is None and use_input_servers:
            servers = self.servers_per_pod
        document: dict[str, Any] = {
            "name": f"plan-{kind}",
            "kind": kind,
            "pods": self.pods if pods is None else pods,
            "gpus_per_server": self.rails,
            "nic_ports": 1 if fat_tree else self.nic_ports,
            "switch": {
                "radix": self.radix,
                "down_ports": self.radix // 2
                if fat_tree or self.down_ports is None
                else self.down_ports,
            },
            "speeds": {
                "nic": self.port_speed,
                "tor_agg": self.port_speed,
                "agg_core": self.port_speed,
                "nvlink": self.nvlink,
            },
            "oversubscription": {
                "tor": self.oversubscription_tor,
                "agg": 1.0 if two_tier else self.oversubscription_agg,
            },
        }
        if servers is not None:
            document["servers_per_pod"] = servers
        spec = parse_fabric_spec(document, SOURCE)
        default_registry().get(spec).check(spec)
        return spec


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


@dataclass(frozen=True)
class Unreachable:
    """A kind that cannot be built for the GPU count asked with these switches."""

    kind: str
    gpus: int
    max_gpus: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "gpus": self.gpus,
            "max_gpus": self.max_gpus,
            "reason": self.reason,
        }


# --- min-cut helpers ---------------------------------------------------------------------
# A "plane" is the set of ToRs below one shared upper layer (Astral: a rail plane of a pod;
# fat-tree: a pod; rail kinds: the ToRs of one (pod, rail)). ``loads`` are GPUs per ToR.


def _group_loads(
    servers: int, down: int, nic_ports: int, first: int = 0, last: int = -1
) -> list[int]:
    """GPUs per ToR of one rail plane whose servers [first, last) are counted."""
    last = servers if last < 0 else last
    loads = []
    for g in range(tor_groups(servers, down)):
        lo, hi = g * down, min(servers, (g + 1) * down)
        count = max(0, min(hi, last) - max(lo, first))
        loads += [count] * nic_ports
    return loads


def _out_of(loads: Sequence[int], nic: float, up: float) -> float:
    """Least capacity that isolates whole ToRs' GPUs from above: per ToR, GPUs or uplinks."""
    return sum(min(load * nic, up) for load in loads)


def _split(a: Sequence[int], b: Sequence[int], nic: float, up: float) -> float:
    """Min-cut between the A and B GPUs of one plane whose ToRs share the layer above.

    The layer above sits wholly on one side (mixing never helps: the cost is concave in how
    many upper switches are on each side); each ToR then takes the cheaper side.
    """
    above_a = sum(min(nb * nic, na * nic + up) for na, nb in zip(a, b, strict=True))
    above_b = sum(min(na * nic, nb * nic + up) for na, nb in zip(a, b, strict=True))
    return min(above_a, above_b)


def _even(n: int) -> bool:
    return n > 1 and n % 2 == 0


# --- per kind ----------------------------------------------------------------------------


def _plan_astral(spec: FabricSpec) -> Plan:
    P, rails, n_ports = spec.pods, spec.rails, spec.nic_ports
    D, U = spec.switch.down_ports, spec.switch.up_ports
    S = astral_servers_per_pod(spec)
    tors = tor_groups(S, D) * n_ports
    planes = P * rails
    core = has_core(spec)
    n = spec.speeds.nic
    t = spec.speeds.tor_agg / spec.oversubscription.tor
    a = spec.speeds.agg_core / spec.oversubscription.agg
    switches = {
        Tier.TOR: planes * tors,
        Tier.AGG: planes * U,
        Tier.CORE: U * cores_per_group(spec) if core else 0,
        Tier.NVLINK: P * S,
    }
    links = {
        LinkKind.NIC: P * S * rails * n_ports,
        LinkKind.TOR_AGG: planes * tors * U,
        LinkKind.AGG_CORE: planes * U * U if core else 0,
        LinkKind.NVLINK: P * S * rails,
    }
    loads = _group_loads(S, D, n_ports)
    plane_out = min(_out_of(loads, n, U * t), U * U * a) if core else _out_of(loads, n, U * t)
    cuts = {}
    if _even(P):
        cuts["pods"] = P // 2 * rails * plane_out
    if _even(S):
        half = _group_loads(S, D, n_ports, 0, S // 2), _group_loads(S, D, n_ports, S // 2)
        cuts["servers"] = P * rails * _split(*half, n, U * t)
    if _even(rails):
        cuts["rails"] = rails // 2 * P * plane_out
    hops = 5 if core else (3 if tors > n_ports else 1)
    return Plan(spec, S, _nonzero(switches), _nonzero(links), hops, cuts, min(S, D))


def _plan_fat_tree(spec: FabricSpec) -> Plan:
    P, gps = spec.pods, spec.gpus_per_server
    h = spec.switch.radix // 2
    S = fat_tree_servers_per_pod(spec)
    per_group = fat_tree_cores_per_group(spec)
    n = spec.speeds.nic
    t = spec.speeds.tor_agg / spec.oversubscription.tor
    a = spec.speeds.agg_core / spec.oversubscription.agg
    slots = S * gps
    switches = {Tier.TOR: P * h, Tier.AGG: P * h, Tier.CORE: h * per_group, Tier.NVLINK: P * S}
    links = {
        LinkKind.NIC: P * slots,
        LinkKind.TOR_AGG: P * h * h,
        LinkKind.AGG_CORE: P * h * h if per_group else 0,
        LinkKind.NVLINK: P * slots,
    }

    def edge_loads(in_a: Any) -> tuple[list[int], list[int]]:
        """GPUs of side A and side B on each edge; ``in_a(slot)`` says which side a slot is."""
        a_loads, b_loads = [], []
        for e in range(h):
            members = range(e * h, min(slots, (e + 1) * h))
            na = sum(1 for j in members if in_a(j))
            a_loads.append(na)
            b_loads.append(len(members) - na)
        return a_loads, b_loads

    loads = [max(0, min(slots, (e + 1) * h) - e * h) for e in range(h)]
    cuts = {}
    if _even(P):
        cuts["pods"] = P // 2 * min(_out_of(loads, n, h * t), h * h * a)
    if _even(S):
        cuts["servers"] = P * _split(*edge_loads(lambda j: j < S // 2 * gps), n, h * t)
    if _even(gps):
        cuts["rails"] = P * _split(*edge_loads(lambda j: j % gps < gps // 2), n, h * t)
    used_edges = ceil_div(slots, h)
    hops = 5 if per_group else (3 if used_edges > 1 else 1)
    return Plan(spec, S, _nonzero(switches), _nonzero(links), hops, cuts, min(h, slots))


def _plan_rail_optimized(spec: FabricSpec) -> Plan:
    P, rails, n_ports = spec.pods, spec.rails, spec.nic_ports
    D, U = spec.switch.down_ports, spec.switch.up_ports
    S = rail_optimized_servers_per_pod(spec)
    tors = tor_groups(S, D) * n_ports
    leaves = P * rails * tors
    n = spec.speeds.nic
    t = spec.speeds.tor_agg / spec.oversubscription.tor
    switches = {Tier.TOR: leaves, Tier.AGG: rail_optimized_spines(spec), Tier.NVLINK: P * S}
    links = {
        LinkKind.NIC: P * S * rails * n_ports,
        LinkKind.TOR_AGG: leaves * U,
        LinkKind.NVLINK: P * S * rails,
    }
    plane_out = _out_of(_group_loads(S, D, n_ports), n, U * t)
    cuts = {}
    if _even(P):
        cuts["pods"] = P // 2 * rails * plane_out
    if _even(S):
        half = _group_loads(S, D, n_ports, 0, S // 2), _group_loads(S, D, n_ports, S // 2)
        cuts["servers"] = P * rails * _split(*half, n, U * t)
    if _even(rails):
        cuts["rails"] = rails // 2 * P * plane_out
    hops = 3 if leaves > n_ports else 1
    return Plan(spec, S, _nonzero(switches), _nonzero(links), hops, cuts, min(S, D))


def _plan_rail_only(spec: FabricSpec) -> Plan:
    P, rails, n_ports = spec.pods, spec.rails, spec.nic_ports
    D, U = spec.switch.down_ports, spec.switch.up_ports
    S = rail_only_servers_per_pod(spec)
    tors = tor_groups(S, D) * n_ports
    spines = rail_only_spines_per_rail(spec)
    n = spec.speeds.nic
    up = U * spec.speeds.tor_agg / spec.oversubscription.tor if spines else 0.0
    switches = {Tier.TOR: P * rails * tors, Tier.AGG: rails * spines, Tier.NVLINK: P * S}
    links = {
        LinkKind.NIC: P * S * rails * n_ports,
        LinkKind.TOR_AGG: P * rails * tors * U if spines else 0,
        LinkKind.NVLINK: P * S * rails,
    }
    cuts = {}
    if _even(P):
        cuts["pods"] = P // 2 * rails * _out_of(_group_loads(S, D, n_ports), n, up)
    if _even(S):
        half = _group_loads(S, D, n_ports, 0, S // 2), _group_loads(S, D, n_ports, S // 2)
        cuts["servers"] = P * rails * _split(*half, n, up)
    if _even(rails):
        # Nothing joins the rails but NVLink: half of every server's GPUs on each side.
        cuts["rails"] = P * S * (rails // 2) * spec.speeds.nvlink
    # Same rail: 1 hop on a rail switch, 3 through a rail spine; other rail: +1 NVLink hop.
    nvlink_hop = 1 if rails > 1 else 0
    hops = nvlink_hop if P * S == 1 else (3 if spines else 1) + nvlink_hop
    return Plan(spec, S, _nonzero(switches), _nonzero(links), hops, cuts, min(S, D))


_PLANNERS = {
    "astral": _plan_astral,
    "fat-tree": _plan_fat_tree,
    "rail-optimized": _plan_rail_optimized,
    "rail-only": _plan_rail_only,
}


def _nonzero(counts: dict[Any, int]) -> dict[Any, int]:
    return {key: n for key, n in counts.items() if n}


def plan(spec: FabricSpec) -> Plan:
    """Closed-form dimensions of ``spec`` (which must have passed its generator's check)."""
    try:
        planner = _PLANNERS[spec.kind]
    except KeyError:
        raise FabricSpecError(
            spec.source, "kind", "one of " + ", ".join(KINDS), spec.kind
        ) from None
    return planner(spec)


def plan_astral(inputs: PlanInput) -> Plan:
    """The Astral fabric the inputs describe (``pods`` pods, full pods unless told)."""
    return plan(inputs.spec("astral"))


# --- comparison at one GPU count ---------------------------------------------------------


def _max_servers_per_pod(kind: str, inputs: PlanInput) -> int:
    R, rails = inputs.radix, inputs.rails
    D = R // 2 if kind == "fat-tree" or inputs.down_ports is None else inputs.down_ports
    if kind == "astral":
        return D * (D // inputs.nic_ports)
    if kind == "fat-tree":
        return (R // 2) ** 2 // rails
    if kind == "rail-optimized":
        return R // (rails * inputs.nic_ports) * D
    return R // inputs.nic_ports * D  # rail-only


def _max_pods(kind: str, inputs: PlanInput) -> int:
    if kind == "astral":
        return max(1, inputs.radix // inputs.rails)  # every agg reaches its whole core group
    if kind == "fat-tree":
        return inputs.radix
    return 1  # the two-tier kinds are compared as one pod (pods only relabel servers)


def max_gpus(kind: str, inputs: PlanInput) -> int:
    """The most GPUs ``kind`` reaches with these switches (closed form)."""
    return _max_pods(kind, inputs) * _max_servers_per_pod(kind, inputs) * inputs.rails


def plan_for_gpus(kind: str, gpus: int, inputs: PlanInput) -> Plan | Unreachable:
    """The smallest ``kind`` fabric (fewest pods) holding at least ``gpus`` GPUs."""
    servers = ceil_div(gpus, inputs.rails)
    per_pod = _max_servers_per_pod(kind, inputs)
    most = max_gpus(kind, inputs)
    if per_pod < 1 or gpus > most:
        tiers = "two-tier " if kind in ("rail-optimized", "rail-only") else ""
        return Unreachable(
            kind,
            gpus,
            most,
            f"a {tiers}{kind} fabric of radix {inputs.radix} holds at most {most:,} GPUs",
        )
    pods = ceil_div(servers, per_pod)
    try:
        spec = inputs.spec(kind, pods=pods, servers_per_pod=ceil_div(servers, pods))
    except FabricSpecError as err:
        return Unreachable(kind, gpus, most, err.expected)
    return plan(spec)


def compare(gpus: int, inputs: PlanInput) -> list[Plan | Unreachable]:
    """Every kind dimensioned for ``gpus`` GPUs with the same switches and ports."""
    return [plan_for_gpus(kind, gpus, inputs) for kind in KINDS]


def common_reach(inputs: PlanInput) -> int:
    """The largest GPU count every kind reaches (a multiple of the rails)."""
    return min(max_gpus(kind, inputs) for kind in KINDS)


def uniform_uplinks(spec: FabricSpec) -> bool:
    """Whether every lower switch links equally often to each switch of the tier above.

    The fat-tree and rail generators size the upper tier so that it always does
    (common.py). Astral's core groups have ``ceil(pods x rails x U / radix)`` cores, and
    when that does not divide U some planes put one link more on some cores than on
    others; a cut that puts the planes with the same surplus on one side (the ``rails``
    cut, typically) is then narrower than the closed form here, which is exact only for
    uniform fabrics. The paper's size is uniform (32 cores per group, 128 uplinks).
    """
    if spec.kind == "astral" and has_core(spec):
        return spec.switch.up_ports % cores_per_group(spec) == 0
    return True
