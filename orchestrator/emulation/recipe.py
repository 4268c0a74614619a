"""The emulator's recipe: how links are shaped and how large the GPUs' TCP packets are.

A recipe is selected by name (``$ASTRAL_RECIPE``, default :data:`DEFAULT_RECIPE_NAME`) and
recorded wherever a measurement is (the fabric description's ``extra``, calibrations,
``astral doctor``), so that ``benchmarks/capacity.py`` and ``benchmarks/fidelity.py
--recipe`` can compare recipes side by side in one run. docs/capacity.md has the
measurements behind each.

Why packet size is part of the recipe: ovs-vswitchd's userspace datapath pays a cost per
packet per switch (a receive system call's share, a copy to and from user space, a lookup,
the kernel's transmit path through the shaper and the veth), whatever the packet's size.
The GPUs' TCP hands its NIC GSO packets of ``gso_segments`` segments, which stay whole
through every switch (userspace TSO), so the segments per packet set the emulator's
capacity in bytes. They also set how coarse the queues are: the switch queues count
packets (orchestrator.emulation.shaping), and fairness between flows depends on it.

``small-packets`` (the default): 4 segments (6 kB) and one FIFO per link, the recipe the
fidelity benchmark's targets were met with.

The candidates below carry more per packet; each is measured against the fidelity
targets in docs/capacity.md, and none has met them all yet:

- ``medium-packets``, ``large-packets``: 16 and 44 segments (24 kB and 64 kB, the largest
  GSO packet), one FIFO per link;
- ``flow-queues``: 44 segments, and 16 per-flow queues on every link (a hash of addresses
  and ports picks one of 16 HTB classes that share the link round robin in bytes), so
  that fairness does not rest on equal packet sizes;
- ``flow-queues-1024``: the same with 1024 classes on the switch ports only (the GPUs' NICs
  keep one FIFO), so that few flows share a class; slow to bring up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from orchestrator.emulation.shaping import DEFAULT_RECIPE as _FIFO_SHAPING
from orchestrator.emulation.shaping import ShapingRecipe
from topologies.errors import ConfigError

ENV_VAR = "ASTRAL_RECIPE"


@dataclass(frozen=True)
class EmulatorRecipe:
    """One way of emulating links: the shapers and the GPUs' TCP packet size."""

    name: str
    shaping: ShapingRecipe
    #: Segments in every TCP packet a GPU sends (tcp_min_tso_segs and gso_max_segs).
    gso_segments: int
    summary: str

    def describe(self) -> str:
        return f"{self.name} ({self.summary})"


def _fifo(name: str, segments: int) -> EmulatorRecipe:
    summary = f"{segments}-segment TCP packets, one FIFO per link"
    return EmulatorRecipe(name, _FIFO_SHAPING, gso_segments=segments, summary=summary)


RECIPES = {
    recipe.name: recipe
    for recipe in (
        _fifo("small-packets", 4),
        _fifo("medium-packets", 16),
        _fifo("large-packets", 44),
        EmulatorRecipe(
            "flow-queues",
            replace(_FIFO_SHAPING, flow_queues=16),
            gso_segments=44,
            summary="44-segment TCP packets, 16 flow queues per link",
        ),
        EmulatorRecipe(
            "flow-queues-1024",
            replace(_FIFO_SHAPING, flow_queues=1024, host_flow_queues=False),
            gso_segments=44,
            summary="44-segment TCP packets, 1024 flow queues per link",
        ),
    )
}
DEFAULT_RECIPE_NAME = "small-packets"


def recipe_named(name: str, source: str = "--recipe") -> EmulatorRecipe:
    """The recipe called ``name``; a ConfigError naming ``source`` (where the name was
    read) and the known names otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ConfigError(None, source, f"an emulator recipe: {', '.join(RECIPES)}", name) from None


def current_recipe() -> EmulatorRecipe:
    """The recipe this process emulates with: ``$ASTRAL_RECIPE`` or the default."""
    return recipe_named(os.environ.get(ENV_VAR) or DEFAULT_RECIPE_NAME, f"${ENV_VAR}")
