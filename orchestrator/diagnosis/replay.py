"""The live diagnosis replayed from a finished bundle: what its alerts would have been.

The live diagnosis (:mod:`orchestrator.diagnosis.live`) runs the detectors every second on
what the layers hold so far, and its detection delays can only be measured in a run (the
bundle keeps the alerts it raised). To try a change of the detectors against saved runs
without emulating them again, :func:`replay` cuts a bundle's observations at successive
instants the way the live builder (orchestrator/run/alerts.py) sees them, diagnoses each
cut exactly as the live diagnosis does, and raises an alert the first time a suspect
scores above the threshold, stamped with the instant of the cut.

What a cut holds, as live: of the batches, only the running one's connections, operations
and warm-up (:func:`running_configuration`: live, the launcher's view holds the batch
under way and nothing of those before it), of its operations those every rank had
finished, the counters and the
controller's events up to the instant, each connection's samples and kernel views up to
:data:`SHIP_LAG_S` before it (the workers ship them every 0.2 s), the entry lateness of
finished operations and of those still running whose entry a sample had told by then
(the live look reads a rank's entry from its heartbeat), the egress queues' samples up
to the instant for the slow-port readings
(:attr:`~orchestrator.diagnosis.evidence.Observations.live_queues`, and the GPUs' NIC
ports'; the probe mesh's too), ``now`` (a stall or a pause of the polling not over yet
counts up to it), and of the controller's events those
after its first start (the live diagnosis starts after the bring-up). What differs from a
real run, so that a replayed delay approximates a live one rather than measures it: the
paths are the bundle's (traced after each batch; live, as first traced), a batch begins
at its first sample (live, when its workers start), and the machine is not busy
diagnosing while the fabric runs. Before 2026-12-07 every configuration's connections and
operations were in every cut: a size sweep's other batches, idle then, diluted the shares
of connections held low, and a live alert of astral-small's calibration run (a core
uplink slow at 0.57) replayed at 0.33, where the running batch alone replays it at 0.64.
"""

from __future__ import annotations

import dataclasses
import math

from orchestrator.diagnosis.evidence import ConnectionView, Observations
from orchestrator.diagnosis.live import INTERVAL_S, Alert, LiveDiagnosis
from orchestrator.diagnosis.proberecord import ProbeRecord

SHIP_LAG_S = 0.2  # the workers ship their samples this often: a cut sees them this late
BRING_UP_S = 0.5  # the controller's first start logs its apps within this


def at(obs: Observations, now: float, lag: float = SHIP_LAG_S) -> Observations:
    """``obs`` as a live look at ``now`` would have seen it (the module docstring)."""
    seen = now - lag
    # live, the controller's events are read from when the live diagnosis started, after
    # the fabric came up: its controller's first start (the bundle's first events, about
    # a second before the first bytes) is not among them
    since = obs.events[0].t + BRING_UP_S if obs.events else float("-inf")
    running = running_configuration(obs, seen)

    def mine(config_id: int) -> bool:
        return running is None or config_id == running

    operations = [o for o in obs.operations if o.end <= now and mine(o.config_id)]
    # live, the warm-up end is the running batch's (a later batch's is not the first's)
    warmed = (
        obs.warmed_by_config.get(running)
        if running is not None and obs.warmed_by_config
        else obs.warmed
    )
    done = {(o.config_id, o.iteration) for o in operations}
    return dataclasses.replace(
        obs,
        status="running",
        operations=operations,
        counters={p: [r for r in rows if r[0] <= now] for p, rows in obs.counters.items()},
        connections=[_cut(c, seen) for c in obs.connections if mine(c.config_id)],
        events=[e for e in obs.events if since <= e.t <= now],
        lateness={
            k: v
            for k, v in obs.lateness.items()
            if (k[0], k[1]) in done or (mine(k[0]) and obs.entry_seen.get(k, math.inf) <= seen)
        },
        queues={},
        live_queues={p: [r for r in rows if r[0] <= now] for p, rows in obs.queues.items()},
        nic_queues={p: [r for r in rows if r[0] <= now] for p, rows in obs.nic_queues.items()},
        ingress={p: [r for r in rows if r[0] <= now] for p, rows in obs.ingress.items()},
        warmed=warmed if warmed is not None and warmed <= now else None,
        workload=None,
        now=now,
        probes=_cut_probes(obs, now, seen),
        nvlink=[],  # the live look does not read the NVLink connections (nvlink.py)
    )


def running_configuration(obs: Observations, seen: float) -> int | None:
    """The configuration whose batch a live look at ``seen`` watched: of those with a
    connection sampled by then, the one whose first sample came last. None before any
    was (the cut then keeps everything: nothing has moved)."""
    began: dict[int, float] = {}
    for c in obs.connections:
        if c.samples and c.samples[0][0] <= seen:
            began[c.config_id] = min(began.get(c.config_id, math.inf), c.samples[0][0])
    return max(began, key=lambda cid: began[cid]) if began else None


def _cut_probes(obs: Observations, now: float, seen: float) -> ProbeRecord | None:
    """The probe mesh as the live look saw it: the prober's samples and trains up to
    ``seen`` (it writes them every 0.1 s), the tracings done by ``now``, the egress
    queues' samples by ``now`` riding with it (as live: orchestrator/run/alerts.py), and
    the mesh's own figures (train size, message interval: before 2026-12-05 a replay
    dropped the train size, and with it every train)."""
    rec = obs.probes
    if rec is None:
        return None
    kept = [i for i, (t, _) in enumerate(rec.tracings) if t <= now] or [0]
    return dataclasses.replace(
        rec,
        probes={
            pid: dataclasses.replace(
                p,
                samples=[s for s in p.samples if s[0] <= seen],
                trains=[t for t in p.trains if t.last <= seen],
            )
            for pid, p in rec.probes.items()
        },
        tracings=[rec.tracings[i] for i in kept],
        back=[rec.back[i] for i in kept if i < len(rec.back)],
        queues={port: [r for r in rows if r[0] <= now] for port, rows in obs.queues.items()},
    )


def _cut(c: ConnectionView, seen: float) -> ConnectionView:
    return dataclasses.replace(
        c,
        samples=[s for s in c.samples if s[0] <= seen],
        retrans=[s for s in c.retrans if s[0] <= seen],
        rtt=[s for s in c.rtt if s[0] <= seen],
        unacked=[s for s in c.unacked if s[0] <= seen],
    )


def replay(obs: Observations, interval: float = INTERVAL_S) -> list[Alert]:
    """The alerts a live diagnosis looking every ``interval`` seconds would have raised,
    from the first timed operation's start to a second after the last one's end, or after
    the controller's last port or switch event (each stamped with its look's instant). A
    run that failed before an operation finished is looked at over its connections'
    samples."""
    span = obs.span
    moved = [t for c in obs.connections for t, _ in c.samples[:1] + c.samples[-1:]]
    if span is None and moved:
        span = min(moved), max(moved)
    if span is None:
        return []
    start, end = span
    end = max([end] + [e.t for e in obs.events if e.kind != "log"])
    now = start
    live = LiveDiagnosis(lambda: at(obs, now), say=lambda line: None, clock=lambda: now)
    alerts: list[Alert] = []
    while now <= end + 1.0:
        alerts += live.check()
        now += interval
    return alerts
