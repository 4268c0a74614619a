"""The emulator's capacity in hop-bit/s: what an experiment offers, what a calibration found.

Open vSwitch's userspace datapath forwards every packet on few threads, so the emulator has a
finite capacity per machine; an experiment that offers more than a safe share of it measures
the emulator, not the fabric (docs/environment.md, docs/fidelity.md). ``astral calibrate``
measures that capacity (orchestrator.calibration.measure) and stores it
(:func:`save_calibration`); the load guard (orchestrator.run.loadguard) reads it
(:func:`load_calibration`) and compares an experiment's :func:`offered_load` against
``safe_share x capacity`` (:func:`assess`) before a run.

This module is arithmetic on the fabric model and the calibration file only: it builds no
emulation and needs no root, so the load guard, ``astral calibrate --show`` and the tests
import it anywhere. The measurement, which needs both, is ``measure``.

The unit: bit/s x switch hops ("hop-bit/s")
-------------------------------------------
The datapath's work is per packet per switch: every Open vSwitch bridge a packet crosses is
one receive from a veth, one flow lookup and one send, on ovs-vswitchd's threads (NVLink
switches are Linux bridges: the kernel forwards those, not ovs-vswitchd). So a 20 Mbit/s
flow crossing 5 switches costs about what five 20 Mbit/s flows crossing one switch cost,
and capacity and offered load are both counted in bit/s summed over the switch hops each
bit crosses. Per *packet* would be more exact still, but the packet count depends on how
much TCP and userspace TSO batch (at 20 Mbit/s per flow GSO packets are about two segments;
faster flows send bigger ones, which cost less per bit), which nothing before a run knows;
the calibration therefore runs its flows at the fabric's own emulated NIC rate first, where
experiments run, and records the per-flow rate of every step.

Offered load of an experiment (:func:`offered_load`)::

    GPUs of the placement x NIC ports x emulated NIC rate x mean switch hops

where the mean runs over the ordered pairs of placement GPUs on different servers (peers on
one server talk over NVLink). It is the most the GPUs can inject, each bit carried as far as
an average peer: an upper bound for the collectives here, which keep every NIC busy at most.

The capacity from the measured load steps (:func:`find_capacity`)
-----------------------------------------------------------------
Each :class:`LoadStep` compares the goodput its flows achieved with what a perfect emulator
would carry: its *fidelity ratio*. The capacity is where the ratio falls below ``threshold``
(0.9): interpolated (in log load) between the last step above and the first below; a
calibration that never fell below stores its highest step as a lower bound, one whose first
step fell below stores what that step achieved as an upper bound.

File (JSON, version 1; default ``/var/lib/astral/calibration.json``, ``$ASTRAL_CALIBRATION``
or ``--out`` override)::

    {"version": 1, "unit": "hop-bit/s", "capacity_bps": 1.9e9, "bound": "bracketed",
     "threshold": 0.9, "safe_share": 0.7, "measured_at": "2026-...Z",
     "conditions": {"cpus": 2, "loadavg_start": [...], "loadavg_end": [...],
                    "datapath": "userspace", "userspace_tso": true, "ovs_version": "3.1.0",
                    "kernel": "...", "hostname": "...", "datapath_ports": 211,
                    "recipe": "small-packets", ...},
     "fabric": {"name": "astral-small", "nic_rate_bps": 2e7, "trunk_factor": 4, ...},
     "steps": [{"flows": 1, "rate_bps": 2e7, "hops": 5.0, "offered_bps": 2e7,
                "offered_hop_bps": 1e8, "achieved_bps": 1.86e7, "ratio": 0.97, ...}, ...]}
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any

from topologies.errors import ConfigError
from topologies.fabricspec import FabricSpec
from topologies.generators import build_fabric
from topologies.model import Fabric, LinkKind
from topologies.units import format_rate

VERSION = 1
UNIT = "hop-bit/s"
ENV_VAR = "ASTRAL_CALIBRATION"
DEFAULT_PATH = Path("/var/lib/astral/calibration.json")
DEFAULT_SAFE_SHARE = 0.7
DEFAULT_THRESHOLD = 0.9
RERUN_HINT = "run `sudo astral calibrate` again to replace it"
FABRIC_LINKS = (LinkKind.NIC, LinkKind.TOR_AGG, LinkKind.AGG_CORE)


# --- switch hops and offered load ---------------------------------------------------------


def switch_hops(fabric: Fabric, src: str) -> dict[str, int]:
    """Open vSwitch switches crossed from GPU ``src`` to every GPU it reaches over the
    fabric (shortest paths; NVLink switches are Linux bridges and do not count).

    GPUs are never transit nodes, except on fabrics whose GPUs forward between rails
    (rail-only): there ``src`` first hands a packet over NVLink to its server-mate on the
    destination's rail, which sends it on (hostconfig's rail routes), so a destination not
    reachable directly is reached in the hops of the best server-mate.
    """
    adjacency: dict[str, list[str]] = {}
    for link in fabric.links:
        if link.kind in FABRIC_LINKS:
            adjacency.setdefault(link.a, []).append(link.b)
            adjacency.setdefault(link.b, []).append(link.a)

    def from_gpu(start: str) -> dict[str, int]:
        dist = {start: 0}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            if node in fabric.gpus and node != start:
                continue  # a GPU is an end, not a switch
            for neighbour in adjacency.get(node, ()):
                if neighbour not in dist:
                    dist[neighbour] = dist[node] + 1
                    queue.append(neighbour)
        # links crossed - 1 = switches crossed
        return {g: d - 1 for g, d in dist.items() if g in fabric.gpus and g != start}

    hops = from_gpu(src)
    if fabric.gpu_forwarding:
        server = fabric.servers[fabric.gpus[src].server]
        for mate in server.gpus:
            if mate == src:
                continue
            for dst, via in from_gpu(mate).items():
                if dst != src and (dst not in hops or via < hops[dst]):
                    hops[dst] = via
    return hops


def mean_hops(fabric: Fabric, gpus: Sequence[str] | None = None) -> float:
    """Mean switch hops over ordered pairs of ``gpus`` (default all) on different servers;
    0.0 when no pair crosses the fabric."""
    chosen = list(gpus) if gpus is not None else [g.name for g in fabric.gpus_by_rank()]
    total = pairs = 0
    for src in chosen:
        hops = switch_hops(fabric, src)
        for dst in chosen:
            if dst == src or fabric.gpus[dst].server == fabric.gpus[src].server:
                continue
            if dst in hops:
                total += hops[dst]
                pairs += 1
    return total / pairs if pairs else 0.0


@dataclass(frozen=True)
class OfferedLoad:
    """The most an experiment's GPUs can inject, and what that costs the datapath."""

    gpus: int
    nic_ports: int
    nic_rate_bps: float  # emulated, per NIC port
    mean_hops: float

    @property
    def gpu_bps(self) -> float:
        """bit/s the GPUs inject: GPUs x NIC ports x emulated NIC rate."""
        return self.gpus * self.nic_ports * self.nic_rate_bps

    @property
    def hop_bps(self) -> float:
        """The same in the calibration's unit: bit/s x mean switch hops."""
        return self.gpu_bps * self.mean_hops

    def describe(self) -> str:
        return (
            f"{self.gpus} GPUs x {self.nic_ports} NIC ports x {format_rate(self.nic_rate_bps)} "
            f"x {self.mean_hops:.2f} mean switch hops = {hop_mbps(self.hop_bps)}"
        )


