"""Rail-only (Wang et al., HOTI 2024): one network per rail, nothing between the rails.

Cross-rail traffic never enters the network between rails: it first crosses NVLink inside
the server to the GPU on the destination's rail (or last, from the source's rail to the
destination), so GPUs forward for their server-mates (``Fabric.gpu_forwarding``)::

        r0s0   r0s1                 r1s0   r1s1          rail spines (tier "agg"), only when
         |  \\ /  |                   |  \\ /  |                 a rail needs more than one
         |   X   |                   |   X   |                 ToR group; per rail
      p0r0t0 p0r0t1 p1r0t0 ...    p0r1t0 p0r1t1 ...       rail leaves (tier "tor"), per
          \\    /                       \\    /                   (pod, rail); dual-ToR pairs
         port1 port2                  port1 port2
           p0s0g0 ===== p0s0nv ===== p0s0g1              NVLink: p0s0g0 reaches rail 1
                                                          through p0s0g1

Rules:

- Rail leaves are grouped like every rail fabric (common.py): a group (a pair with
  ``nic_ports`` 2) serves D = ``switch.down_ports`` servers.
- A rail with a single ToR group (``pods`` 1 and at most D servers) is just that group:
  no spine, every pair of its GPUs shares a leaf. This is the paper's "rail switch". The
  two leaves of a dual-ToR pair are then not linked to each other: a GPU that lost its
  link to one leaf and a peer that lost its link to the other cannot talk.
- Otherwise every rail gets its own spines ``r<rail>s<i>``, shared by the pods (pods just
  multiply servers, as in rail-optimized): the rail's L = pods x groups x nic_ports leaves
  with U = radix - D uplinks need ``ceil(L * U / radix)`` spines, rounded up to a divisor
  of U (common.py), and every leaf reaches every spine only while L <= radix. Larger rails
  would need a third tier per rail, which this generator does not build (error).
- ``servers_per_pod`` defaults to the most a two-tier rail holds:
  ``floor(radix / (pods x nic_ports))`` groups of D servers.
- Oversubscription: leaf->spine links carry ``speeds.tor_agg / oversubscription.tor``;
  ``oversubscription.agg`` must stay 1 (nothing above the rail spines).
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
from topologies.generators.cuts import even, group_loads, out_of, split
from topologies.model import Fabric, FabricBuilder, LinkKind, Tier
from topologies.plan import Plan, PlanInput, nonzero


def rail_only_servers_per_pod(spec: FabricSpec) -> int:
    if spec.servers_per_pod is not None:
        return spec.servers_per_pod
    groups = spec.switch.radix // (spec.pods * spec.nic_ports)
    return groups * spec.switch.down_ports


def rail_only_leaves_per_rail(spec: FabricSpec) -> int:
    groups = tor_groups(rail_only_servers_per_pod(spec), spec.switch.down_ports)
    return spec.pods * groups * spec.nic_ports


def rail_only_spines_per_rail(spec: FabricSpec) -> int:
    """Spines of one rail; 0 when the rail is a single ToR group."""
    leaves = rail_only_leaves_per_rail(spec)
    if leaves <= spec.nic_ports:
        return 0
    return upper_switches(leaves, spec.switch.up_ports, spec.switch.radix)


class RailOnlyGenerator:
    """Rail-only: one two-tier network per rail, NVLink between rails (module docstring)."""

    kind = "rail-only"
    default_nic_ports = 1
    two_tier = True
    has_rails = True
    tier_names = {**TIER_NAMES, Tier.TOR: "rail leaf", Tier.AGG: "rail spine"}

    def check(self, spec: FabricSpec) -> None:
        radix, down = spec.switch.radix, spec.switch.down_ports
        if spec.oversubscription.agg != 1:
            raise spec.error(
                "oversubscription.agg",
                "1 (a rail-only fabric has nothing above its rail spines)",
                spec.oversubscription.agg,
            )
        if spec.pods * spec.nic_ports > radix:
            raise spec.error(
                "pods",
                f"pods x nic_ports at most the radix {radix} (every leaf of a rail needs a "
                "port on each of the rail's spines)",
                spec.pods,
            )
        leaves = rail_only_leaves_per_rail(spec)
        if leaves > radix:
            limit = (radix // (spec.pods * spec.nic_ports)) * down
            raise spec.error(
                "servers_per_pod",
                f"at most {limit} servers per pod in a rail-only fabric with two-tier rails "
                f"of radix {radix} ({down} down / {spec.switch.up_ports} up)",
                spec.servers_per_pod,
                detail=f"a rail would need {leaves} leaves but a rail spine has only {radix} ports",
            )

    def generate(self, spec: FabricSpec) -> Fabric:
        builder = FabricBuilder(spec)
        builder.gpu_forwarding = True
        servers = rail_only_servers_per_pod(spec)
        up = spec.switch.up_ports
        tors = tor_groups(servers, spec.switch.down_ports) * spec.nic_ports
        n_spines = rail_only_spines_per_rail(spec)
        leaf_up = spec.speeds.tor_agg / spec.oversubscription.tor

        leaves: dict[int, list[str]] = {rail: [] for rail in range(spec.rails)}
        for pod in range(spec.pods):
            for rail in range(spec.rails):
                for t in range(tors):
                    name = rail_tor_name(pod, rail, t)
                    leaves[rail].append(builder.add_switch(name, Tier.TOR, pod, rail, t))
        for rail in range(spec.rails):
            for i in range(n_spines):
                builder.add_switch(f"r{rail}s{i}", Tier.AGG, rail=rail, index=i)

        for pod in range(spec.pods):
            for s in range(servers):
                builder.add_server(pod, s)
        for pod in range(spec.pods):
            connect_rail_nics(builder, spec, pod, servers)
        if n_spines:
            for rail in range(spec.rails):
                for number, leaf in enumerate(leaves[rail]):
                    for u in range(up):
                        spine = round_robin(number, u, up, n_spines)
                        builder.connect(leaf, f"r{rail}s{spine}", LinkKind.TOR_AGG, leaf_up)
        return builder.build()

    def plan(self, spec: FabricSpec) -> Plan:
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
        if even(P):
            cuts["pods"] = P // 2 * rails * out_of(group_loads(S, D, n_ports), n, up)
        if even(S):
            half = group_loads(S, D, n_ports, 0, S // 2), group_loads(S, D, n_ports, S // 2)
            cuts["servers"] = P * rails * split(*half, n, up)
        if even(rails):
            # Nothing joins the rails but NVLink: half of every server's GPUs on each side.
            cuts["rails"] = P * S * (rails // 2) * spec.speeds.nvlink
        # Same rail: 1 hop on a rail switch, 3 through a rail spine; other rail: +1 NVLink hop.
        nvlink_hop = 1 if rails > 1 else 0
        hops = nvlink_hop if P * S == 1 else (3 if spines else 1) + nvlink_hop
        return Plan(spec, S, nonzero(switches), nonzero(links), hops, cuts, min(S, D))

    def plan_inputs(self, inputs: PlanInput) -> PlanInput:
        return replace(inputs, oversubscription_agg=1.0)  # nothing above the spines

    def max_servers_per_pod(self, inputs: PlanInput) -> int:
        return inputs.radix // inputs.nic_ports * inputs.down

    def max_pods(self, inputs: PlanInput) -> int:
        return 1  # compared as one pod (pods only relabel servers)

    def uniform_uplinks(self, spec: FabricSpec) -> bool:
        return True  # spines are sized to a divisor of the uplinks (common.py)
