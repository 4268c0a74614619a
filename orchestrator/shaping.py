"""How an emulated link is shaped: rendered as tc argument lists, applied by the emulation.

Pure data (STYLE.md: render, then check, then start). Each end of a link shapes its own
egress, so both directions carry the configured rate.

Recipe (provisional; docs/fidelity.md holds the measurements that justify it): one HTB class
per interface at the link rate with burst and cburst of 15 kB, and a pfifo leaf. Measured
here, this held 0.92 of the configured rate with 8 flows and fairness 1.00, where Mininet's
TCLink set-up gave 0.77.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShapingRecipe:
    """Parameters of the HTB shaper. Defaults are the measured recipe."""

    burst_bytes: int = 15_000
    cburst_bytes: int = 15_000
    leaf_limit_packets: int = 1000


DEFAULT_RECIPE = ShapingRecipe()


def _kbit(rate_bps: float) -> str:
    return f"{max(1, round(rate_bps / 1000))}kbit"


def shaping_commands(
    intf: str, rate_bps: float, recipe: ShapingRecipe = DEFAULT_RECIPE
) -> list[list[str]]:
    """tc commands (argv lists) that shape ``intf``'s egress to ``rate_bps``.

    Run them in the namespace that owns ``intf``. The root qdisc replaces whatever is
    there, so applying twice is harmless.
    """
    rate = _kbit(rate_bps)
    return [
        ["tc", "qdisc", "replace", "dev", intf, "root", "handle", "1:", "htb", "default", "1"],
        [
            "tc",
            "class",
            "replace",
            "dev",
            intf,
            "parent",
            "1:",
            "classid",
            "1:1",
            "htb",
            "rate",
            rate,
            "ceil",
            rate,
            "burst",
            str(recipe.burst_bytes),
            "cburst",
            str(recipe.cburst_bytes),
        ],
        [
            "tc",
            "qdisc",
            "replace",
            "dev",
            intf,
            "parent",
            "1:1",
            "handle",
            "10:",
            "pfifo",
            "limit",
            str(recipe.leaf_limit_packets),
        ],
    ]


def unshaping_commands(intf: str) -> list[list[str]]:
    """Remove the shaper (ignore the error if the interface is already gone)."""
    return [["tc", "qdisc", "del", "dev", intf, "root"]]