def offered_load(fabric: FabricSpec | Fabric, gpus: Sequence[str] | None = None) -> OfferedLoad:
    """The offered load of an experiment on ``fabric`` placed on ``gpus`` (default all)."""
    model = fabric if isinstance(fabric, Fabric) else build_fabric(fabric)
    spec = model.spec
    chosen = list(gpus) if gpus is not None else [g.name for g in model.gpus_by_rank()]
    return OfferedLoad(
        gpus=len(chosen),
        nic_ports=spec.nic_ports,
        nic_rate_bps=spec.emulation.emulated(spec.speeds.nic),
        mean_hops=mean_hops(model, chosen),
    )


#: What a calibration made before recipes had names was measured under.
UNNAMED_RECIPE = "small-packets (not recorded: measured before recipes had names)"


def hop_mbps(bps: float) -> str:
    return f"{bps / 1e6:.0f} hop-Mbit/s"


# --- the calibration record ---------------------------------------------------------------


@dataclass(frozen=True)
class LoadStep:
    """One load step: ``flows`` TCP flows at ``rate_bps`` each, over ``hops`` switches."""

    flows: int
    rate_bps: float  # emulated NIC rate (every flow's own bottleneck)
    hops: float  # mean switch hops of the flows
    offered_bps: float  # flows x rate
    offered_hop_bps: float  # sum over flows of rate x hops
    achieved_bps: float  # goodput summed over the flows
    ratio: float  # achieved / (offered x TCP_PAYLOAD_SHARE)
    jain: float = 0.0
    retransmits: int = 0
    cpu_busy: float = 0.0  # share of all CPUs busy (everything on the machine)
    vswitchd_cores: float = 0.0
    loadavg: float = 0.0  # 1-minute load average at the end of the step
    runs: int = 1  # measurements averaged into this step
    #: The recipe's packet scale F at this step's rates (orchestrator.emulation.recipe:
    #: packets F times the reference's; 1 for recipes whose packets never grow).
    packet_scale: int = 1


