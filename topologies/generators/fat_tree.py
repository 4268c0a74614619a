"""The k-ary fat-tree of Al-Fares et al. (SIGCOMM 2008), with GPUs as its hosts.

k = ``switch.radix``; every switch splits k/2 down, k/2 up. Shown for k = 4, two pods::

               c0          c1              core: k/2 groups (group i = agg index i) of
              /  \\        /  \\                   ceil(pods / 2) switches; k/2 x k/2 cores
             /    \\      /    \\                  when pods = k (the full fat-tree)
        +---+------\\----+--+   \\
        |    +------+---+-----+--+
      p0a0  p0a1          p1a0  p1a1           agg: k/2 per pod, each linked to every edge
        | \\  / |            | \\  / |                 of its pod and to its core group
        |  \\/  |            |  \\/  |
        |  /\\  |            |  /\\  |
      p0t0  p0t1          p1t0  p1t1           edge (tier "tor"): k/2 per pod, k/2 GPU ports
      /  \\    /  \\         ...
   p0s0g0 p0s0g1 p0s1g0 p0s1g1                 GPUs, one NIC port each (``nic_ports`` 1)
     \\__p0s0nv_/  \\__p0s1nv_/                   NVLink switch per server (not a network path)

Rules:

- ``switch.down_ports`` must be k/2 and k even; ``pods`` at most k; ``nic_ports`` must be 1
  (a fat-tree host has one port; dual-homing is what the rail kinds are for).
- A pod has k/2 x k/2 GPU ports. GPUs fill them in rank order (pod, server, GPU), k/2 per
  edge, so a server sits under one edge switch whenever ``gpus_per_server`` divides k/2 and
  spans consecutive edges otherwise (the fat-tree is not rail-optimized: GPU index means
  nothing to the network). ``servers_per_pod`` defaults to filling the pod, which needs
  ``gpus_per_server`` to divide (k/2)^2.
- Every pod keeps all k/2 edge and k/2 agg switches even when partly filled.
- Cores: with one pod there is no core tier. Otherwise agg i of every pod deals its k/2
  uplinks round-robin over core group i, which has ``ceil(pods / 2)`` switches (one per k
  uplinks arriving) rounded up to a divisor of k/2, so each agg has the same number of
  links to each core of its group (common.py). With ``pods = k`` that is the classic
  (k/2)^2 cores, each agg linked once to each core of its group; with fewer pods it is
  fewer cores with parallel links instead of (k/2)^2 part-empty ones (the planner compares
  kinds on this basis).
- Oversubscription divides uplink capacity: edge->agg links carry ``speeds.tor_agg /
  oversubscription.tor``, agg->core ``speeds.agg_core / oversubscription.agg``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from topologies.fabricspec import FabricSpec
from topologies.generators.common import TIER_NAMES, ceil_div, round_robin, upper_switches
from topologies.generators.cuts import even, out_of, split
from topologies.model import Fabric, FabricBuilder, LinkKind, Tier
from topologies.plan import Plan, PlanInput, nonzero


def fat_tree_ports_per_pod(spec: FabricSpec) -> int:
    half = spec.switch.radix // 2
    return half * half


def fat_tree_servers_per_pod(spec: FabricSpec) -> int:
    """Servers per pod: as given, else as many as fill the pod's (k/2)^2 GPU ports."""
    if spec.servers_per_pod is not None:
        return spec.servers_per_pod
    return fat_tree_ports_per_pod(spec) // spec.gpus_per_server


def fat_tree_cores_per_group(spec: FabricSpec) -> int:
    """Cores per group (k/2 groups); 0 when a single pod needs no core tier."""
    half = spec.switch.radix // 2
    return 0 if spec.pods == 1 else upper_switches(spec.pods, half, spec.switch.radix)


