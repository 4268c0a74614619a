"""The diagnosis of one bundle: every detector's suspects merged, reconciled and ranked.

Merging: what several detectors say of the same component and fault adds up (the scores
combine as independent pieces of evidence, ``1 - prod(1 - s)``), and the evidence chains
join. Reconciling: a fault explains its own consequences, which are dropped instead of
competing with it — a switch that went down explains its links' downs, losses and stalls;
a link that went down explains the stalls and losses on it; a network fault makes the
ranks behind it enter later, so a straggler is only believed when the network is quiet.
A run the emulator itself could not carry (its CPU, not a link) says so, and a slowness
seen only in the transport layer is not blamed on a link then. The controller restarts the
run made itself (its policy switches, :mod:`.restarts`) are said in a note: the
controller's events show them, and the controller detector does not blame them.

A damaged bundle (a table its schema version has is missing from its database) says so in
a note: what the table held reads as nothing. Without the controller's events (neither
the table nor the bundle's copy of the events file) nothing says a port went down, and a
link that went down looks like what it does to the probes and the connections, a hole
or a loss: such verdicts are weakened (:func:`without_port_events`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from orchestrator.diagnosis import detectors, egress, expectation, nvlink, probes, trains
from orchestrator.diagnosis.evidence import Observations, observe
from orchestrator.diagnosis.model import FABRIC_WIDE, THRESHOLD, UNCOUNTED, Diagnosis, Suspect
from orchestrator.diagnosis.restarts import OwnRestart

Detector = Callable[[Observations], list[Suspect]]


def nvlink_faults(obs: Observations) -> list[Suspect]:
    """:func:`.nvlink.down_faults` with when each configuration's first fabric connection
    stalled (a hole's or a down link's stall, :func:`.detectors.stalls`)."""
    first: dict[int, float] = {}
    for c in obs.connections:
        for start, _ in detectors.stalls(c):
            first[c.config_id] = min(first.get(c.config_id, start), start)
    return nvlink.down_faults(obs.nvlink, first)


DETECTORS: Sequence[Detector] = (
    detectors.port_events,
    detectors.connection_faults,
    detectors.dropped_without_congestion,
    detectors.overfull_queues,
    detectors.held_below_half,
    detectors.sending_below_rate,
    detectors.uncounted_losses,
    detectors.stragglers,
    detectors.controller_outage,
    probes.probe_losses,  # the probe mesh: faults where the collectives do not go
    probes.probe_holes,
    trains.slow_directions,  # the probe mesh's trains: slow links
    expectation.behind_forecast,  # a workload replay against its forecast timeline
    nvlink_faults,  # inside a server: NVLink links and switches
)
NETWORK_FAULTS = ("down", "flapping", "slow", "lossy", "blackhole")


def diagnose_bundle(path: Path) -> Diagnosis:
    """Diagnose the bundle at ``path`` (see the module docstring)."""
    began = time.monotonic()
    obs = observe(Path(path))
    diagnosis = diagnose(obs)
    diagnosis.seconds = time.monotonic() - began
    return diagnosis


def diagnose(obs: Observations) -> Diagnosis:
    suspects = merge([s for detector in DETECTORS for s in detector(obs)])
    suspects = reconcile(obs, suspects)
    probes.cleared_by_probes(obs, suspects)
    notes = damage_notes(obs) + probes.pause_notes(obs)
    without_port_events(obs, suspects)
    if not obs.operations:
        notes.append("no timed operation in this bundle: nothing to compare against")
    if obs.connections and not any(c.full_path for c in obs.connections):
        notes.append(
            "paths known to the first hop only: a fault deeper in the fabric is placed by "
            "the counters and the controller, not by the connections' paths"
        )
    own = own_restarts_note(obs)
    if own:
        notes.append(own)
    if obs.saturated:
        notes.append(
            "emulator-bound: the emulator's CPU, not the fabric, limited "
            + ", ".join(obs.saturated[:3])
            + "; slowness seen only by the transport layer is not blamed on a link"
        )
        for s in suspects:
            if s.fault == "slow" and all(e.startswith(("transport", "paths")) for e in s.evidence):
                s.score *= 0.5
    suspects.sort(key=lambda s: (-s.score, s.component, s.target))
    # without queue samples a switch's drops cannot be told from congestion's
    leaks = detectors.switch_leaks(obs) if obs.queues else {}
    placed = leaking_egress(obs, leaks, [s for s in suspects if s.score >= THRESHOLD])
    egress.contradicted(suspects, placed)
    suspects += placed
    suspects.sort(key=lambda s: (-s.score, s.component, s.target))
    notes += unexplained_drops(leaks, [s for s in suspects if s.score >= THRESHOLD])
    notes += [
        f"switch {s.target} not called a blackhole (score {s.score:.2f}): "
        + s.evidence[-1].removeprefix("but ")
        for s in suspects
        if FABRIC_WIDE in s.signs and s.score < THRESHOLD
    ]
    return Diagnosis(suspects, notes=notes)


# what a link that went down looks like when no port event says it did
LOOKS_LIKE_DOWN = ("blackhole", "lossy")
# ... and what their scores are worth then: something was seen, so the suspect stays above
# THRESHOLD when its evidence was strong (a damaged bundle is not called healthy), but
# under the 0.8 of a verdict whose evidence is whole
WITHOUT_PORT_EVENTS = 0.7


def damage_notes(obs: Observations) -> list[str]:
    """A note on the tables the bundle's database lacks (none for an intact bundle)."""
    missing = [t for t in obs.missing_tables if t != "controller_events" or not obs.events_known]
    notes = []
    if missing:
        tables = f"the {', '.join(missing)} table" + ("s" if len(missing) > 1 else "")
        notes.append(
            f"damaged bundle: its database lacks {tables} of its schema version; what "
            "they hold reads as nothing here"
            + (
                ", so no port event says a link went down, and a verdict of a hole or a "
                "loss is weaker for it"
                if not obs.events_known
                else ""
            )
        )
    if obs.events_logged:
        notes.append(
            "damaged bundle: its database lacks the controller_events table; the "
            f"controller's events were read from the bundle's {obs.events_logged} instead"
        )
    return notes


