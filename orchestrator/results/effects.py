"""A policy comparison split into its two causes: the switch policy and the host's NIC ports.

A measurement under (switch policy, ``host_ports``) (orchestrator/testbed/hostports.py)
mixes what the switches do with what the hosts do. Measured on every pair, side by side,
the two effects come apart as ratios of one figure (achieved/ideal, busbw/rail, ...):

- the host-port effect of a policy: its figure under ``balanced`` over its figure under
  ``hash`` (same switches, the hosts spread their NIC ports or hash them);
- the switch-policy effect of a policy under one ``host_ports``: its figure over the
  baseline policy's under the same ``host_ports`` (same hosts, other switches).

The gap between the baseline under ``hash`` and a policy under ``balanced`` (what
comparing ``ecmp`` with ``path-pinned`` measured before the setting existed) is then the
product of the two: ``host-port effect (baseline) x switch-policy effect (balanced)``, which
:func:`split_gap` returns with it. Pure; the benchmarks print it (docs/benchmarks.md).
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
    """``policy``/balanced over ``baseline``/hash, and the two factors it is made of."""

    baseline: str
    policy: str
    total: float
    host_ports: float  # the baseline's host-port effect
    switch_policy: float  # the policy's switch-policy effect under balanced

    def describe(self) -> str:
        return (
            f"{self.baseline}/hash -> {self.policy}/balanced: x{self.total:.2f} = host ports "
            f"x{self.host_ports:.2f} ({self.baseline}: balanced/hash) x switch policy "
            f"x{self.switch_policy:.2f} (balanced: {self.policy}/{self.baseline})"
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
    )


def baseline_of(policies: Sequence[str], wanted: str) -> str:
    """The policy the others are compared with: ``wanted`` if it was measured, else the
    first measured."""
    return wanted if wanted in policies else policies[0]
