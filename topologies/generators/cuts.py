"""Closed-form min-cuts, shared by the kinds' plans (``Generator.plan``).

Each is derived for the tree-like tiers: isolating a group of GPUs costs, per ToR, either
its GPUs' NIC links or its uplinks, whichever is cheaper (the planner's docstring states
what a cut is and when one is computed). A *plane* is the set of ToRs below one shared
upper layer (Astral: a rail plane of a pod; fat-tree: a pod; rail kinds: the ToRs of one
(pod, rail)); ``loads`` are GPUs per ToR.
"""

from __future__ import annotations

from collections.abc import Sequence

from topologies.fabricspec import FabricSpec
from topologies.generators.common import tor_groups


def group_loads(
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


def out_of(loads: Sequence[int], nic: float, up: float) -> float:
    """Least capacity that isolates whole ToRs' GPUs from above: per ToR, GPUs or uplinks."""
    return sum(min(load * nic, up) for load in loads)


def split(a: Sequence[int], b: Sequence[int], nic: float, up: float) -> float:
    """Min-cut between the A and B GPUs of one plane whose ToRs share the layer above.

    The layer above sits wholly on one side (mixing never helps: the cost is concave in how
    many upper switches are on each side); each ToR then takes the cheaper side.
    """
    above_a = sum(min(nb * nic, na * nic + up) for na, nb in zip(a, b, strict=True))
    above_b = sum(min(na * nic, nb * nic + up) for na, nb in zip(a, b, strict=True))
    return min(above_a, above_b)


def even(n: int) -> bool:
    return n > 1 and n % 2 == 0


def rail_plane_cuts(
    spec: FabricSpec, servers: int, up: float, plane_out: float
) -> dict[str, float]:
    """The aligned cuts of a fabric of rail planes (one per pod and rail, ``servers`` servers
    each, ``up`` uplink capacity per ToR) that meet only above their ToRs: halving the pods
    or the rails cuts whole planes off the layer above (``plane_out`` each), halving the
    servers splits every plane."""
    P, rails, n_ports = spec.pods, spec.rails, spec.nic_ports
    D, n, S = spec.switch.down_ports, spec.speeds.nic, servers
    cuts = {}
    if even(P):
        cuts["pods"] = P // 2 * rails * plane_out
    if even(S):
        half = group_loads(S, D, n_ports, 0, S // 2), group_loads(S, D, n_ports, S // 2)
        cuts["servers"] = P * rails * split(*half, n, up)
    if even(rails):
        cuts["rails"] = rails // 2 * P * plane_out
    return cuts
