"""Faults as an experiment writes them (``faults:``), validated against the fabric model.

Pure: no root, no running fabric. An entry names a kind, a target and the kind's own keys::

    faults:
      - kind: link-slow          # the link trains down: its rate x `rate`
        target: p0r0a1-c2        # a link: its two node names joined by '-', either order;
        rate: 0.25               #   'A>B' for one direction only
        at: 2s                   # after the first timed collective of the run starts
        duration: 30s            # default: until the run ends
      - {kind: link-down, target: p1s0g0-p1r0t1}
      - {kind: link-flap, target: p0r0t0-p0r0a1, period: 2s}
      - {kind: link-loss, target: p0r1t1-p0r1a0, probability: 0.02}
      - {kind: switch-down, target: p1r1t0}
      - {kind: straggler, target: p1s0g1, delay: 40ms}
      - {kind: blackhole, target: p0r0a0, destination: p1s1g0}
      - {kind: controller-crash, at: 5s, duration: 10s}

:data:`KINDS` is the one table of kinds: what each targets and which keys it takes. A
target is resolved into a :class:`Target` (the links, or the switch, or the GPU, and the
link ends a one-direction fault acts on). Times are durations with their unit (``2s``,
``40ms``, topologies/units.py); a bare number is refused, since "2" could be seconds or
microseconds. :func:`timeline` turns a fault into the instants its actions happen at,
relative to the run's origin: apply, undo, and for a flap every down and up.

Errors name the key (``faults[2].target``); a target that is not in the fabric lists the
nearest names (difflib).

Faults may overlap in time on the same link, switch, GPU or controller: they compose at
run time (the most restrictive rate, a port down while any fault holds it, the latest
straggler; orchestrator/testbed/faults.py), so validation does not refuse them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from topologies.model import Fabric, Link, Tier
from topologies.spec import _describe, _Reader
from topologies.units import format_duration, parse_duration

End = tuple[str, int]


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: what its target is (``link``, ``switch``, ``gpu`` or nothing),
    the keys it needs and may have beyond ``kind``, ``target``, ``at`` and ``duration``,
    whether ``A>B`` (one direction) makes sense, and what it does, in a phrase."""

    name: str
    target: str | None
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    directional: bool = False
    summary: str = ""


KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind("link-slow", "link", ("rate",), (), True, "the link's rate x rate (HTB)"),
        FaultKind("link-down", "link", summary="both ends of the link down"),
        FaultKind("link-flap", "link", ("period",), summary="down, then up, every period"),
        FaultKind(
            "link-loss", "link", ("probability",), (), True,
            "random drops with probability (nftables netdev egress)",
        ),
        FaultKind("switch-down", "switch", summary="every port of the switch down"),
        FaultKind("straggler", "gpu", ("delay",), summary="the GPU enters every collective late"),
        FaultKind(
            "blackhole", "switch", ("destination",),
            summary="the switch drops what it would forward to the destination GPU",
        ),
        FaultKind("controller-crash", None, summary="the controller killed, restarted at the end"),
    )
}  # fmt: skip

COMMON_KEYS = ("kind", "target", "at", "duration")
PARAM_KEYS = ("rate", "probability", "period", "delay", "destination")
# What the reader checks beyond the keys, named so that the experiment's JSON Schema
# (orchestrator/run/schema.py) is generated from the same facts.
FRACTION_KEYS = ("rate", "probability")
FRACTION_RANGE = (0.0, 1.0)  # above the first, at most the second
DURATION_KEYS = ("at", "duration", "period", "delay")
POSITIVE_DURATION_KEYS = ("duration", "period", "delay")  # above 0
#: A fault's durations end with their unit ("2" could be seconds or microseconds).
WITH_UNIT = re.compile(r"[^\s\d]\s*$")
MIN_FLAP_PERIOD = 0.2  # seconds, exclusive: a flap is down half of its period
ONE_WAY = ">"  # 'A>B': a link in one direction, for a directional kind


@dataclass(frozen=True)
class Target:
    """A fault's target resolved on the fabric: ``links`` (every link between the two
    nodes) with ``ends`` (the directions it acts on: both ends, or the first node's for
    ``A>B``), or a ``switch``, or a ``gpu``; nothing for ``controller-crash``."""

    text: str = ""
    links: tuple[Link, ...] = ()
    ends: tuple[End, ...] = ()
    switch: str | None = None
    gpu: str | None = None

    @property
    def one_direction(self) -> bool:
        return bool(self.ends)


