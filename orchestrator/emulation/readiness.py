"""Is the emulated fabric ready? Every GPU must reach every other GPU, checked, not assumed.

:func:`probe_plan` (pure) lists, for each GPU, what it must reach:

- every other GPU's fabric address, once through each of its NIC ports (the echo request is
  bound to the port, so both ports of a dual-ToR GPU are proven; the reply may return on
  either); on fabrics where GPUs forward for their server-mates (rail-only), targets on
  another rail are reached through NVLink, so they are probed unbound;
- every server-mate's NVLink address, through the NVLink port.

:func:`wait_reachable` probes from every GPU's namespace at once (orchestrator.emulation.probe: one
process, sockets opened inside each namespace, paced), re-probes what failed until
everything answered or the timeout passes, then raises
:class:`~topologies.errors.EmulationError` naming the failing pairs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.emulation.probe import probe_namespaces
from topologies.description import FabricDescription
from topologies.errors import EmulationError


@dataclass(frozen=True)
class Target:
    """One echo to send from ``src``: to ``address`` (of GPU ``dst``), through ``dev``."""

    src: str
    dst: str
    address: str
    dev: str | None
    kind: str  # fabric | nvlink

    def describe(self) -> str:
        via = f" via {self.dev}" if self.dev else ""
        return f"{self.src} -> {self.dst} ({self.kind} {self.address}{via})"


def probe_plan(description: FabricDescription) -> dict[str, list[Target]]:
    """What each GPU must reach (see the module docstring)."""
    addresses = description.addresses
    forwarding = description.fabric.gpu_forwarding
    plan: dict[str, list[Target]] = {}
    for src, own in addresses.items():
        targets = []
        for dst, other in addresses.items():
            if dst == src:
                continue
            if forwarding and other.rail != own.rail:
                targets.append(Target(src, dst, other.fabric_ip, None, "fabric"))
            else:
                targets += [
                    Target(src, dst, other.fabric_ip, nic.intf, "fabric") for nic in own.nics
                ]
            if other.server == own.server:
                targets.append(Target(src, dst, other.nvlink.ip, own.nvlink.intf, "nvlink"))
        plan[src] = targets
    return plan


# Echoes per second all GPUs together send (orchestrator.emulation.probe explains the pacing).
PROBE_RATE = 2000.0


def round_timeout(plan: Mapping[str, list[Target]], base: float, rate: float) -> float:
    """Long enough to send every echo at ``rate`` and still wait ``base`` for the last."""
    return base + sum(len(targets) for targets in plan.values()) / rate


def probe_once(
    plan: Mapping[str, list[Target]],
    netns: Mapping[str, str],
    timeout: float = 3.0,
    rate: float = PROBE_RATE,
) -> dict[str, list[Target]]:
    """Probe every GPU's targets at once, from inside the GPUs' namespaces (``netns``: GPU
    -> its /proc/<pid>/ns/net); return the unanswered ones per GPU."""
    echoes = {
        gpu: [{"target": t.address, "dev": t.dev} for t in targets]
        for gpu, targets in plan.items()
        if targets
    }
    rtts = probe_namespaces(echoes, netns, round_timeout(plan, timeout, rate), rate)
    failed = {}
    for gpu, results in rtts.items():
        missed = [t for t, rtt in zip(plan[gpu], results, strict=True) if rtt is None]
        if missed:
            failed[gpu] = missed
    return failed


def wait_reachable(
    plan: Mapping[str, list[Target]],
    netns: Mapping[str, str],
    timeout: float = 30.0,
    rate: float = PROBE_RATE,
) -> int:
    """Probe until every target answered; return the number of rounds it took.

    Raises EmulationError listing the failing pairs when ``timeout`` seconds pass first.
    """
    remaining = {gpu: list(targets) for gpu, targets in plan.items() if targets}
    deadline = time.monotonic() + timeout
    rounds = 0
    while remaining:
        rounds += 1
        remaining = probe_once(remaining, netns, rate=rate)
        if remaining and time.monotonic() >= deadline:
            failing = [t for targets in remaining.values() for t in targets]
            shown = "; ".join(t.describe() for t in failing[:12])
            more = f" and {len(failing) - 12} more" if len(failing) > 12 else ""
            raise EmulationError(
                f"fabric not ready after {timeout:g} s: {len(failing)} of "
                f"{sum(len(t) for t in plan.values())} probes unanswered: {shown}{more}"
            )
    return rounds
