"""Sizing and wiring rules shared by the rail-based generators (and the planner).

Three rules recur in every kind, so they live here once:

- **ToR groups.** A ToR gives one down port to each of D GPUs of its rail. With dual-ToR
  (``nic_ports`` 2) the two ports of a NIC go to the two ToRs of a *group* (a pair), with
  single-ToR a group is one ToR; either way a group serves D servers, so a rail of S servers
  needs ``ceil(S / D)`` groups and ``nic_ports`` times as many ToRs. Server s sits in group
  ``s // D``; its GPU of rail r puts NIC port i (1-based) on ToR ``group * nic_ports + i - 1``.
- **Packing a tier above.** L lower switches with U uplinks each need at least
  ``ceil(L * U / R)`` upper switches of radix R; :func:`upper_switches` takes the smallest
  *divisor of U* from there, so that every lower switch links equally often (U / n_upper
  parallel links) to every upper switch: equal ECMP weights, and no cut of the fabric is
  narrower than the tier's capacity says. Uplinks are dealt round-robin: uplink u of lower
  switch l goes to upper switch ``(l * U + u) % n_upper``. Every upper switch then
  terminates at most R links, and every lower switch reaches every upper switch exactly
  when ``n_upper <= U``. (astral.py's core groups use the plain ``ceil``; see
  ``planner.uniform_uplinks``.)
- **Oversubscription divides the uplink capacity** of a tier (astral.py's docstring).
"""

from __future__ import annotations

from topologies.fabricspec import FabricSpec
from topologies.model import FabricBuilder, LinkKind, Tier

# What the model's tiers are called, unless a kind names them otherwise (its tier_names).
TIER_NAMES = {Tier.TOR: "ToR", Tier.AGG: "aggregation", Tier.CORE: "core", Tier.NVLINK: "NVLink"}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tor_groups(servers: int, down_ports: int) -> int:
    """ToR groups (pairs with dual-ToR) one rail of ``servers`` servers needs."""
    return ceil_div(servers, down_ports)


def packed_uppers(lower_switches: int, uplinks: int, radix: int) -> int:
    """The fewest upper-tier switches that terminate ``lower_switches * uplinks`` links."""
    return ceil_div(lower_switches * uplinks, radix)


def upper_switches(lower_switches: int, uplinks: int, radix: int) -> int:
    """Upper-tier switches for ``lower_switches`` with ``uplinks`` each: the smallest divisor
    of ``uplinks`` that terminates them all (the plain minimum when it exceeds ``uplinks``:
    then the fabric cannot be wired and the generator's check says so)."""
    need = packed_uppers(lower_switches, uplinks, radix)
    return next((d for d in range(need, uplinks + 1) if uplinks % d == 0), need)


def round_robin(lower: int, uplink: int, uplinks: int, n_upper: int) -> int:
    """Index of the upper switch that uplink ``uplink`` of lower switch ``lower`` goes to."""
    return (lower * uplinks + uplink) % n_upper


def rail_tor_name(pod: int, rail: int, index: int) -> str:
    return f"p{pod}r{rail}t{index}"


def connect_rail_nics(builder: FabricBuilder, spec: FabricSpec, pod: int, servers: int) -> None:
    """NIC links of one pod of a rail fabric: GPU port i -> ToR i of its server's group."""
    down, n_ports = spec.switch.down_ports, spec.nic_ports
    for s in range(servers):
        group = s // down
        for rail in range(spec.rails):
            for port in range(n_ports):
                tor = rail_tor_name(pod, rail, group * n_ports + port)
                builder.connect(f"p{pod}s{s}g{rail}", tor, LinkKind.NIC, spec.speeds.nic)
