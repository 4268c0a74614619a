"""A batch's fabric connections followed through the fabric, as the machine forwards them.

Two parts of the machine decide a connection's path, and each is asked for its own part:

1. the NIC port it leaves by is its source GPU's kernel's choice (the multipath route's
   hash over the five-tuple, orchestrator.testbed.hostports): ``ip route get`` for exactly
   its five-tuple in that GPU's namespace, one ``ip -batch`` per GPU
   (:func:`orchestrator.testbed.pinning.route_devices`). Asked again rather than taken
   from the plan: a NIC link that went down has dropped out of the route since, and under
   ``host_ports: hash`` there is no plan. A connection a rail-only server-mate forwards
   (``Fabric.wire_source``) is asked of the mate, as arriving on its NVLink port, and its
   path is walked from the mate's NIC: the path recorded is the part in the fabric;
2. every switch after it is Open vSwitch's: ``ofproto/trace`` hop by hop over one control
   connection (:mod:`orchestrator.emulation.pathtrace`).

:func:`trace_connections` returns the paths with what the tracing cost, which the runner
keeps in ``run.json`` (docs/monitoring.md, "Paths").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from orchestrator.emulation.executor import CommandExecutor
from orchestrator.emulation.pathtrace import (
    TRACED,
    TracedPath,
    TraceRequest,
    open_control,
    trace_paths,
)
from orchestrator.testbed.pinning import route_devices
from orchestrator.worker.outcome import ConnectionInfo
from orchestrator.worker.spec import WorkerSpec
from topologies.description import FabricDescription
from topologies.fivetuple import FiveTuple

PROBLEMS_KEPT = 5  # reasons of incomplete paths kept in the summary


@dataclass(frozen=True)
class PathTraces:
    """Per fabric connection (by five-tuple), its traced path; what it took: ``seconds`` in
    all, ``switch_seconds`` of it walking the switches, ``traces`` switches asked, ``via``
    how ovs-vswitchd was reached."""

    paths: dict[FiveTuple, TracedPath]
    seconds: float
    switch_seconds: float
    traces: int
    via: str

    def outcomes(self) -> Counter[str]:
        return Counter(p.outcome for p in self.paths.values())

    def problems(self) -> list[str]:
        """Why the incomplete paths stopped, each reason once, in order."""
        reasons = (f"{p.outcome}: {p.reason}" for p in self.paths.values() if not p.complete)
        return list(dict.fromkeys(reasons))

    def summary(self) -> dict[str, Any]:
        """What ``run.json`` keeps of one tracing."""
        outcomes = self.outcomes()
        return {
            "connections": len(self.paths),
            "outcomes": dict(sorted(outcomes.items())),
            "traces": self.traces,
            "seconds": round(self.seconds, 4),
            "switch_seconds": round(self.switch_seconds, 4),
            "via": self.via,
            "problems": self.problems()[:PROBLEMS_KEPT],
        }

    def incomplete(self) -> int:
        return sum(1 for p in self.paths.values() if p.outcome != TRACED)


def trace_requests(
    executor: CommandExecutor,
    description: FabricDescription,
    workers: Sequence[WorkerSpec],
    connections: Sequence[ConnectionInfo],
) -> list[TraceRequest]:
    """Step 1 of the module docstring: each fabric connection with the NIC port its
    kernel sends it out of now."""
    host = {w.rank: w.host for w in workers}
    flows = [(c.five_tuple, host[c.src], host[c.dst]) for c in connections if c.link == "fabric"]
    return flow_requests(executor, description, flows)


def flow_requests(
    executor: CommandExecutor,
    description: FabricDescription,
    flows: Sequence[tuple[FiveTuple, str, str]],
) -> list[TraceRequest]:
    """Each (five-tuple, source GPU, destination GPU) with the NIC port the kernel of the GPU
    it leaves by sends it out of now (one ``ip -batch`` per such GPU), in order: the source,
    or on a rail-only fabric the server-mate that forwards it (the request's ``src`` then)."""
    fabric = description.fabric
    per_gpu: dict[str, list[tuple[FiveTuple, str | None]]] = {}
    wire: list[str] = []
    for five, src, dst in flows:
        gpu = fabric.wire_source(src, dst)
        iif = description.addresses[gpu].nvlink.intf if gpu != src else None
        per_gpu.setdefault(gpu, []).append((five, iif))
        wire.append(gpu)
    devices: dict[tuple[str, FiveTuple], str | None] = {}
    for gpu, asked in per_gpu.items():
        queries = [(t.src_ip, t.dst_ip, t.src_port, t.dst_port) for t, _ in asked]
        got = route_devices(executor, gpu, queries, [iif for _, iif in asked])
        devices.update(zip(((gpu, t) for t, _ in asked), got, strict=True))
    nic_of = {gpu: {n.intf: n.port for n in description.addresses[gpu].nics} for gpu in per_gpu}
    requests = []
    for (five, _, dst), gpu in zip(flows, wire, strict=True):
        device = devices.get((gpu, five))
        nic = nic_of[gpu].get(device) if device else None
        why = "" if nic is not None else f"its kernel routes it out of {device}, not a NIC port"
        requests.append(TraceRequest(five, gpu, dst, nic, why))
    return requests


def trace_connections(
    executor: CommandExecutor,
    description: FabricDescription,
    workers: Sequence[WorkerSpec],
    connections: Sequence[ConnectionInfo],
) -> PathTraces:
    """Every fabric connection of ``connections`` (between ``workers``) traced."""
    began = time.monotonic()
    requests = trace_requests(executor, description, workers, connections)
    walked = time.monotonic()
    # a cluster's switches answer on several machines (orchestrator.cluster.trace)
    opener = getattr(executor, "open_control", None)
    with closing(opener() if opener is not None else open_control(executor)) as control:
        paths = trace_paths(description, requests, control) if requests else []
        via = control.name
    done = time.monotonic()
    return PathTraces(
        {r.five_tuple: p for r, p in zip(requests, paths, strict=True)},
        seconds=done - began,
        switch_seconds=done - walked,
        traces=sum(p.traces for p in paths),
        via=via,
    )