@dataclass(frozen=True)
class FaultSpec:
    """One validated fault. ``id``: its position in ``faults:`` from 1 (or the id
    ``astral fault`` gave it); ``at``/``duration`` seconds from the run's origin (None:
    until the end); the kind's parameters (rate and probability as fractions, period and
    delay in seconds, destination a GPU)."""

    id: int
    kind: str
    target: Target = field(default_factory=Target)
    at: float = 0.0
    duration: float | None = None
    rate: float | None = None
    probability: float | None = None
    period: float | None = None
    delay: float | None = None
    destination: str | None = None

    @property
    def target_text(self) -> str:
        return self.target.text

    def params(self) -> dict[str, Any]:
        """Its keys as written (durations formatted), for the bundle and ``astral fault list``."""
        out: dict[str, Any] = {"at": format_duration(self.at) if self.at else "0s"}
        if self.duration is not None:
            out["duration"] = format_duration(self.duration)
        for key in ("rate", "probability", "destination"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        for key in ("period", "delay"):
            value = getattr(self, key)
            if value is not None:
                out[key] = format_duration(value)
        return out

    def describe(self) -> str:
        """``link-slow p0r0a1-c2 rate=0.25 at=2s duration=30s``."""
        params = " ".join(f"{k}={v}" for k, v in self.params().items())
        return " ".join(filter(None, [self.kind, self.target.text, params]))


# --- actions in time -----------------------------------------------------------------------

APPLY, UNDO, FLAP_DOWN, FLAP_UP = "apply", "undo", "flap-down", "flap-up"


@dataclass(frozen=True)
class Action:
    """What happens to fault ``fault`` at ``offset`` seconds after the origin (None: at the
    end of the run). ``n``: which flap (from 1) for flap actions."""

    offset: float | None
    fault: int
    what: str
    n: int = 0


def timeline(fault: FaultSpec) -> list[Action]:
    """The fault's first actions in order: apply at ``at``, a flap's first up half a
    period later (if it comes before the end), undo at ``at + duration`` (None: at the
    run's end). A flap's further ups and downs follow from :func:`next_flap`."""
    end = fault_end(fault)
    actions = [Action(fault.at, fault.id, APPLY)]
    if fault.kind == "link-flap":
        first = Action(fault.at, fault.id, FLAP_DOWN, 1)  # the apply is the first down
        following = next_flap(fault, first)
        if following is not None:
            actions.append(following)
    actions.append(Action(end, fault.id, UNDO))
    return actions


def fault_end(fault: FaultSpec) -> float | None:
    """Seconds after the origin the fault is undone at (None: at the run's end)."""
    return None if fault.duration is None else fault.at + fault.duration


def next_flap(fault: FaultSpec, last: Action) -> Action | None:
    """The flap action after ``last``: down for half a period, up for the other half,
    from ``at`` on; None once it would come at or after the fault's end."""
    assert fault.period is not None and last.offset is not None
    if last.what == FLAP_DOWN:
        following = Action(last.offset + fault.period / 2, fault.id, FLAP_UP, last.n)
    else:
        following = Action(last.offset + fault.period / 2, fault.id, FLAP_DOWN, last.n + 1)
    end = fault_end(fault)
    assert following.offset is not None
    return None if end is not None and following.offset >= end else following


# --- validation --------------------------------------------------------------------------


def parse_faults(
    read: _Reader, value: object, fabric: Fabric, key: str = "faults"
) -> tuple[FaultSpec, ...]:
    """Validate ``faults:`` (a list of mappings) against ``fabric``; ids from 1."""
    if value is None or value == []:
        return ()
    if not isinstance(value, list):
        read.fail(key, "a list of faults (each a mapping with a kind)", _describe(value))
    assert isinstance(value, list)
    return tuple(
        parse_fault(read, entry, fabric, f"{key}[{i}]", fault_id=i + 1)
        for i, entry in enumerate(value)
    )


def parse_fault(read: _Reader, value: object, fabric: Fabric, key: str, fault_id: int) -> FaultSpec:
    """One entry of ``faults:`` (see the module docstring)."""
    raw = read.mapping(value, key, set(COMMON_KEYS) | set(PARAM_KEYS))
    if "kind" not in raw:
        read.fail(f"{key}.kind", "this key to be present", "it missing")
    kind_name = raw["kind"]
    if not isinstance(kind_name, str) or kind_name not in KINDS:
        read.fail(f"{key}.kind", "a fault kind: one of " + ", ".join(KINDS), kind_name)
    kind = KINDS[kind_name]
    allowed = set(kind.required) | set(kind.optional)
    for name in PARAM_KEYS:
        if name in raw and name not in allowed:
            takes = ", ".join(kind.required + kind.optional) or "none"
            read.fail(f"{key}.{name}", f"only the keys {kind.name} takes ({takes})", "this key")
    for name in kind.required:
        if name not in raw:
            read.fail(
                f"{key}.{name}", f"this key to be present (a {kind.name} needs it)", "it missing"
            )
    target = _target(read, raw, kind, fabric, f"{key}.target")
    at = _duration(read, raw.get("at", "0s"), f"{key}.at")
    duration = None
    if "duration" in raw:
        duration = _duration(read, raw["duration"], f"{key}.duration")
        if duration <= 0:
            read.fail(
                f"{key}.duration",
                "a duration > 0 (or no duration: until the run ends)",
                raw["duration"],
            )
    spec = FaultSpec(id=fault_id, kind=kind.name, target=target, at=at, duration=duration)
    params: dict[str, Any] = {}
    if "rate" in raw:
        params["rate"] = _fraction(read, raw["rate"], f"{key}.rate", "the link's rate")
    if "probability" in raw:
        params["probability"] = _fraction(read, raw["probability"], f"{key}.probability", "a drop")
    if "period" in raw:
        params["period"] = _duration(read, raw["period"], f"{key}.period")
        if params["period"] <= MIN_FLAP_PERIOD:
            read.fail(
                f"{key}.period", "a period above 200ms (a flap is down half of it)", raw["period"]
            )
    if "delay" in raw:
        params["delay"] = _duration(read, raw["delay"], f"{key}.delay")
        if params["delay"] <= 0:
            read.fail(f"{key}.delay", "a delay > 0", raw["delay"])
    if "destination" in raw:
        params["destination"] = _node(
            read, raw["destination"], f"{key}.destination", fabric.gpus, "GPU"
        )
    return FaultSpec(**{**spec.__dict__, **params})


def _duration(read: _Reader, value: object, key: str) -> float:
    if not isinstance(value, str) or not WITH_UNIT.search(value):
        found = value if isinstance(value, str) else _describe(value)
        read.fail(key, "a duration with its unit, such as 2s, 500ms or 40ms", found)
    try:
        return parse_duration(value)
    except ValueError as error:
        read.fail(key, str(error), value)
    raise AssertionError("unreachable")


def _fraction(read: _Reader, value: object, key: str, what: str) -> float:
    low, high = FRACTION_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
        read.fail(key, f"a fraction of {what} above 0, at most 1 (0.25 = a quarter)", value)
    assert isinstance(value, (int, float))
    return float(value)


def _node(read: _Reader, value: object, key: str, names: Mapping[str, Any], what: str) -> str:
    if not isinstance(value, str) or value not in names:
        read.fail(key, f"a {what} of the fabric{_nearest(value, names)}", value)
    assert isinstance(value, str)
    return value


def _nearest(value: object, names: Sequence[str] | Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(str(value), list(names), n=4, cutoff=0.5)
    return f" (nearest: {', '.join(close)})" if close else ""


def link_names(fabric: Fabric) -> list[str]:
    """Every link as a target names it: ``a-b`` in the fabric's order of its ends."""
    return sorted({f"{link.a}-{link.b}" for link in fabric.links})


def _target(
    read: _Reader, raw: Mapping[str, Any], kind: FaultKind, fabric: Fabric, key: str
) -> Target:
    if kind.target is None:
        if "target" in raw:
            read.fail(key, f"no target ({kind.name} acts on the controller)", raw["target"])
        return Target()
    if "target" not in raw:
        read.fail(key, f"this key to be present (a {kind.target} for {kind.name})", "it missing")
    text = raw["target"]
    if not isinstance(text, str) or not text:
        read.fail(key, f"a {kind.target} of the fabric as a name", _describe(text))
    if kind.target == "switch":
        name = _node(read, text, key, fabric.switches, "switch")
        if kind.name == "blackhole" and fabric.switches[name].tier is Tier.NVLINK:
            read.fail(key, "an OpenFlow switch (ToR, aggregation or core), not an NVSwitch", text)
        return Target(text, switch=name)
    if kind.target == "gpu":
        return Target(text, gpu=_node(read, text, key, fabric.gpus, "GPU"))
    return resolve_link(read, text, kind, fabric, key)


def resolve_link(read: _Reader, text: str, kind: FaultKind, fabric: Fabric, key: str) -> Target:
    """``A-B`` (either order: every link between A and B, both directions) or ``A>B``
    (A's ends of those links: what A sends to B)."""
    one_way = ONE_WAY in text
    if one_way and not kind.directional:
        read.fail(key, f"a link as A-B ({kind.name} acts on both directions)", text)
    nodes = set(fabric.nodes())
    pairs: list[tuple[str, str]] = []
    separator = ONE_WAY if one_way else "-"
    for i, char in enumerate(text):
        if char == separator and text[:i] in nodes and text[i + 1 :] in nodes:
            pairs.append((text[:i], text[i + 1 :]))
    for a, b in pairs:
        links = fabric.links_between(a, b)
        if links:
            ends = tuple((a, link.port_of(a)) for link in links) if one_way else ()
            return Target(text, links=tuple(links), ends=ends)
    hint = _nearest(text.replace(ONE_WAY, "-"), link_names(fabric))
    read.fail(key, f"a link of the fabric: two linked node names joined by '-' or '>'{hint}", text)
    raise AssertionError("unreachable")
