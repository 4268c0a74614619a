"""Is the emulated fabric ready? Every GPU must reach every other GPU, checked, not assumed.

:func:`probe_plan` (pure) lists, for each GPU, what it must reach:

- every other GPU's fabric address, once through each of its NIC ports (the echo request is
  bound to the port, so both ports of a dual-ToR GPU are proven; the reply may return on
  either); on fabrics where GPUs forward for their server-mates (rail-only), targets on
  another rail are reached through NVLink, so they are probed unbound;
- every server-mate's NVLink address, through the NVLink port.

:func:`wait_reachable` runs ``python -m orchestrator.probe`` in every GPU's namespace at
once, re-probes what failed until everything answered or the timeout passes, then raises
:class:`~topologies.errors.EmulationError` naming the failing pairs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.description import FabricDescription
from topologies.errors import EmulationError

REPO = Path(__file__).resolve().parents[1]


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


# Echoes per second all GPUs together send. Open vSwitch's userspace datapath forwards
# every echo and reply through up to five bridges and drops, without counting, what it
# cannot keep up with (ovs-vswitchd sends on all ports through one socket whose buffer
# also holds what waits in the shapers): 64 GPUs probing unpaced lost nine echoes in ten.
PROBE_RATE = 2000.0
MIN_PROBE_RATE = 20.0

# Starts ``argv`` inside a GPU's namespace with stdin/stdout pipes (Mininet: host.popen).
Spawner = Callable[[str, list[str]], "subprocess.Popen[bytes]"]


def probe_argv(targets: int, gpus: int, timeout: float, rate: float = PROBE_RATE) -> list[str]:
    """The probe command for one of ``gpus`` GPUs probing at once: its share of ``rate``
    echoes per second, and long enough to send ``targets`` echoes at that pace."""
    share = max(MIN_PROBE_RATE, rate / max(1, gpus))
    seconds = timeout + targets / share
    return [
        sys.executable, "-m", "orchestrator.probe",
        "--timeout", f"{seconds:.3f}", "--rate", f"{share:.1f}",
    ]  # fmt: skip


def probe_once(
    plan: Mapping[str, list[Target]], spawn: Spawner, timeout: float, rate: float = PROBE_RATE
) -> dict[str, list[Target]]:
    """Probe every GPU's targets in parallel; return the unanswered ones per GPU.

    All GPUs together send at most ``rate`` echoes per second (see PROBE_RATE).
    """
    running: dict[str, subprocess.Popen[bytes]] = {}
    failed: dict[str, list[Target]] = {}
    probing = [gpu for gpu, targets in plan.items() if targets]
    longest = max((len(plan[gpu]) for gpu in probing), default=0)
    try:
        for gpu in probing:
            running[gpu] = spawn(gpu, probe_argv(len(plan[gpu]), len(probing), timeout, rate))
        # Every probe gets its targets before any result is read: they run concurrently.
        for gpu, process in running.items():
            request = json.dumps([{"target": t.address, "dev": t.dev} for t in plan[gpu]])
            assert process.stdin is not None
            try:
                process.stdin.write(request.encode())
                process.stdin.close()
            except OSError:
                pass  # it died: no results, all its targets count as failed
            process.stdin = None  # written: communicate() below only reads
        deadline = time.monotonic() + timeout + 30 + longest * len(probing) / rate
        for gpu, process in running.items():
            targets = plan[gpu]
            try:
                out, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
                results: list[dict[str, Any]] = json.loads(out.decode() or "null") or []
            except (subprocess.TimeoutExpired, ValueError):
                process.kill()
                process.communicate()
                results = []
            if len(results) != len(targets):
                failed[gpu] = list(targets)
                continue
            missed = [t for t, r in zip(targets, results, strict=True) if r.get("rtt") is None]
            if missed:
                failed[gpu] = missed
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return failed


def wait_reachable(
    plan: Mapping[str, list[Target]],
    spawn: Spawner,
    timeout: float = 30.0,
    round_timeout: float = 3.0,
) -> int:
    """Probe until every target answered; return the number of rounds it took.

    Raises EmulationError listing the failing pairs when ``timeout`` seconds pass first.
    """
    remaining = {gpu: list(targets) for gpu, targets in plan.items() if targets}
    deadline = time.monotonic() + timeout
    rounds = 0
    while remaining:
        rounds += 1
        remaining = probe_once(remaining, spawn, round_timeout)
        if remaining and time.monotonic() >= deadline:
            failing = [t for targets in remaining.values() for t in targets]
            shown = "; ".join(t.describe() for t in failing[:12])
            more = f" and {len(failing) - 12} more" if len(failing) > 12 else ""
            raise EmulationError(
                f"fabric not ready after {timeout:g} s: {len(failing)} of "
                f"{sum(len(t) for t in plan.values())} probes unanswered: {shown}{more}"
            )
    return rounds
