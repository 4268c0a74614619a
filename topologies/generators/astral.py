"""Astral's same-rail tier-2 fabric with dual-ToR (docs/astral.md, "The network").

One rail plane per GPU index, per pod; core switches join the planes and the pods::

                 c0    c1          c2    c3            core: group a joins every
                 | \\  / |          | \\  / |                  plane's agg a
           +-----+--\\/--+----------+--\\/--+-----+
           |     |  /\\  |          |  /\\  |     |
         p0r0a0 p0r0a1  ...      p1r1a0 p1r1a1        agg: per (pod, rail), U of them
           |  \\  /  |                                      (one link to every ToR)
           |   \\/   |
           |   /\\   |
         p0r0t0  p0r0t1   ...                          ToR: per (pod, rail); t0/t1 are a
            \\      /                                   dual-ToR pair serving D servers
             port1 port2
               p0s0g0  (rail 0 of server p0s0)        GPU: NIC port i -> ToR i of the pair
                  |
               p0s0nv  (NVLink switch of server p0s0, joins p0s0g0..g{rails-1})

Dimensioning from the switch radix R split into D down and U = R - D up ports:

- a ToR takes one port from each of D GPUs of its rail: a ToR group (a dual-ToR pair, or a
  single ToR when ``nic_ports`` is 1) serves D servers;
- a rail plane of a pod has ``ceil(servers / D) * nic_ports`` ToRs, at most D (the
  aggregation switches' down ports) and U aggregation switches (every ToR uplink goes to a
  different aggregation switch);
- every aggregation switch has U uplinks into its core group (group = its index a), which
  has ``ceil(pods * rails * U / R)`` cores; uplinks are dealt round-robin, so each
  aggregation switch reaches every core of its group when U >= that count.

At the paper's R = 256, D = 128, 8 rails, dual-ToR this gives 128 GPUs per ToR, 8,192 GPUs
per rail plane and 65,536 per pod (``topologies.planner`` does the full-size arithmetic).
Oversubscription divides uplink capacities: ``oversubscription.agg: 15`` makes every
agg->core link carry 1/15 of ``speeds.agg_core`` (an HPN-style 15:1 core).
"""

from __future__ import annotations

import math

from topologies.fabricspec import FabricSpec
from topologies.generators.common import TIER_NAMES, tor_groups
from topologies.generators.cuts import group_loads, out_of, rail_plane_cuts
from topologies.model import Fabric, FabricBuilder, LinkKind, Tier
from topologies.plan import Plan, PlanInput, nonzero


def _tor_groups(spec: FabricSpec) -> int:
    servers = astral_servers_per_pod(spec)
    return math.ceil(servers / spec.switch.down_ports)