def without_port_events(obs: Observations, suspects: Sequence[Suspect]) -> None:
    """Weaken (:data:`WITHOUT_PORT_EVENTS`) the suspects a link that went down would also
    explain, when the bundle lacks the controller's events. Why: the probes and the
    connections see a down link as a hole (nothing acknowledged) or a loss
    (retransmissions); the port-status event that tells them apart, and whose absence the
    detectors read as "no port down", was not kept (seed 56's run 38 with its
    ``controller_events`` table dropped: ``switch p0r2t0: blackhole`` at 0.90 for the NIC
    link that went down)."""
    if obs.events_known:
        return
    for s in suspects:
        if s.fault in LOOKS_LIKE_DOWN:
            s.score *= WITHOUT_PORT_EVENTS
            s.evidence.append(
                "but the bundle lacks the controller's events: a link here that went down "
                "would look the same"
            )


def leaking_egress(
    obs: Observations, leaks: Mapping[str, detectors.Leak], shown: Sequence[Suspect]
) -> list[Suspect]:
    """Lossy egresses of switches whose silent drops (``leaks``) no suspect shown explains:
    placed by the switches' own forwarding counters where the bundle has them
    (:mod:`orchestrator.diagnosis.egress`), else by the probes
    (:func:`orchestrator.diagnosis.probes.leaking_egress`)."""
    named = _named(shown)
    down = {s.target for s in shown if s.fault in ("down", "flapping")}
    counted = egress.counted_egress(obs, leaks, {n for t in down for n in _link_nodes(t) or [t]})
    if counted:
        fresh = []
        for c in counted:  # a suspect shown already names it: the counters say so there
            same = [
                s
                for s in shown
                if s.fault == "lossy" and s.target in (c.target, egress.link_of(c.target))
            ]
            for s in same:
                s.evidence.append(c.evidence[0])
            if not same:
                fresh.append(c)
        return fresh
    found = probes.agreeing_egress(obs, leaks) or probes.leaking_egress(obs, leaks)
    return [s for s in found if s.target.split(">", 1)[0] not in named]


def _named(shown: Sequence[Suspect]) -> set[str]:
    """The components the suspects shown name: switches, and the ends of links."""
    named = set()
    for s in shown:
        nodes = _link_nodes(s.target) if s.component == "link" else None
        named |= set(nodes) if nodes else {s.target}
    return named


def unexplained_drops(leaks: Mapping[str, detectors.Leak], shown: Sequence[Suspect]) -> list[str]:
    """A note per switch that dropped packets no full queue of its explains (``leaks``,
    from a bundle with queue samples) when no suspect shown names it or one of its links:
    the counters say something was lost there, the connections did not say where (e.g.
    only acknowledgements crossed the lossy egress, or no recorded path did)."""
    named = _named(shown)
    return [
        f"counters: {switch} dropped {leak.silent:,} packets that no full queue of its "
        "explains (a lossy egress or a drop rule), and no connection's evidence says which "
        "egress"
        for switch, leak in sorted(leaks.items())
        if switch not in named
    ]