class FatTreeGenerator:
    """The k-ary fat-tree, GPUs as its hosts (drawn in the module docstring)."""

    kind = "fat-tree"
    default_nic_ports = 1
    two_tier = False
    has_rails = False  # GPU index means nothing to a fat-tree
    tier_names = {**TIER_NAMES, Tier.TOR: "edge"}

    def check(self, spec: FabricSpec) -> None:
        k = spec.switch.radix
        if k % 2:
            raise spec.error("switch.radix", "an even radix k (a k-ary fat-tree)", k)
        if spec.switch.down_ports != k // 2:
            raise spec.error(
                "switch.down_ports",
                f"k/2 = {k // 2} (a fat-tree switch splits its {k} ports half down, half up)",
                spec.switch.down_ports,
            )
        if spec.nic_ports != 1:
            raise spec.error(
                "nic_ports",
                "1 (a fat-tree host has one NIC port; use rail-optimized for dual-ToR)",
                spec.nic_ports,
            )
        if spec.pods > k:
            raise spec.error("pods", f"at most k = {k} pods in a {k}-ary fat-tree", spec.pods)
        ports = fat_tree_ports_per_pod(spec)
        gpus = spec.gpus_per_server
        if spec.servers_per_pod is None:
            if gpus > ports or ports % gpus:
                raise spec.error(
                    "gpus_per_server",
                    f"a divisor of the {ports} GPU ports of a pod (k/2 x k/2), or set "
                    "servers_per_pod",
                    gpus,
                )
        elif spec.servers_per_pod * gpus > ports:
            raise spec.error(
                "servers_per_pod",
                f"at most {ports // gpus} servers of {gpus} GPUs per pod ({ports} GPU ports "
                f"with k = {k})",
                spec.servers_per_pod,
            )

    def generate(self, spec: FabricSpec) -> Fabric:
        builder = FabricBuilder(spec)
        half = spec.switch.radix // 2
        servers = fat_tree_servers_per_pod(spec)
        per_group = fat_tree_cores_per_group(spec)
        edge_up = spec.speeds.tor_agg / spec.oversubscription.tor
        agg_up = spec.speeds.agg_core / spec.oversubscription.agg

        for pod in range(spec.pods):
            for i in range(half):
                builder.add_switch(f"p{pod}t{i}", Tier.TOR, pod=pod, index=i)
            for i in range(half):
                builder.add_switch(f"p{pod}a{i}", Tier.AGG, pod=pod, index=i)
        for c in range(half * per_group):
            builder.add_switch(f"c{c}", Tier.CORE, index=c)

        for pod in range(spec.pods):
            for s in range(servers):
                builder.add_server(pod, s)
        for pod in range(spec.pods):
            for slot in range(servers * spec.gpus_per_server):
                s, gpu = divmod(slot, spec.gpus_per_server)
                edge = f"p{pod}t{slot // half}"
                builder.connect(f"p{pod}s{s}g{gpu}", edge, LinkKind.NIC, spec.speeds.nic)
        for pod in range(spec.pods):
            for e in range(half):
                for a in range(half):
                    builder.connect(f"p{pod}t{e}", f"p{pod}a{a}", LinkKind.TOR_AGG, edge_up)
        if per_group:
            for pod in range(spec.pods):
                for a in range(half):
                    for u in range(half):
                        core = a * per_group + round_robin(pod, u, half, per_group)
                        builder.connect(f"p{pod}a{a}", f"c{core}", LinkKind.AGG_CORE, agg_up)
        return builder.build()

    def plan(self, spec: FabricSpec) -> Plan:
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

        def edge_loads(a_below: Callable[[int], int]) -> tuple[list[int], list[int]]:
            """GPUs of side A and side B on each edge; ``a_below(x)`` counts the slots of
            side A below slot ``x`` (in closed form: a pod may have billions of slots)."""
            a_loads, b_loads = [], []
            for e in range(h):
                lo, hi = e * h, max(e * h, min(slots, (e + 1) * h))
                na = a_below(hi) - a_below(lo)
                a_loads.append(na)
                b_loads.append(hi - lo - na)
            return a_loads, b_loads

        def first_rails(x: int) -> int:
            """Slots below ``x`` whose GPU is in the first half of its server's."""
            return x // gps * (gps // 2) + min(x % gps, gps // 2)

        loads = [max(0, min(slots, (e + 1) * h) - e * h) for e in range(h)]
        cuts = {}
        if even(P):
            cuts["pods"] = P // 2 * min(out_of(loads, n, h * t), h * h * a)
        if even(S):
            cuts["servers"] = P * split(*edge_loads(lambda x: min(x, S // 2 * gps)), n, h * t)
        if even(gps):
            cuts["rails"] = P * split(*edge_loads(first_rails), n, h * t)
        used_edges = ceil_div(slots, h)
        hops = 5 if per_group else (3 if used_edges > 1 else 1)
        return Plan(spec, S, nonzero(switches), nonzero(links), hops, cuts, min(h, slots))

    def plan_inputs(self, inputs: PlanInput) -> PlanInput:
        # A fat-tree host has one NIC port, and a fat-tree switch splits k/2 down, k/2 up.
        return replace(inputs, nic_ports=1, down_ports=None)

    def max_servers_per_pod(self, inputs: PlanInput) -> int:
        return (inputs.radix // 2) ** 2 // inputs.rails

    def max_pods(self, inputs: PlanInput) -> int:
        return inputs.radix

    def uniform_uplinks(self, spec: FabricSpec) -> bool:
        return True  # core groups are sized to a divisor of the uplinks (common.py)