def astral_servers_per_pod(spec: FabricSpec) -> int:
    """Servers per pod: as given, else the most the radix allows (D * D / nic_ports)."""
    if spec.servers_per_pod is not None:
        return spec.servers_per_pod
    down = spec.switch.down_ports
    return down * (down // spec.nic_ports)


def cores_per_group(spec: FabricSpec) -> int:
    """Core switches per core group (one group per aggregation index)."""
    uplinks = spec.pods * spec.rails * spec.switch.up_ports
    return math.ceil(uplinks / spec.switch.radix)


def has_core(spec: FabricSpec) -> bool:
    return spec.pods * spec.rails > 1


class AstralGenerator:
    """Astral's same-rail tier-2 fabric with dual-ToR (drawn in the module docstring)."""

    kind = "astral"
    default_nic_ports = 2  # dual-ToR, the paper's design
    two_tier = False
    has_rails = True
    tier_names = TIER_NAMES

    def check(self, spec: FabricSpec) -> None:
        down, up = spec.switch.down_ports, spec.switch.up_ports
        if down < spec.nic_ports:
            # An aggregation switch takes both ToRs of a dual-ToR pair on its down ports;
            # with one down port the default pod would hold no server at all.
            raise spec.error(
                "switch.down_ports",
                f"at least {spec.nic_ports} down ports (an aggregation switch must reach "
                "both ToRs of a dual-ToR pair)",
                down,
            )
        tors = _tor_groups(spec) * spec.nic_ports
        if tors > down:
            limit = down * (down // spec.nic_ports)
            raise spec.error(
                "servers_per_pod",
                f"at most {limit} servers per pod with radix "
                f"{spec.switch.radix} split {down} down / {up} up and {spec.nic_ports} NIC "
                "port(s)",
                spec.servers_per_pod,
                detail=f"a rail plane would need {tors} ToRs but an aggregation switch has "
                f"only {down} down ports",
            )
        if has_core(spec) and cores_per_group(spec) > up:
            raise spec.error(
                "pods",
                "few enough pods x rails that every aggregation switch reaches every "
                f"core of its group ({up} uplinks)",
                spec.pods,
                detail=f"the core group would need {cores_per_group(spec)} switches",
            )

    def generate(self, spec: FabricSpec) -> Fabric:
        builder = FabricBuilder(spec)
        servers = astral_servers_per_pod(spec)
        down, up = spec.switch.down_ports, spec.switch.up_ports
        groups = _tor_groups(spec)
        n_ports = spec.nic_ports
        tor_up = spec.speeds.tor_agg / spec.oversubscription.tor
        agg_up = spec.speeds.agg_core / spec.oversubscription.agg

        for pod in range(spec.pods):
            for rail in range(spec.rails):
                for t in range(groups * n_ports):
                    builder.add_switch(f"p{pod}r{rail}t{t}", Tier.TOR, pod, rail, t)
                for a in range(up):
                    builder.add_switch(f"p{pod}r{rail}a{a}", Tier.AGG, pod, rail, a)
        n_core = cores_per_group(spec) if has_core(spec) else 0
        for a in range(up):
            for j in range(n_core):
                builder.add_switch(f"c{a * n_core + j}", Tier.CORE, index=a * n_core + j)

        for pod in range(spec.pods):
            for s in range(servers):
                builder.add_server(pod, s)
        # NIC links: GPU port i (1-based) -> ToR i of its group; group = server // D.
        for pod in range(spec.pods):
            for s in range(servers):
                group = s // down
                for rail in range(spec.rails):
                    for port in range(n_ports):
                        tor = f"p{pod}r{rail}t{group * n_ports + port}"
                        builder.connect(f"p{pod}s{s}g{rail}", tor, LinkKind.NIC, spec.speeds.nic)
        for pod in range(spec.pods):
            for rail in range(spec.rails):
                for t in range(groups * n_ports):
                    for a in range(up):
                        builder.connect(
                            f"p{pod}r{rail}t{t}", f"p{pod}r{rail}a{a}", LinkKind.TOR_AGG, tor_up
                        )
        if n_core:
            for pod in range(spec.pods):
                for rail in range(spec.rails):
                    plane = pod * spec.rails + rail
                    for a in range(up):
                        for u in range(up):
                            core = a * n_core + (plane * up + u) % n_core
                            builder.connect(
                                f"p{pod}r{rail}a{a}", f"c{core}", LinkKind.AGG_CORE, agg_up
                            )
        return builder.build()

    def plan(self, spec: FabricSpec) -> Plan:
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
        loads = group_loads(S, D, n_ports)
        plane_out = min(out_of(loads, n, U * t), U * U * a) if core else out_of(loads, n, U * t)
        cuts = rail_plane_cuts(spec, S, U * t, plane_out)
        hops = 5 if core else (3 if tors > n_ports else 1)
        return Plan(spec, S, nonzero(switches), nonzero(links), hops, cuts, min(S, D))

    def plan_inputs(self, inputs: PlanInput) -> PlanInput:
        return inputs

    def max_servers_per_pod(self, inputs: PlanInput) -> int:
        return inputs.down * (inputs.down // inputs.nic_ports)

    def max_pods(self, inputs: PlanInput) -> int:
        return max(1, inputs.radix // inputs.rails)  # every agg reaches its whole core group

    def uniform_uplinks(self, spec: FabricSpec) -> bool:
        """Astral's core groups have ``ceil(pods x rails x U / radix)`` cores, and when that
        does not divide U some planes put one link more on some cores than on others; a cut
        that puts the planes with the same surplus on one side (the ``rails`` cut, typically)
        is then narrower than the closed form, which is exact only for uniform fabrics. The
        paper's size is uniform (32 cores per group, 128 uplinks)."""
        return not has_core(spec) or spec.switch.up_ports % cores_per_group(spec) == 0