@dataclass(frozen=True)
class Calibration:
    """What ``astral calibrate`` measured. ``capacity_bps`` is in hop-bit/s (see the module
    docstring); ``source`` is the file it was read from (empty when not from a file)."""

    capacity_bps: float
    bound: str  # "bracketed" | "lower" (never fell below: at least this) | "upper"
    safe_share: float = DEFAULT_SAFE_SHARE
    threshold: float = DEFAULT_THRESHOLD
    measured_at: str = ""
    conditions: dict[str, Any] = field(default_factory=dict)
    fabric: dict[str, Any] = field(default_factory=dict)
    steps: tuple[LoadStep, ...] = ()
    source: str = ""

    @property
    def safe_bps(self) -> float:
        return self.capacity_bps * self.safe_share

    @property
    def packet_scale(self) -> int:
        """The packet scale the capacity was found at: that of the step that bounds it
        (the first below the threshold, else the last measured)."""
        below = [s for s in self.steps if s.ratio < self.threshold]
        bounding = below[0] if below else (self.steps[-1] if self.steps else None)
        return bounding.packet_scale if bounding is not None else 1

    def at_packet_scale(self, packet_scale: int) -> Calibration:
        """The capacity for a run whose packets have ``packet_scale`` (F).

        The headline capacity holds for F at least as large as the scale it was found at,
        and proportionally less for smaller packets (F / F_capacity: the emulator's work is
        per packet; conservative, since the per-byte part of the work shrinks too). Steps
        measured at F itself bound it as the whole calibration is bounded
        (:func:`find_capacity` on them alone): where one fell below the threshold, that is
        the figure; where none did, at least their most. Either way it is raised to what any
        step carried faithfully at packets of F or smaller and, unless a step at F itself
        fell below, to F / F_step of what a step with larger packets carried: never more
        than some step showed."""
        bound = self.bound
        if packet_scale >= self.packet_scale:
            capacity = self.capacity_bps
        else:
            capacity = self.capacity_bps * packet_scale / self.packet_scale
        own = [s for s in self.steps if s.packet_scale == packet_scale]
        if own and packet_scale != self.packet_scale:
            measured, measured_bound = find_capacity(own, self.threshold)
            if measured_bound != "lower":
                capacity, bound = measured, measured_bound
            elif measured > capacity:
                capacity, bound = measured, "lower"
        failed_here = any(s.ratio < self.threshold for s in own)
        shown = max(
            (
                s.offered_hop_bps * min(1.0, packet_scale / s.packet_scale)
                for s in self.steps
                if s.ratio >= self.threshold and (s.packet_scale <= packet_scale or not failed_here)
            ),
            default=0.0,
        )
        if shown > capacity:
            capacity, bound = shown, ("bracketed" if bound == "upper" else bound)
        if (capacity, bound) == (self.capacity_bps, self.bound):
            return self
        return replace(self, capacity_bps=capacity, bound=bound)

    def scale_lines(self) -> list[str]:
        """One line per packet scale the steps were measured at, when more than one: the
        capacity a run at that scale is judged against (:meth:`at_packet_scale`)."""
        scales = sorted({s.packet_scale for s in self.steps})
        if len(scales) < 2:
            return []
        lines = []
        for scale in scales:
            at = self.at_packet_scale(scale)
            lines.append(
                f"  packets x{scale:<3d} {hop_mbps(at.capacity_bps)} ({at.bound}), safe "
                f"{hop_mbps(at.safe_bps)}"
            )
        return ["at packet scale (runs are judged at their own)", *lines]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "unit": UNIT,
            "capacity_bps": self.capacity_bps,
            "bound": self.bound,
            "threshold": self.threshold,
            "safe_share": self.safe_share,
            "measured_at": self.measured_at,
            "conditions": self.conditions,
            "fabric": self.fabric,
            "steps": [asdict(step) for step in self.steps],
        }

    @classmethod
    def from_dict(cls, document: object, source: str = "<inline>") -> Calibration:
        """Validate a parsed calibration file; ConfigError naming the key otherwise."""
        check = _Checker(source)
        doc = check.mapping(document, "")
        version = doc.get("version")
        if version != VERSION:
            check.fail("version", f"{VERSION} (a file written by this astral)", version)
        if doc.get("unit") != UNIT:
            check.fail("unit", repr(UNIT), doc.get("unit"))
        bound = doc.get("bound")
        if bound not in BOUNDS:
            check.fail("bound", "one of " + ", ".join(BOUNDS), bound)
        measured_at = doc.get("measured_at", "")
        if not isinstance(measured_at, str):
            check.fail("measured_at", "a date (text)", measured_at)
        steps_doc = doc.get("steps", [])
        if not isinstance(steps_doc, list):
            check.fail("steps", "a list", type(steps_doc).__name__)
        steps = tuple(_step(check, item, f"steps[{i}]") for i, item in enumerate(steps_doc))
        return cls(
            capacity_bps=check.number(doc.get("capacity_bps"), "capacity_bps", positive=True),
            bound=str(bound),
            safe_share=check.share(doc.get("safe_share", DEFAULT_SAFE_SHARE), "safe_share"),
            threshold=check.share(doc.get("threshold", DEFAULT_THRESHOLD), "threshold"),
            measured_at=str(measured_at),
            conditions=dict(check.mapping(doc.get("conditions", {}), "conditions")),
            fabric=dict(check.mapping(doc.get("fabric", {}), "fabric")),
            steps=steps,
            source=source,
        )

    @property
    def recipe(self) -> str:
        """The emulator recipe it was measured under (orchestrator.emulation.recipe);
        calibrations older than recipes' names were measured under ``small-packets``."""
        return str(self.conditions.get("recipe", "small-packets"))

    def lines(self) -> list[str]:
        """A human summary: capacity, safe load and conditions."""
        bound = {
            "bracketed": "fidelity fell below the threshold there",
            "lower": "a lower bound: fidelity never fell below the threshold",
            "upper": "an upper bound: fidelity was below the threshold from the first step",
        }[self.bound]
        c = self.conditions
        load = c.get("loadavg_start", []), c.get("loadavg_end", [])
        quick = self.fabric.get("plan") == "quick"
        return [
            f"capacity   {hop_mbps(self.capacity_bps)} ({bound}; threshold "
            f"{self.threshold:g} of the ideal goodput"
            + (
                "; the quick calibration: `sudo astral calibrate` measures more steps)"
                if quick
                else ")"
            ),
            f"safe load  {hop_mbps(self.safe_bps)} ({self.safe_share:.0%} of the capacity)",
            f"measured   {self.measured_at or '?'} on {c.get('hostname', '?')}: "
            f"{c.get('cpus', '?')} CPUs, load average {_loads(load[0])} -> {_loads(load[1])}",
            f"recipe     {c.get('recipe', UNNAMED_RECIPE)}"
            + (
                f"; the capacity holds for packets at scale {self.packet_scale} (links at "
                f"{self.packet_scale} x the recipe's reference rate); a run with smaller "
                "packets gets its share of it"
                if self.packet_scale > 1
                else ""
            ),
            f"datapath   {c.get('datapath', '?')}, userspace TSO "
            f"{_onoff(c.get('userspace_tso'))}, OVS {c.get('ovs_version', '?')}, kernel "
            f"{c.get('kernel', '?')}, {c.get('datapath_ports', '?')} datapath ports, TCP "
            f"{c.get('tcp_congestion_control', '?')}",
            *self.scale_lines(),
        ]


