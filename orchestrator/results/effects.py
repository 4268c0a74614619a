"""A policy comparison split into its two causes: the switch policy and the host's NIC ports.

A measurement under (switch policy, ``host_ports``) (orchestrator/testbed/hostports.py)
mixes what the switches do with what the hosts do. Measured on every pair, side by side,
the two effects come apart as ratios of one figure (achieved/ideal, busbw/rail, ...):

- the host-port effect of a policy: its figure under ``balanced`` over its figure under
  ``hash`` (same switches, the hosts spread their NIC ports or hash them);
- the switch-policy effect of a policy under one ``host_ports``: its figure over the
  baseline policy's under the same ``host_ports`` (same hosts, other switches).

The gap between the baseline under ``hash`` and a policy under ``balanced`` (what
comparing ``ecmp`` with ``path-pinned`` measured before the setting existed) is the product
of one effect of each kind, in either order: ``host ports (baseline) x switch policy
(balanced)`` or ``switch policy (hash) x host ports (policy)``. The two orders differ when
the causes interact (on a dual-ToR fabric under ECMP the switches also hash the receiving
NIC port, so spreading the sending one alone helps little): :func:`split_gap` gives both.
Pure; the benchmarks print it (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Arm = tuple[str, str]  # (switch policy, host_ports)


def ratio(a: float, b: float) -> float:
    """a / b, NaN where b is zero or either is missing (NaN)."""
    if math.isnan(a) or math.isnan(b) or b == 0:
        return math.nan
    return a / b


def host_port_effect(values: Mapping[Arm, float], policy: str) -> float:
    """``policy``'s figure under balanced over under hash (NaN unless both were measured)."""
    return ratio(values.get((policy, "balanced"), math.nan), values.get((policy, "hash"), math.nan))


def switch_policy_effect(
    values: Mapping[Arm, float], policy: str, host_ports: str, baseline: str
) -> float:
    """``policy``'s figure over ``baseline``'s, both under ``host_ports``."""
    return ratio(
        values.get((policy, host_ports), math.nan), values.get((baseline, host_ports), math.nan)
    )


@dataclass(frozen=True)
class GapSplit:
    """``policy``/balanced over ``baseline``/hash, and the two ways it splits in two."""

    baseline: str
    policy: str
    total: float
    host_ports_first: float  # the baseline's host-port effect ...
    switch_policy_then: float  # ... times the switch-policy effect under balanced
    switch_policy_first: float  # the switch-policy effect under hash ...
    host_ports_then: float  # ... times the policy's host-port effect

    def describe(self) -> str:
        b, p = self.baseline, self.policy
        return (
            f"{b}/hash -> {p}/balanced: x{self.total:.2f} = host ports x"
            f"{self.host_ports_first:.2f} ({b}) x switch policy x{self.switch_policy_then:.2f}"
            f" (balanced) = switch policy x{self.switch_policy_first:.2f} (hash) x host ports"
            f" x{self.host_ports_then:.2f} ({p})"
        )


def split_gap(values: Mapping[Arm, float], policy: str, baseline: str) -> GapSplit:
    """The gap between ``baseline`` under hash and ``policy`` under balanced, split."""
    total = ratio(
        values.get((policy, "balanced"), math.nan), values.get((baseline, "hash"), math.nan)
    )
    return GapSplit(
        baseline,
        policy,
        total,
        host_port_effect(values, baseline),
        switch_policy_effect(values, policy, "balanced", baseline),
        switch_policy_effect(values, policy, "hash", baseline),
        host_port_effect(values, policy),
    )


def baseline_of(policies: Sequence[str], wanted: str) -> str:
    """The policy the others are compared with: ``wanted`` if it was measured, else the
    first measured."""
    return wanted if wanted in policies else policies[0]
