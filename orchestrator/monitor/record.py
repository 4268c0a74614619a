"""A run's raw layers into the bundle: the monitor's side of the runner.

Every function here turns one thing a run already has into records of
:mod:`orchestrator.results.store` (render, then write): the operations' steps with their
peers and bytes from the plans the workers ran; the connections' ends and the senders'
TCP_INFO from what the launcher collected; each connection's path as the switches forward
it (orchestrator.testbed.tracing) and as it was planned (the source ports chosen for it,
orchestrator.testbed.pinning); the controller's events file; the CPU samples as
per-interval rows. :func:`copy_logs` copies the controller's and the
workers' logs into the bundle.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple
from pathlib import Path

from controllers.events import read_events
from orchestrator.collectives.plans import Layout, Plan, default_registry
from orchestrator.collectives.program import compose_all
from orchestrator.emulation import pathtrace
from orchestrator.emulation.pathtrace import TracedPath
from orchestrator.results.store import (
    LOGS,
    ConnectionRecord,
    ControllerEvent,
    PathHop,
    StepRecord,
    TcpInfoSample,
)
from orchestrator.testbed.pinning import Candidate, Flow
from orchestrator.worker.outcome import CollectiveResult, ConnectionInfo, RunResult
from topologies.fivetuple import FiveTuple
from topologies.model import Fabric

PINNED = "pinned"  # the whole path, as the controller published it (and the trace confirms)
FIRST_HOP = "first-hop"  # only the NIC port and the ToR: the switches hash the rest
TRACED = "traced"  # the whole path, as the switches forward it (ofproto/trace, hop by hop)
TRACE_DROPPED = "trace-dropped"  # traced up to the switch that drops it (the last row)
TRACE_UNKNOWN = "trace-unknown"  # traced up to a switch whose choice a trace cannot know
SOURCES = {
    pathtrace.TRACED: TRACED,
    pathtrace.DROPPED: TRACE_DROPPED,
    pathtrace.UNKNOWN: TRACE_UNKNOWN,
}


def step_records(test: CollectiveResult, layout: Layout) -> list[StepRecord]:
    """Every rank's every step of every operation of ``test``, with the peers it sent to
    and received from and the bytes, as the plan it ran says (the step after the last,
    ``delivery``, waits for the last sends to be acknowledged: no peers of its own)."""
    program = test.test.program
    plans: dict[int, Plan]
    if program is not None:  # a workload's iteration: every rank's composed plan
        plans = dict(enumerate(compose_all(program, layout)))
    else:
        algorithm = default_registry().get(test.test.collective, test.test.algorithm)
        plans = {r: algorithm.plan(layout, r, test.count) for r in range(test.ranks)}
    out = []
    for iteration in test.iterations:
        for rank in iteration.ranks.values():
            steps = plans[rank.rank].steps
            for phase in rank.phases:
                plan = steps[phase.step] if 0 <= phase.step < len(steps) else None
                sends = plan.sends if plan is not None else ()
                recvs = plan.recvs if plan is not None else ()
                out.append(
                    StepRecord(
                        iteration=iteration.iteration,
                        rank=rank.rank,
                        step=phase.step,
                        phase=phase.phase,
                        start=phase.start,
                        end=phase.end,
                        send_peers=tuple(sorted({t.peer for t in sends if t.region.count})),
                        recv_peers=tuple(sorted({t.peer for t in recvs if t.region.count})),
                        sent=sum(t.region.nbytes for t in sends),
                        received=sum(t.region.nbytes for t in recvs),
                        warmup=iteration.warmup,
                    )
                )
    return out


def connection_records(connections: Iterable[ConnectionInfo]) -> list[ConnectionRecord]:
    """Both ends of every connection (the sender samples acknowledged bytes, the receiver
    received ones: each end is a row of its own)."""
    return [
        ConnectionRecord(rank, c.five_tuple, c.src, c.dst, c.channel, c.link)
        for c in connections
        for rank in (c.src, c.dst)
    ]


def tcp_records(result: RunResult) -> list[TcpInfoSample]:
    """The senders' TCP_INFO (its fields in the order both records declare them)."""
    return [
        TcpInfoSample(s.rank, s.connection.five_tuple, s.t, *astuple(s.view))
        for s in result.tcp_info
    ]


def path_hops(fabric: Fabric, candidate: Candidate) -> list[PathHop]:
    """The nodes of a chosen path with the ports it enters and leaves each by (model port
    numbers: the ones the controller published for it; where it published none, between
    two nodes joined by several links, the lowest-port one, the model's first). ``pinned``
    when the path reaches the destination GPU, else ``first-hop``."""
    nodes = list(candidate.nodes)
    source = PINNED if nodes and nodes[-1] in fabric.gpus and len(nodes) > 2 else FIRST_HOP
    ports: list[tuple[int | None, int | None]] = []
    for index, (a, b) in enumerate(itertools.pairwise(nodes)):
        out = candidate.out_port(index)
        if out is None:
            out = _port(fabric, a, b)
        ports.append((out, _port(fabric, b, a, out)))
    hops = []
    for index, node in enumerate(nodes):
        in_port = ports[index - 1][1] if index > 0 else None
        out_port = ports[index][0] if index < len(ports) else None
        hops.append(PathHop(index, node, in_port, out_port, source))
    return hops


