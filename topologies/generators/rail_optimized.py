"""A rail-optimized two-tier leaf-spine (NVIDIA SuperPOD / Meta RoCE style).

Leaves are per rail, spines are shared by all rails and all pods::

            s0        s1        s2        s3          spines (tier "agg"): shared by every
            |\\ \\      ...                             rail and pod; every leaf reaches
            | \\ +-------------------------+          every spine
            |  +----------------+           \\
          p0r0t0  p0r0t1     p0r1t0  p0r1t1   p1r0t0 ...   leaves (tier "tor"): per (pod,
             \\      /           \\      /                    rail); t0/t1 a dual-ToR pair
              port1 port2        port1 port2
               p0s0g0             p0s0g1                GPU of rail r: NIC port i -> leaf i
                  \\___ p0s0nv ___/                         of its group on rail r

Rules:

- Leaves give ``switch.down_ports`` (D) ports to GPUs of their rail: a leaf group (a pair
  with ``nic_ports`` 2, one leaf with 1) serves D servers, ``ceil(servers_per_pod / D)``
  groups per rail and pod (common.py).
- **Pods just multiply servers**: a pod is a block of servers with its own leaves (named
  ``p<pod>r<rail>t<i>``), and all pods hang off the same spine layer. That keeps the
  fabric two-tier, so the spine radix bounds it: the L = pods x rails x groups x nic_ports
  leaves with U = radix - D uplinks each need ``ceil(L * U / radix)`` spines, rounded up
  to a divisor of U so every leaf has U / spines links to each spine (common.py), and
  every leaf reaches every spine only while L <= radix. Beyond that a third tier is
  needed: use ``kind: astral`` (same-rail aggregation plus core).
- ``servers_per_pod`` defaults to the most that fit: ``floor(radix / (pods x rails x
  nic_ports))`` groups of D servers.
- Cross-rail traffic crosses a spine (leaf - spine - leaf, 3 switch hops), like same-rail
  traffic between leaves; only GPUs that share a leaf are 1 hop apart.
- Oversubscription: leaf->spine links carry ``speeds.tor_agg / oversubscription.tor``;
  there is no tier above the spines, so ``oversubscription.agg`` must stay 1.
"""

from __future__ import annotations

from dataclasses import replace

from topologies.fabricspec import FabricSpec
from topologies.generators.common import (
    TIER_NAMES,
    connect_rail_nics,
    rail_tor_name,
    round_robin,
    tor_groups,
    upper_switches,
)
from topologies.generators.cuts import group_loads, out_of, rail_plane_cuts
from topologies.model import Fabric, FabricBuilder, LinkKind, Tier
from topologies.plan import Plan, PlanInput, nonzero


def max_groups_per_rail_pod(spec: FabricSpec) -> int:
    """Leaf groups per (rail, pod) the spine radix allows (L <= radix)."""
    return spec.switch.radix // (spec.pods * spec.rails * spec.nic_ports)


def rail_optimized_servers_per_pod(spec: FabricSpec) -> int:
    if spec.servers_per_pod is not None:
        return spec.servers_per_pod
    return max_groups_per_rail_pod(spec) * spec.switch.down_ports


def rail_optimized_leaves(spec: FabricSpec) -> int:
    """All leaves of the fabric (every pod, every rail)."""
    groups = tor_groups(rail_optimized_servers_per_pod(spec), spec.switch.down_ports)
    return spec.pods * spec.rails * groups * spec.nic_ports


def rail_optimized_spines(spec: FabricSpec) -> int:
    return upper_switches(rail_optimized_leaves(spec), spec.switch.up_ports, spec.switch.radix)


class RailOptimizedGenerator:
    """Two-tier rail-optimized leaf-spine (drawn in the module docstring)."""

    kind = "rail-optimized"
    default_nic_ports = 1
    two_tier = True
    has_rails = True
    tier_names = {**TIER_NAMES, Tier.TOR: "leaf (ToR)", Tier.AGG: "spine"}

    def check(self, spec: FabricSpec) -> None:
        radix, down = spec.switch.radix, spec.switch.down_ports
        if spec.oversubscription.agg != 1:
            raise spec.error(
                "oversubscription.agg",
                "1 (a rail-optimized fabric has no tier above its spines)",
                spec.oversubscription.agg,
            )
        per_group = spec.rails * spec.nic_ports
        if max_groups_per_rail_pod(spec) < 1:
            key = "pods" if spec.pods > 1 else "gpus_per_server"
            raise spec.error(
                key,
                f"pods x rails x nic_ports at most the radix {radix} (every leaf needs a "
                "port on every spine)",
                spec.pods if key == "pods" else spec.gpus_per_server,
                detail=f"{spec.pods} pod(s) x {spec.rails} rails x {spec.nic_ports} NIC "
                f"port(s) = {spec.pods * per_group} leaves",
            )
        leaves = rail_optimized_leaves(spec)
        if leaves > radix:
            limit = max_groups_per_rail_pod(spec) * down
            raise spec.error(
                "servers_per_pod",
                f"at most {limit} servers per pod in a two-tier rail-optimized fabric of "
                f"radix {radix} ({down} down / {spec.switch.up_ports} up)",
                spec.servers_per_pod,
                detail=f"it would need {leaves} leaves but a spine has only {radix} ports; "
                "kind astral adds a tier",
            )

    def generate(self, spec: FabricSpec) -> Fabric:
        builder = FabricBuilder(spec)
        servers = rail_optimized_servers_per_pod(spec)
        up = spec.switch.up_ports
        tors = tor_groups(servers, spec.switch.down_ports) * spec.nic_ports
        n_spines = rail_optimized_spines(spec)
        leaf_up = spec.speeds.tor_agg / spec.oversubscription.tor

        leaves = []
        for pod in range(spec.pods):
            for rail in range(spec.rails):
                for t in range(tors):
                    leaves.append(
                        builder.add_switch(rail_tor_name(pod, rail, t), Tier.TOR, pod, rail, t)
                    )
        for i in range(n_spines):
            builder.add_switch(f"s{i}", Tier.AGG, index=i)

        for pod in range(spec.pods):
            for s in range(servers):
                builder.add_server(pod, s)
        for pod in range(spec.pods):
            connect_rail_nics(builder, spec, pod, servers)
        for number, leaf in enumerate(leaves):
            for u in range(up):
                spine = round_robin(number, u, up, n_spines)
                builder.connect(leaf, f"s{spine}", LinkKind.TOR_AGG, leaf_up)
        return builder.build()

    def plan(self, spec: FabricSpec) -> Plan:
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
        plane_out = out_of(group_loads(S, D, n_ports), n, U * t)
        cuts = rail_plane_cuts(spec, S, U * t, plane_out)
        hops = 3 if leaves > n_ports else 1
        return Plan(spec, S, nonzero(switches), nonzero(links), hops, cuts, min(S, D))

    def plan_inputs(self, inputs: PlanInput) -> PlanInput:
        return replace(inputs, oversubscription_agg=1.0)  # nothing above the spines

    def max_servers_per_pod(self, inputs: PlanInput) -> int:
        return inputs.radix // (inputs.rails * inputs.nic_ports) * inputs.down

    def max_pods(self, inputs: PlanInput) -> int:
        return 1  # compared as one pod (pods only relabel servers)

    def uniform_uplinks(self, spec: FabricSpec) -> bool:
        return True  # spines are sized to a divisor of the uplinks (common.py)