BOUNDS = ("bracketed", "lower", "upper")


def _loads(values: object) -> str:
    if isinstance(values, list) and values:
        return " ".join(f"{float(v):.2f}" for v in values)
    return "?"


def _onoff(value: object) -> str:
    return {True: "on", False: "off"}.get(value, "n/a") if isinstance(value, bool) else "n/a"


class _Checker:
    """Walks a parsed calibration file; every problem is a ConfigError naming the key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, expected: str, found: object = None) -> None:
        raise ConfigError(self.source, key, expected, found, detail=RERUN_HINT)

    def mapping(self, value: object, key: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(key, "a JSON object", type(value).__name__)
        assert isinstance(value, Mapping)
        return value

    def number(self, value: object, key: str, *, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, "a number", value)
        assert isinstance(value, (int, float))
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            self.fail(key, "a positive number" if positive else "a number >= 0", value)
        return float(value)

    def share(self, value: object, key: str) -> float:
        number = self.number(value, key, positive=True)
        if number > 1:
            self.fail(key, "a share between 0 and 1", value)
        return number


_STEP_INTS = ("flows", "retransmits", "runs", "packet_scale")


def _step(check: _Checker, item: object, key: str) -> LoadStep:
    doc = check.mapping(item, key)
    values: dict[str, Any] = {}
    for step_field in fields(LoadStep):
        name = step_field.name
        if name not in doc:
            if step_field.default is MISSING:  # required
                check.fail(f"{key}.{name}", "this key to be present", "it missing")
            continue
        number = check.number(doc[name], f"{key}.{name}")
        values[name] = int(number) if name in _STEP_INTS else number
    return LoadStep(**values)


def calibration_path(explicit: str | Path | None = None) -> Path:
    """Where the calibration lives: ``explicit`` > ``$ASTRAL_CALIBRATION`` > the default."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else DEFAULT_PATH