def _port(
    fabric: Fabric, node: str, neighbour: str, neighbour_port: int | None = None
) -> int | None:
    """``node``'s port towards ``neighbour`` (by the neighbour's port if it has several)."""
    for link in sorted(fabric.links_of(node), key=lambda x: x.port_of(node)):
        if link.other(node) != neighbour:
            continue
        if neighbour_port is None or link.port_of(neighbour) == neighbour_port:
            return link.port_of(node)
    return None


def traced_hops(path: TracedPath, source: str | None = None) -> list[PathHop]:
    """A traced path's hops, ``source`` by its outcome (:data:`SOURCES`) unless given."""
    source = source or SOURCES[path.outcome]
    return [PathHop(i, h.node, h.in_port, h.out_port, source) for i, h in enumerate(path.hops)]


def _agrees(trace: TracedPath, planned: Sequence[PathHop]) -> bool:
    """Whether a trace confirms a planned path: all of it, or the part before a switch
    whose choice it could not know."""
    nodes = tuple(h.node for h in planned)
    if trace.complete:
        return trace.nodes == nodes
    return trace.outcome == pathtrace.UNKNOWN and trace.nodes == nodes[: len(trace.hops)]


def _chosen_hops(planned: list[PathHop] | None, trace: TracedPath | None) -> list[PathHop] | None:
    """What to record of a connection: the trace where there is one, else the plan. A
    pinned path the trace confirms keeps ``pinned`` (with the trace's ports where it went
    all the way); one it contradicts gives way to the trace."""
    if trace is None:
        return planned
    if planned is not None and planned[0].source == PINNED and _agrees(trace, planned):
        return traced_hops(trace, PINNED) if trace.complete else planned
    return traced_hops(trace)


def connection_paths(
    fabric: Fabric,
    connections: Sequence[ConnectionInfo],
    chosen: Mapping[Flow, Candidate],
    traced: Mapping[FiveTuple, TracedPath] | None = None,
) -> list[tuple[ConnectionInfo, list[PathHop]]]:
    """Each fabric connection whose path is known, with its hops: as ``traced``
    (orchestrator.testbed.tracing) where it was, else as planned (``chosen``); NVLink
    connections, and fabric ones neither traced nor planned, have none."""
    out = []
    for c in connections:
        if c.link != "fabric":
            continue
        candidate = chosen.get((c.src, c.dst, c.channel))
        planned = path_hops(fabric, candidate) if candidate is not None else None
        hops = _chosen_hops(planned, (traced or {}).get(c.five_tuple))
        if hops:
            out.append((c, hops))
    return out


def disagreements(
    fabric: Fabric,
    connections: Sequence[ConnectionInfo],
    chosen: Mapping[Flow, Candidate],
    traced: Mapping[FiveTuple, TracedPath],
) -> list[str]:
    """The pinned connections the switches do not forward on their published path (a
    controller bug, or the fabric changed under it), one sentence each."""
    out = []
    for c in connections:
        candidate = chosen.get((c.src, c.dst, c.channel))
        trace = traced.get(c.five_tuple)
        if candidate is None or trace is None or c.link != "fabric":
            continue
        planned = path_hops(fabric, candidate)
        if planned[0].source != PINNED or _agrees(trace, planned):
            continue
        stopped = "" if trace.complete else f" ({trace.outcome}: {trace.reason})"
        out.append(
            f"rank {c.src} -> {c.dst} ({c.five_tuple.label}): published "
            f"{' '.join(candidate.nodes)}, forwarded {' '.join(trace.nodes)}{stopped}"
        )
    return out


def controller_events(path: Path, since: float = 0.0) -> list[ControllerEvent]:
    """The controller's events file (controllers/events.py) as records, those at or after
    ``since`` (epoch s); a record without a kind is a ``log`` line."""
    return [ControllerEvent.of_record(r) for r in read_events(path) if r["t"] >= since]


def copy_logs(
    bundle: Path, controller_logs: Iterable[Path], launch_dirs: Iterable[Path]
) -> list[Path]:
    """The controller's log (and events file) and every launch's worker logs into
    ``bundle/logs/`` (``workers-N/worker-R.log``); what is missing is skipped."""
    logs = bundle / LOGS
    copied = []
    for path in controller_logs:
        if path.is_file():
            logs.mkdir(parents=True, exist_ok=True)
            copied.append(Path(shutil.copy2(path, logs / path.name)))
    for directory in launch_dirs:
        for log in sorted(directory.glob("worker-*.log")):
            target = logs / directory.name
            target.mkdir(parents=True, exist_ok=True)
            copied.append(Path(shutil.copy2(log, target / log.name)))
    return copied