def own_restarts_note(obs: Observations) -> str | None:
    """The controller restarts the run made itself while it measured (its policy
    switches), as it recorded them or as inferred; None without any."""
    span = obs.span
    if span is None:
        return None
    own = [r for r in obs.own_restarts if span[0] - 1.0 <= r.began <= span[1] + 1.0]
    if not own:
        return None
    if all(r.recorded for r in own):
        listed = ", ".join(_restart_text(obs, r) for r in own)
        return (
            f"the run restarted the controller itself {_times(len(own))} ({listed}): "
            "planned, not blamed on the controller"
        )
    listed = ", ".join(
        f"to {r.policy} between {detectors.rel(obs, r.began)} and {detectors.rel(obs, r.until)}"
        for r in own
    )
    return (
        f"the run switched policy {_times(len(own))} ({listed}): this bundle does not record "
        "when it restarted the controller, so a restart between two configurations of "
        "different policies is taken for the run's own"
    )


def _restart_text(obs: Observations, r: OwnRestart) -> str:
    what = f"policy switch to {r.policy}" if r.reason == "policy" else f"{r.reason} change"
    return f"{what} at {detectors.rel(obs, r.began)}"


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def merge(suspects: Sequence[Suspect]) -> list[Suspect]:
    by_key: dict[tuple[str, str, str], Suspect] = {}
    for s in suspects:
        key = (s.component, _canonical(s.target), s.fault)
        if key not in by_key:
            by_key[key] = Suspect(
                s.component, s.target, s.fault, s.score, list(s.evidence), s.onset, set(s.signs)
            )
            continue
        kept = by_key[key]
        # the onset is the strongest evidence's (a weaker detector may have seen something
        # earlier that was not this fault)
        if s.onset is not None and (kept.onset is None or s.score > kept.score):
            kept.onset = s.onset
        kept.score = 1 - (1 - kept.score) * (1 - s.score)
        kept.evidence += [e for e in s.evidence if e not in kept.evidence]
        kept.signs |= s.signs
    return list(by_key.values())


def _transport_only(s: Suspect) -> bool:
    """Whether a suspect's evidence is the connections' own only (their retransmissions
    and paths), with no counter, controller event or probe behind it."""
    return all(e.startswith(("transport", "paths", "but ")) for e in s.evidence)


def _canonical(target: str) -> str:
    """A link's name in either order is one link (``A>B`` stays a direction)."""
    if "-" in target and ">" not in target:
        a, b = target.split("-", 1)
        return "-".join(sorted((a, b)))
    return target


def _link_nodes(target: str) -> tuple[str, str] | None:
    for sep in (">", "-"):
        if sep in target:
            a, b = target.split(sep, 1)
            return a, b
    return None


