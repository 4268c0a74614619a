"""A validated fabric description as typed, frozen objects: what the generators, the planner
and the emulation read. :mod:`topologies.spec` turns the YAML a user writes into these (and
says what is wrong with it); nothing here parses or checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from topologies.errors import FabricSpecError
from topologies.units import format_duration, format_rate

#: the slowest emulated link rate (bit/s) a fabric may ask for: a floor against unit
#: mistakes (1 bit/s stalls every run), not a measured limit. At this rate a 1500-byte frame
#: takes 12 ms on the wire and the shaper's smallest queue, 16 frames
#: (orchestrator/emulation/shaping.py), 0.19 s to drain: slower, a single queued frame
#: outlasts the workers' retransmission timeout and the diagnosis' stall lines (2 s) come
#: within a few full queues. hpn-like's oversubscribed agg->core, the slowest preset
#: link, runs at 1.33 Mbit/s. Checked on the rates as given (topologies/spec.py).
MIN_EMULATED_BPS = 1e6
#: ... and on every link as built, a tier's speed divided by its oversubscription
#: (topologies/generators): lower, since a measured study runs there. The shipped
#: core-oversubscription study runs astral-small's 15:1 core at 0.8 Mbit/s and measures
#: both collectives at the forecast's cut (docs/studies.md). What it guards against is an
#: oversubscription of hundreds (1000:1 gives 0.02 Mbit/s at the default scale), where a
#: 16-frame queue takes seconds to drain and a run stalls.
MIN_BUILT_BPS = 0.5e6

# Real speeds of the paper's fabric: 200G ports everywhere, NVLink 4.0 at 900 GB/s
# bidirectional = 3.6 Tbit/s one way.
DEFAULT_SPEEDS = {"nic": 200e9, "tor_agg": 200e9, "agg_core": 200e9, "nvlink": 3.6e12}
# 200G real -> 20 Mbit/s emulated: eight dual-ported GPUs then offer 320 Mbit/s in total,
# well inside what userspace OVS forwards on two cores (docs/fidelity.md).
DEFAULT_SCALE = 1e-4


@dataclass(frozen=True)
class SwitchSpec:
    """Switch radix and how its ports split between downlinks and uplinks."""

    radix: int
    down_ports: int

    @property
    def up_ports(self) -> int:
        return self.radix - self.down_ports


@dataclass(frozen=True)
class Speeds:
    """Real link rates per tier, bit/s."""

    nic: float = DEFAULT_SPEEDS["nic"]
    tor_agg: float = DEFAULT_SPEEDS["tor_agg"]
    agg_core: float = DEFAULT_SPEEDS["agg_core"]
    nvlink: float = DEFAULT_SPEEDS["nvlink"]


@dataclass(frozen=True)
class Oversubscription:
    """Down:up capacity ratio wanted at the ToR and aggregation tiers (1 = non-blocking)."""

    tor: float = 1.0
    agg: float = 1.0


@dataclass(frozen=True)
class EmulationSpec:
    """How real rates map onto the emulated links: emulated = real * scale."""

    scale: float = DEFAULT_SCALE

    def emulated(self, real_bps: float) -> float:
        return real_bps * self.scale


# Real-world latencies, seconds (docs/latency.md says where each figure comes from):
#   switch_hop  one switch crossed (port to port), a 51.2T Tomahawk-5-class ASIC
#   nic         one NIC crossed (half of a ConnectX-6 back-to-back one-way figure)
#   library     the collective library's own cost per network message (NCCL's proxy and
#               network plugin), set so that NIC + switch + NIC + library on a same-ToR path
#               equals NCCL's per-step network latency for its ring (LL protocol)
#   nvlink      one message between GPUs of one server (NCCL's per-step NVLink latency)
#   operation   once per collective operation (NCCL's base latency of a ring)
DEFAULT_LATENCY = {
    "switch_hop": 0.6e-6,
    "nic": 0.4e-6,
    "library": 1.3e-6,
    "nvlink": 0.6e-6,
    "operation": 6.6e-6,
}


@dataclass(frozen=True)
class LatencySpec:
    """Real-world latencies the emulation adds, scaled by 1 / emulation scale (a real 1 us
    is 16.7 ms at scale 0.6e-4), in the workers: each step of a collective waits the
    one-way latency of its slowest peer before sending (docs/latency.md). ``enabled``
    False (``latency: off``) adds none, as before latencies were modelled."""

    enabled: bool = True
    switch_hop: float = DEFAULT_LATENCY["switch_hop"]
    nic: float = DEFAULT_LATENCY["nic"]
    library: float = DEFAULT_LATENCY["library"]
    nvlink: float = DEFAULT_LATENCY["nvlink"]
    operation: float = DEFAULT_LATENCY["operation"]

    def components(self) -> dict[str, float]:
        """Component name -> real seconds, in DEFAULT_LATENCY's order."""
        return {name: float(getattr(self, name)) for name in DEFAULT_LATENCY}

    def to_dict(self) -> dict[str, Any] | str:
        """``"off"`` or the components spelled like ``0.6us`` (the spec file's form)."""
        if not self.enabled:
            return "off"
        return {name: format_duration(value) for name, value in self.components().items()}


@dataclass(frozen=True)
class FabricSpec:
    """A validated fabric description. ``source`` is the file it came from, for messages."""

    name: str
    kind: str
    pods: int
    servers_per_pod: int | None
    gpus_per_server: int
    nic_ports: int
    switch: SwitchSpec
    speeds: Speeds = field(default_factory=Speeds)
    oversubscription: Oversubscription = field(default_factory=Oversubscription)
    emulation: EmulationSpec = field(default_factory=EmulationSpec)
    latency: LatencySpec = field(default_factory=LatencySpec)
    source: str = "<inline>"

    @property
    def rails(self) -> int:
        return self.gpus_per_server

    def error(
        self, key: str, expected: str, found: object = None, detail: str = ""
    ) -> FabricSpecError:
        """An error about this spec's ``key``, for generators' wiring checks."""
        return FabricSpecError(self.source, key, expected, found, detail=detail)

    def to_dict(self) -> dict[str, Any]:
        """The canonical YAML-able form (rates spelled like ``200G``)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "pods": self.pods,
            "servers_per_pod": self.servers_per_pod,
            "gpus_per_server": self.gpus_per_server,
            "nic_ports": self.nic_ports,
            "switch": {"radix": self.switch.radix, "down_ports": self.switch.down_ports},
            "speeds": {
                "nic": format_rate(self.speeds.nic),
                "tor_agg": format_rate(self.speeds.tor_agg),
                "agg_core": format_rate(self.speeds.agg_core),
                "nvlink": format_rate(self.speeds.nvlink),
            },
            "oversubscription": {
                "tor": self.oversubscription.tor,
                "agg": self.oversubscription.agg,
            },
            "emulation": {"scale": self.emulation.scale},
            "latency": self.latency.to_dict(),
        }
