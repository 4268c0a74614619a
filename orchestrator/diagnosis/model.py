"""What a diagnosis says: healthy, or suspects ranked by score, each with its evidence.

A suspect names a component in the fabric's own names (a link ``A-B``, or ``A>B`` when
only that direction is affected; a switch; a GPU; ``controller``), the fault it looks like
and the chain of evidence across the layers that points at it. ``onset`` is when the first
evidence of it was seen (epoch seconds; None when the evidence has no instant, e.g. a
counter total): the live alert and the benchmark's detection delay use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COMPONENTS = ("link", "switch", "gpu", "controller")
FAULTS = ("down", "flapping", "slow", "lossy", "blackhole", "straggler", "controller outage")


@dataclass
class Suspect:
    component: str
    target: str
    fault: str
    score: float
    evidence: list[str] = field(default_factory=list)
    onset: float | None = None
    #: what kind of evidence it rests on, for the rules that weigh suspects against each
    #: other (diagnose.reconcile): e.g. :data:`UNCOUNTED`; not part of the output
    signs: set[str] = field(default_factory=set)

    def key(self) -> tuple[str, str, str]:
        return (self.component, self.target, self.fault)

    def to_dict(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "target": self.target,
            "fault": self.fault,
            "score": round(self.score, 3),
            "evidence": list(self.evidence),
            "onset": self.onset,
        }


THRESHOLD = 0.5  # a suspect scored this or more is shown; none: healthy
#: below the threshold, a suspect scored this or more is listed as less likely after those
#: shown, while fewer than :data:`LISTED` are (only when something is shown: a healthy
#: verdict lists nothing). What one egress or one end of a link gets from evidence that
#: fits two: seed 52 run 29's lossy p0a3>p0t0 scored 0.17 behind p0a3>p0t1's 0.55, its
#: two connections' retransmissions 16 and 7, split by which way each one's data went
ALSO_FLOOR = 0.15
LISTED = 3
#: a sign: retransmissions no counter explains, on a GPU's link out (detectors.uncounted_losses)
UNCOUNTED = "uncounted-loss"
#: a sign: probes stalled across the whole fabric, not at one switch (probes.probe_holes)
FABRIC_WIDE = "fabric-wide-stall"


@dataclass
class Diagnosis:
    """``healthy`` when no suspect scored enough; ``notes``: what limits the diagnosis
    (an emulator-bound run, a bundle without paths or counters)."""

    suspects: list[Suspect]
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    threshold: float = THRESHOLD

    @property
    def healthy(self) -> bool:
        return not any(s.score >= self.threshold for s in self.suspects)

    @property
    def ranked(self) -> list[Suspect]:
        """The suspects above the threshold, best first."""
        return [s for s in self.suspects if s.score >= self.threshold]

    @property
    def less_likely(self) -> list[Suspect]:
        """Suspects under the threshold listed after the ranked ones, while fewer than
        :data:`LISTED` are shown, each scored :data:`ALSO_FLOOR` or more and naming
        something no suspect before it names (the same component and fault): evidence
        that fits more than one place says where else it could be. Nothing when the
        verdict is healthy: a run without a suspect gets no list to doubt."""
        ranked = self.ranked
        if not ranked:
            return []
        seen = {_named(s) for s in ranked}
        out: list[Suspect] = []
        below = sorted(
            (s for s in self.suspects if ALSO_FLOOR <= s.score < self.threshold),
            key=lambda s: (-s.score, s.component, s.target),
        )
        for s in below:
            if len(ranked) + len(out) >= LISTED:
                break
            if _named(s) not in seen:
                seen.add(_named(s))
                out.append(s)
        return out

    @property
    def listed(self) -> list[Suspect]:
        """Every suspect the output lists: the ranked ones, then the less likely ones."""
        return self.ranked + self.less_likely

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "suspects": [s.to_dict() for s in self.listed],
            "threshold": self.threshold,
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
        }

    def render(self) -> str:
        lines = []
        if self.healthy:
            lines.append(
                "healthy: nothing anomalous in any layer"
                if not self.suspects and not self.notes
                else f"healthy: no suspect scored {self.threshold} or more"
            )
        else:
            lines.append(f"{len(self.ranked)} suspect(s), most likely first:")
            for n, s in enumerate(self.ranked, 1):
                lines.append(f"{n}. {s.component} {s.target}: {s.fault} (score {s.score:.2f})")
                lines += [f"     {'->' if i else '  '} {e}" for i, e in enumerate(s.evidence)]
            if self.less_likely:
                lines.append(f"less likely (scored under {self.threshold}):")
            for n, s in enumerate(self.less_likely, len(self.ranked) + 1):
                lines.append(f"{n}. {s.component} {s.target}: {s.fault} (score {s.score:.2f})")
                lines += [f"     {'->' if i else '  '} {e}" for i, e in enumerate(s.evidence)]
        lines += [f"note: {note}" for note in self.notes]
        lines.append(f"diagnosed in {self.seconds:.2f} s")
        return "\n".join(lines)


def _named(s: Suspect) -> tuple[str, str, str]:
    """What a suspect names: its component, its target (a link by its two ends, whichever
    direction or order) and its fault."""
    target = s.target
    if s.component == "link":
        for sep in (">", "-"):
            a, found, b = target.partition(sep)
            if found:
                target = "-".join(sorted((a, b)))
                break
    return (s.component, target, s.fault)