def reconcile(obs: Observations, suspects: list[Suspect]) -> list[Suspect]:
    strong = [s for s in suspects if s.score >= 0.8]
    down_switches = {s.target for s in strong if s.component == "switch" and s.fault == "down"}
    down_links = {
        _canonical(s.target)
        for s in strong
        if s.component == "link" and s.fault in ("down", "flapping")
    }
    kept = []
    explained: set[int] = set()  # suspects already scaled down as another's consequence
    for s in suspects:
        nodes = _link_nodes(s.target) if s.component == "link" else None
        if nodes and set(nodes) & down_switches:
            continue  # a link of a switch that went down: the switch explains it
        if nodes and _canonical("-".join(nodes)) in down_links and s.fault in ("lossy", "slow"):
            if s.score < 0.8:
                continue  # a link that went down explains its stalls and losses
            # ... however many: each down loses what was in flight on it and queued for it
            s.score *= 0.5
            s.evidence.append("but the link went down during the run: what was on it was lost")
            explained.add(id(s))
        if s.component == "switch" and s.fault == "blackhole" and s.target in down_switches:
            continue
        kept.append(s)
    # A loss on a GPU's link out paces its connections too (each loss halves a window):
    # where retransmissions no counter explains say so, a slow link there is its
    # consequence.
    losing = {
        frozenset(nodes)
        for s in kept
        if s.fault == "lossy" and UNCOUNTED in s.signs and s.score >= THRESHOLD
        and (nodes := _link_nodes(s.target))
    }  # fmt: skip
    for s in kept:
        nodes = _link_nodes(s.target) if s.component == "link" else None
        if s.fault == "slow" and nodes and frozenset(nodes) in losing:
            s.score *= 0.5
            s.evidence.append(
                "but its connections retransmitted what no counter saw dropped: a loss on "
                "it, which paces them as well"
            )
    # Traffic moves off a link or switch that went down onto its neighbours, which then
    # overflow and retransmit: what begins after a strong down is its consequence.
    downs = [
        s for s in kept
        if s.score >= 0.8 and s.fault in ("down", "flapping") and s.onset is not None
    ]  # fmt: skip
    for s in kept:
        if s in downs or id(s) in explained:
            continue
        if s.fault not in ("lossy", "slow", "blackhole", "down"):
            continue
        cause = next((d for d in downs if s.onset is not None and s.onset >= d.onset - 0.5), None)  # type: ignore[operator]
        if cause is not None:
            s.score *= 0.5
            s.evidence.append(
                f"but it began after {cause.component} {cause.target} went down: traffic "
                "that moved off it (a consequence, not a fault of its own)"
            )
    # A straggler sends each step late, so its own connections look slow while the bytes
    # wait at its own egress: a slow link out of that GPU and nothing else strong in the
    # network is the straggler's doing (a slow link does not make its GPU enter late).
    late = {s.target for s in kept if s.fault == "straggler" and s.score >= THRESHOLD}
    own = {
        id(s): nodes[0]
        for s in kept
        if s.fault == "slow" and s.score >= 0.8 and (nodes := _link_nodes(s.target))
        and nodes[0] in late
    }  # fmt: skip
    others = [
        s for s in kept
        if s.score >= 0.8 and id(s) not in own
        and (s.fault in NETWORK_FAULTS or s.fault == "controller outage")
    ]  # fmt: skip
    if own and not others:
        for s in kept:
            if id(s) in own:
                s.score *= 0.5
                s.evidence.append(
                    f"but {own[id(s)]} entered its operations late: a straggler's "
                    "connections send late, and look slow"
                )
    network = max(
        (s.score for s in kept if s.fault in NETWORK_FAULTS or s.fault == "controller outage"),
        default=0.0,
    )
    # A rank late by itself at every operation's start is the application layer's own
    # evidence; a network fault seen only in the transport (one connection's
    # retransmissions, no counter, no controller event, no probe) is weaker than it: the
    # straggler stands, and such a fault is the lesser suspect (a late rank's peers
    # burst into shallow queues when it comes).
    strong_late = max((s.score for s in kept if s.fault == "straggler"), default=0.0)
    thin = [
        s for s in kept
        if s.fault in NETWORK_FAULTS and s.score >= 0.8 and _transport_only(s)
    ]  # fmt: skip
    solid = max(
        (
            s.score for s in kept
            if (s.fault in NETWORK_FAULTS or s.fault == "controller outage")
            and not _transport_only(s)
        ),
        default=0.0,
    )  # fmt: skip
    if strong_late >= 0.85 and thin and solid < 0.8:
        for s in thin:
            s.score *= 0.7
            s.evidence.append(
                "but a rank entered its operations late, and only the transport shows this"
            )
        network = 0.0
    if network >= 0.8:
        strong = [
            s for s in kept
            if s.score >= 0.8 and (s.fault in NETWORK_FAULTS or s.fault == "controller outage")
        ]  # fmt: skip
        for s in kept:
            if s.fault == "straggler" and any(_reaches(obs, n, s.target) for n in strong):
                s.score *= 0.5
                s.evidence.append(
                    "but the network was faulty too: ranks behind a slow path enter later"
                )
    return kept


def _reaches(obs: Observations, fault: Suspect, gpu: str) -> bool:
    """Whether a network ``fault`` can have made ``gpu`` enter its operations late: it is
    on a recorded path of a connection to or from it (or at its own link). A rank enters
    late behind a fault because its bytes crossed it; a fault on other ranks' paths only
    (a ring's connection between two other GPUs retransmitting 40 segments beside a
    straggler, seed 33) leaves the late rank's lateness its own. A controller outage
    reaches every rank, and so does any fault when the paths are not known past the
    first hop."""
    if fault.component == "controller":
        return True
    mine = [c for c in obs.connections if gpu in (c.src_gpu, c.dst_gpu)]
    if not mine or not all(c.full_path for c in mine):
        return True
    if fault.component == "switch":
        return any(fault.target in c.switches() for c in mine)
    nodes = _link_nodes(fault.target)
    if nodes is None:
        return True
    if gpu in nodes:
        return True
    if ">" in fault.target:  # one direction: only connections that crossed it that way
        return any(fault.target in c.directions() for c in mine)
    link = frozenset(nodes)
    return any(link == frozenset(_link_nodes(d) or ()) for c in mine for d in c.directions())
