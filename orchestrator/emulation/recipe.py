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

``small-packets``: 4 segments (6 kB) and one FIFO per link, the recipe the fidelity
benchmark's targets were first met with; the default below 40 Mbit/s per link, where
``jumbo-packets`` (the default, below) is exactly this recipe.

The candidates below carry more per packet; each is measured against the fidelity
targets in docs/capacity.md:

- ``medium-packets``, ``large-packets``: 16 and 44 segments (24 kB and 64 kB, the largest
  GSO packet), one FIFO per link;
- ``flow-queues``: 44 segments, and 16 per-flow queues on every link (a hash of addresses
  and ports picks one of 16 HTB classes that share the link round robin in bytes), so
  that fairness does not rest on equal packet sizes;
- ``flow-queues-1024``: the same with 1024 classes on the switch ports only (the GPUs' NICs
  keep one FIFO), so that few flows share a class; slow to bring up;
- ``scaled-packets``: ``small-packets`` while the slowest fabric link is under 40 Mbit/s;
  at F x 20 Mbit/s (F >= 2) every packet carries F times the segments (4F, at most 44)
  and every packet-counted queue keeps the depth in packets it has at 20 Mbit/s. The
  emulator's cost is per packet, so its capacity in bytes grows with F; but TCP grows its
  window by segments, so with F segments per packet flows converge F times slower;
- ``jumbo-packets``: the same scale F applied to the frames instead (an MTU of 1500 x F,
  at most 15000; 4 segments per packet). TCP's window, growth and losses are then the
  reference's counted in packets: at F x R the recipe is the reference at R in time,
  with F times the bytes per packet. The one that keeps the fidelity targets at 80 and
  160 Mbit/s, at 3.9x the capacity of ``small-packets`` (docs/capacity.md): the default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from orchestrator.emulation.shaping import DEFAULT_RECIPE as _FIFO_SHAPING
from orchestrator.emulation.shaping import ShapingRecipe
from topologies.errors import ConfigError
from topologies.model import LinkKind
from topologies.units import tcp_payload_share

if TYPE_CHECKING:
    from topologies.description import FabricDescription
    from topologies.fabricspec import FabricSpec

ENV_VAR = "ASTRAL_RECIPE"
#: The largest GSO packet TCP builds: 64 kB of 1448-byte segments.
MAX_GSO_SEGMENTS = 44
#: Ethernet's MTU, and the largest jumbo frame ``jumbo-packets`` uses.
BASE_MTU = 1500
MAX_MTU = 15000


@dataclass(frozen=True)
class EmulatorRecipe:
    """One way of emulating links: the shapers and the GPUs' TCP packet size."""

    name: str
    shaping: ShapingRecipe
    #: Segments in every TCP packet a GPU sends (tcp_min_tso_segs and gso_max_segs).
    gso_segments: int
    summary: str
    #: The slowest fabric link's rate at which packets are the reference's; at F times it
    #: they carry F times the bytes (0: packets never scale).
    reference_bps: float = 0.0
    #: The factor F fitted to a fabric (:meth:`fitted`); 1 until then.
    packet_scale: int = 1
    #: Scale the frames (MTU = 1500 x F, at most MAX_MTU) rather than the segments per packet.
    scale_mtu: bool = False

    @property
    def mtu(self) -> int:
        """The fabric's MTU under this recipe (as fitted)."""
        return BASE_MTU * self.packet_scale if self.scale_mtu else BASE_MTU

    def describe(self) -> str:
        return f"{self.name} ({self.summary})"

    @property
    def payload_share(self) -> float:
        """TCP's payload per byte the shapers count, with the fitted frames."""
        return tcp_payload_share(self.mtu)

    @property
    def segments(self) -> int:
        """Segments in every TCP packet a GPU sends, with the fitted scale."""
        return self.gso_segments if self.scale_mtu else self.gso_segments * self.packet_scale

    def scale_for(self, slowest_bps: float) -> int:
        """The packet scale F for a fabric whose slowest link runs at ``slowest_bps``: its
        whole multiple of the reference rate, within the largest packet (44 segments, or
        a frame of MAX_MTU)."""
        if not self.reference_bps:
            return 1
        largest = MAX_MTU // BASE_MTU if self.scale_mtu else MAX_GSO_SEGMENTS // self.gso_segments
        return max(1, min(largest, int(slowest_bps / self.reference_bps + 1e-9)))

    def fitted(self, description: FabricDescription) -> EmulatorRecipe:
        """This recipe as it applies to ``description``'s fabric. Its slowest fabric link
        (NIC, ToR-agg or agg-core; NVLink is a Linux bridge) sets the packet scale, so
        that every queue is at least as fine-grained in time as the reference's.
        Idempotent: the scale is computed, never multiplied."""
        rates = [
            description.emulated_rate(link)
            for link in description.fabric.links
            if link.kind is not LinkKind.NVLINK
        ]
        scale = self.scale_for(min(rates, default=0.0))
        fitted = replace(self, packet_scale=scale)
        if self.scale_mtu:
            return replace(fitted, shaping=replace(self.shaping, mtu=fitted.mtu))
        return replace(fitted, shaping=replace(self.shaping, packet_scale=scale))


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
        EmulatorRecipe(
            "scaled-packets",
            _FIFO_SHAPING,
            gso_segments=4,
            summary="4-segment TCP packets at 20 Mbit/s per link, 4F at F x 20 "
            "(at most 44), queues as deep in packets; one FIFO per link",
            reference_bps=20e6,
        ),
        EmulatorRecipe(
            "jumbo-packets",
            _FIFO_SHAPING,
            gso_segments=4,
            summary="4-segment TCP packets; MTU 1500 at 20 Mbit/s per link, F x 1500 at "
            "F x 20 (at most 15000), queues as deep in packets; one FIFO per link",
            reference_bps=20e6,
            scale_mtu=True,
        ),
    )
}
DEFAULT_RECIPE_NAME = "jumbo-packets"


def recipe_named(name: str, source: str = "--recipe") -> EmulatorRecipe:
    """The recipe called ``name``; a ConfigError naming ``source`` (where the name was
    read) and the known names otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ConfigError(None, source, f"an emulator recipe: {', '.join(RECIPES)}", name) from None


def packet_scale_of(spec: FabricSpec, recipe: EmulatorRecipe | None = None) -> int:
    """The packet scale ``recipe`` (default: :func:`current_recipe`) gives a run of ``spec``:
    what the load guard judges the run's load at (orchestrator.calibration.capacity)."""
    recipe = recipe or current_recipe()
    if not recipe.reference_bps:
        return 1
    from topologies.description import FabricDescription
    from topologies.generators import build_fabric

    return recipe.fitted(FabricDescription.of(build_fabric(spec))).packet_scale


def payload_share_of(description: FabricDescription) -> float:
    """TCP's payload share of a frame on ``description``'s fabric: what its run recorded
    (a bundle's fabric.json ``extra``, written by the emulation), else what this process's
    recipe would give it. A forecast of a recorded run then uses the run's frames."""
    recorded = description.extra.get("tcp_payload_share")
    if isinstance(recorded, (int, float)) and 0 < recorded < 1:
        return float(recorded)
    return current_recipe().fitted(description).payload_share


def current_recipe() -> EmulatorRecipe:
    """The recipe this process emulates with: ``$ASTRAL_RECIPE`` or the default."""
    return recipe_named(os.environ.get(ENV_VAR) or DEFAULT_RECIPE_NAME, f"${ENV_VAR}")