def load_calibration(path: str | Path | None = None) -> Calibration | None:
    """This machine's calibration, or None when there is none (never made up). A damaged
    file is a ConfigError naming the file and what is wrong."""
    where = calibration_path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(where, "", "a readable calibration file", str(err)) from None
    try:
        document = json.loads(text)
    except ValueError as err:
        found = f"invalid JSON ({err})" if text.strip() else "an empty file"
        raise ConfigError(where, "", "a JSON calibration file", found, detail=RERUN_HINT) from None
    return Calibration.from_dict(document, str(where))


def save_calibration(calibration: Calibration, path: str | Path | None = None) -> Path:
    """Write ``calibration`` atomically (parents created); returns the path."""
    where = calibration_path(path)
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_name(f".{where.name}.tmp")
    tmp.write_text(json.dumps(calibration.to_dict(), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, where)
    return where


# --- verdict ------------------------------------------------------------------------------


class Verdict(str, Enum):
    OK = "ok"
    OVER = "exceeds-safe-share"
    UNCALIBRATED = "uncalibrated"


@dataclass(frozen=True)
class Assessment:
    """An offered load against a calibration (None: this machine has none)."""

    offered: OfferedLoad
    calibration: Calibration | None
    safe_share: float

    @property
    def safe_bps(self) -> float | None:
        if self.calibration is None:
            return None
        return self.calibration.capacity_bps * self.safe_share

    @property
    def share(self) -> float | None:
        """Offered load as a share of the capacity (None: uncalibrated)."""
        if self.calibration is None:
            return None
        return self.offered.hop_bps / self.calibration.capacity_bps

    @property
    def verdict(self) -> Verdict:
        return verdict(self.offered.hop_bps, self.calibration, self.safe_share)

    def line(self) -> str:
        if self.calibration is None:
            return (
                f"offered {self.offered.describe()}; no calibration on this machine "
                "(`sudo astral calibrate`): whether the emulator carries it is unknown"
            )
        assert self.share is not None and self.safe_bps is not None
        text = "within" if self.verdict is Verdict.OK else "EXCEEDS"
        return (
            f"offered {self.offered.describe()} = {self.share:.0%} of the capacity: {text} "
            f"the safe share ({self.safe_share:.0%}, {hop_mbps(self.safe_bps)})"
        )


def verdict(
    offered_hop_bps: float, calibration: Calibration | None, safe_share: float | None = None
) -> Verdict:
    """OK up to ``safe_share`` (default: the calibration's) of the capacity, OVER above;
    UNCALIBRATED without a calibration."""
    if calibration is None:
        return Verdict.UNCALIBRATED
    share = calibration.safe_share if safe_share is None else safe_share
    return Verdict.OK if offered_hop_bps <= calibration.capacity_bps * share else Verdict.OVER


def assess(
    fabric: FabricSpec | Fabric,
    gpus: Sequence[str] | None = None,
    calibration: Calibration | None = None,
    safe_share: float | None = None,
) -> Assessment:
    """:func:`offered_load` of ``fabric``/``gpus`` against ``calibration`` (pass
    :func:`load_calibration`'s result; None means uncalibrated)."""
    share = safe_share
    if share is None:
        share = calibration.safe_share if calibration is not None else DEFAULT_SAFE_SHARE
    return Assessment(offered_load(fabric, gpus), calibration, share)


# --- finding the capacity -----------------------------------------------------------------


def find_capacity(
    steps: Sequence[LoadStep], threshold: float = DEFAULT_THRESHOLD
) -> tuple[float, str]:
    """(capacity in hop-bit/s, bound) from the steps measured (module docstring)."""
    if not steps:
        raise ValueError("no steps measured")
    ordered = sorted(steps, key=lambda s: s.offered_hop_bps)
    last_good: LoadStep | None = None
    for step in ordered:
        if step.ratio >= threshold:
            last_good = step
            continue
        if last_good is None:
            return step.achieved_bps / step.offered_bps * step.offered_hop_bps, "upper"
        low, high = math.log(last_good.offered_hop_bps), math.log(step.offered_hop_bps)
        fraction = (last_good.ratio - threshold) / (last_good.ratio - step.ratio)
        return math.exp(low + fraction * (high - low)), "bracketed"
    assert last_good is not None
    return last_good.offered_hop_bps, "lower"


# --- load steps as a table ----------------------------------------------------------------


STEP_HEADER = (
    f"{'flows':>5} {'rate':>6} {'hops':>4} {'offered':>9} {'hop-load':>10} "
    f"{'achieved':>9} {'ratio':>6} {'Jain':>5} {'ovs cores':>9} {'CPU':>4} {'load':>5}"
)


def step_line(step: LoadStep) -> str:
    return (
        f"{step.flows:>5} {format_rate(step.rate_bps):>6} {step.hops:>4.1f} "
        f"{step.offered_bps / 1e6:>7.0f} M {step.offered_hop_bps / 1e6:>8.0f} M "
        f"{step.achieved_bps / 1e6:>7.1f} M {step.ratio:>6.3f} {step.jain:>5.3f} "
        f"{step.vswitchd_cores:>9.2f} {step.cpu_busy:>4.0%} {step.loadavg:>5.2f}"
    )


def step_lines(steps: Iterable[LoadStep]) -> list[str]:
    return [STEP_HEADER, *(step_line(s) for s in steps)]
