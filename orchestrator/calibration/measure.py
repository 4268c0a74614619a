"""How much traffic this machine's emulator carries faithfully: measured, stored, compared.

Open vSwitch's userspace datapath forwards every packet on few threads, so the emulator has a
finite capacity per machine; an experiment that offers more than a safe share of it measures
the emulator, not the fabric (docs/environment.md, docs/fidelity.md). ``astral calibrate``
measures that capacity (:func:`calibrate`) and stores it (:func:`save_calibration`); the load
guard (orchestrator.run.loadguard) reads it (:func:`load_calibration`) and compares an
experiment's :func:`offered_load` against ``safe_share x capacity`` before a run.

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

The measurement (:func:`calibrate`)
-----------------------------------
1. the calibration fabric: the chosen one (default astral-small) with its tor-agg and
   agg-core links at ``trunk_factor`` (4) x the NIC rate, so that only NIC links limit the
   flows and no two flows of a step compete (:func:`calibration_fabric`);
2. flows between GPU i and GPU i + n/2 in rank order, both directions (cross-pod on the
   presets: the longest paths), one flow per sending and per receiving GPU
   (:func:`calibration_flows`);
3. steps of increasing offered load: k = 1, 2, 4, ... flows at the emulated NIC rate up to
   one per GPU, then all of them with every link re-shaped to 2x, 4x, 8x that rate
   (the same recipe, orchestrator.emulation.shaping, at a larger scale);
4. each step runs its flows at once (orchestrator.testbed.traffic) and compares the goodput they
   achieved with what a perfect emulator would carry, ``flows x rate x TCP_PAYLOAD_SHARE``
   (1460/1514, TCP's payload share of the frames HTB counts, without TCP timestamps as the
   GPUs send): the step's *fidelity ratio*;
5. the capacity is where the ratio falls below ``threshold`` (0.9): interpolated (in log
   load) between the last step above and the first below; a step that falls below is
   measured once more and the two ratios averaged, so one noisy sample does not end the
   search; a calibration that never fell below stores its highest step as a lower bound,
   one whose first step fell below stores what that step achieved as an upper bound.

File (JSON, version 1; default ``/var/lib/astral/calibration.json``, ``$ASTRAL_CALIBRATION``
or ``--out`` override)::

    {"version": 1, "unit": "hop-bit/s", "capacity_bps": 1.9e9, "bound": "bracketed",
     "threshold": 0.9, "safe_share": 0.7, "measured_at": "2026-...Z",
     "conditions": {"cpus": 2, "loadavg_start": [...], "loadavg_end": [...],
                    "datapath": "userspace", "userspace_tso": true, "ovs_version": "3.1.0",
                    "kernel": "...", "hostname": "...", "datapath_ports": 211, ...},
     "fabric": {"name": "astral-small", "nic_rate_bps": 2e7, "trunk_factor": 4, ...},
     "steps": [{"flows": 1, "rate_bps": 2e7, "hops": 5.0, "offered_bps": 2e7,
                "offered_hop_bps": 1e8, "achieved_bps": 1.86e7, "ratio": 0.97, ...}, ...]}
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import subprocess
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.testbed.traffic import Flow, TrafficResult
from topologies.addressing import FABRIC_PREFIX
from topologies.errors import ConfigError, EmulationError, EnvironmentProblem
from topologies.generators import build_fabric
from topologies.model import Fabric, LinkKind
from topologies.spec import EmulationSpec, FabricSpec, Speeds
from topologies.units import TCP_PAYLOAD_SHARE, format_rate

if TYPE_CHECKING:
    from orchestrator.emulation.network import Emulation

VERSION = 1
UNIT = "hop-bit/s"
ENV_VAR = "ASTRAL_CALIBRATION"
DEFAULT_PATH = Path("/var/lib/astral/calibration.json")
DEFAULT_SAFE_SHARE = 0.7
DEFAULT_THRESHOLD = 0.9
DEFAULT_TRUNK_FACTOR = 4.0
RERUN_HINT = "run `sudo astral calibrate` again to replace it"
FABRIC_LINKS = (LinkKind.NIC, LinkKind.TOR_AGG, LinkKind.AGG_CORE)

Log = Callable[[str], None]


# --- switch hops and offered load (pure) --------------------------------------------------


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


def hop_mbps(bps: float) -> str:
    return f"{bps / 1e6:.0f} hop-Mbit/s"


# --- the calibration record ---------------------------------------------------------------


@dataclass(frozen=True)
class Step:
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
    steps: tuple[Step, ...] = ()
    source: str = ""

    @property
    def safe_bps(self) -> float:
        return self.capacity_bps * self.safe_share

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

    def lines(self) -> list[str]:
        """A human summary: capacity, safe load and conditions."""
        bound = {
            "bracketed": "fidelity fell below the threshold there",
            "lower": "a lower bound: fidelity never fell below the threshold",
            "upper": "an upper bound: fidelity was below the threshold from the first step",
        }[self.bound]
        c = self.conditions
        load = c.get("loadavg_start", []), c.get("loadavg_end", [])
        return [
            f"capacity   {hop_mbps(self.capacity_bps)} ({bound}; threshold "
            f"{self.threshold:g} of the ideal goodput)",
            f"safe load  {hop_mbps(self.safe_bps)} ({self.safe_share:.0%} of the capacity)",
            f"measured   {self.measured_at or '?'} on {c.get('hostname', '?')}: "
            f"{c.get('cpus', '?')} CPUs, load average {_loads(load[0])} -> {_loads(load[1])}",
            f"datapath   {c.get('datapath', '?')}, userspace TSO "
            f"{_onoff(c.get('userspace_tso'))}, OVS {c.get('ovs_version', '?')}, kernel "
            f"{c.get('kernel', '?')}, {c.get('datapath_ports', '?')} datapath ports, TCP "
            f"{c.get('tcp_congestion_control', '?')}",
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


_STEP_INTS = ("flows", "retransmits", "runs")


def _step(check: _Checker, item: object, key: str) -> Step:
    doc = check.mapping(item, key)
    values: dict[str, Any] = {}
    for step_field in fields(Step):
        name = step_field.name
        if name not in doc:
            if step_field.default is MISSING:  # required
                check.fail(f"{key}.{name}", "this key to be present", "it missing")
            continue
        number = check.number(doc[name], f"{key}.{name}")
        values[name] = int(number) if name in _STEP_INTS else number
    return Step(**values)


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


# --- verdict (pure) -----------------------------------------------------------------------


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


# --- finding the capacity (pure) ----------------------------------------------------------


def find_capacity(steps: Sequence[Step], threshold: float = DEFAULT_THRESHOLD) -> tuple[float, str]:
    """(capacity in hop-bit/s, bound) from steps in the order measured (module docstring, 5)."""
    if not steps:
        raise ValueError("no steps measured")
    ordered = sorted(steps, key=lambda s: s.offered_hop_bps)
    last_good: Step | None = None
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


# --- the measurement (root) ---------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Load steps: (flows, rate factor) each; flows beyond the fabric's GPUs are clipped."""

    steps: tuple[tuple[int, float], ...]
    duration: float = 4.0  # seconds of each step's measuring window
    omit: float = 2.0  # seconds before it (slow start)
    confirm: bool = True  # measure a step below the threshold once more
    threshold: float = DEFAULT_THRESHOLD
    trunk_factor: float = DEFAULT_TRUNK_FACTOR


DEFAULT_PLAN = Plan(steps=((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (8, 8)))
QUICK_PLAN = Plan(steps=((2, 1), (8, 2)), duration=2.5, omit=1.0, confirm=False)


def calibration_fabric(spec: FabricSpec, trunk_factor: float = DEFAULT_TRUNK_FACTOR) -> FabricSpec:
    """``spec`` with its tor-agg and agg-core links at ``trunk_factor`` x the NIC rate (at
    least their own), so that only the NICs limit the calibration's flows."""
    trunk = spec.speeds.nic * trunk_factor
    speeds = Speeds(
        nic=spec.speeds.nic,
        tor_agg=max(spec.speeds.tor_agg, trunk),
        agg_core=max(spec.speeds.agg_core, trunk),
        nvlink=spec.speeds.nvlink,
    )
    return replace(spec, speeds=speeds)


def calibration_flows(fabric: Fabric) -> list[Flow]:
    """GPU i <-> GPU i + n/2 (rank order), both directions, interleaved: the first k flows
    use 2 x ceil(k/2) distinct GPUs, one sending and one receiving flow each at most."""
    ranked = [g.name for g in fabric.gpus_by_rank()]
    half = len(ranked) // 2
    flows: list[Flow] = []
    for i in range(half):
        a, b = ranked[i], ranked[i + half]
        flows += [Flow(a, b), Flow(b, a)]
    return flows


def reshape(emu: Emulation, scale: float) -> None:
    """Re-shape every link of ``emu`` to its rates at ``scale`` (the same recipe, the
    same interfaces: only the rates, bursts and queue limits change).

    Only the HTB class and the leaf queue are replaced: the root (``htb default 1``) stays as
    it is, because this kernel refuses to change an existing htb root in place ("Change
    operation not supported"); class and leaf change in place, so no link is ever unshaped.
    """
    from orchestrator.emulation import batch
    from orchestrator.emulation.hostconfig import render_all
    from orchestrator.emulation.wiring import plan_wiring
    from topologies.description import FabricDescription

    assert emu.description is not None
    fabric = emu.description.fabric
    spec = replace(fabric.spec, emulation=EmulationSpec(scale=scale))
    description = FabricDescription.of(build_fabric(spec))
    wiring = plan_wiring(description)
    root_commands = [a for s in wiring.shapers for a in s.commands()]
    batch.run_steps(rate_commands(root_commands), "re-shaping switch ports")
    processes = {}
    for gpu, config in render_all(description).items():
        processes[gpu] = emu.host(gpu).popen(
            ["sh", "-c", batch.script(rate_commands(config.shaping))],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    failed = []
    for gpu, process in processes.items():
        _, err = process.communicate(timeout=60)
        if process.returncode != 0:
            failed.append(f"{gpu}: {batch.errors_of(err.decode(errors='replace'))}")
    if failed:
        raise EmulationError("re-shaping GPU ports failed: " + " | ".join(failed[:4]))


def rate_commands(commands: Iterable[Sequence[str]]) -> list[list[str]]:
    """The shaping commands that change a shaped link's rate in place: all but the root
    qdisc (``tc qdisc ... root ...``), which stays."""
    return [list(argv) for argv in commands if not (argv[:2] == ["tc", "qdisc"] and "root" in argv)]


def step_of(
    result: TrafficResult, flows: Sequence[Flow], rate_bps: float, hops: Mapping[Flow, int]
) -> Step:
    """A Step from one measurement of ``flows``, each limited to ``rate_bps``."""
    offered = len(flows) * rate_bps
    hop_list = [hops[f] for f in flows]
    return Step(
        flows=len(flows),
        rate_bps=rate_bps,
        hops=sum(hop_list) / len(hop_list),
        offered_bps=offered,
        offered_hop_bps=sum(rate_bps * h for h in hop_list),
        achieved_bps=result.aggregate_bps,
        ratio=result.aggregate_bps / (offered * TCP_PAYLOAD_SHARE),
        jain=result.jain,
        retransmits=result.retransmits,
        cpu_busy=result.cpu_busy,
        vswitchd_cores=result.vswitchd_cores,
        loadavg=result.loadavg[0],
    )


def merge_steps(a: Step, b: Step) -> Step:
    """Two measurements of one step, averaged."""

    def mean(x: float, y: float) -> float:
        return (x * a.runs + y * b.runs) / (a.runs + b.runs)

    return replace(
        a,
        achieved_bps=mean(a.achieved_bps, b.achieved_bps),
        ratio=mean(a.ratio, b.ratio),
        jain=mean(a.jain, b.jain),
        retransmits=a.retransmits + b.retransmits,
        cpu_busy=mean(a.cpu_busy, b.cpu_busy),
        vswitchd_cores=mean(a.vswitchd_cores, b.vswitchd_cores),
        loadavg=b.loadavg,
        runs=a.runs + b.runs,
    )


def datapath_ports() -> int | None:
    """Ports of the userspace datapath (every bridge's, anyone's): ovs-vswitchd polls them
    all, so the count is part of the per-packet cost."""
    try:
        out = subprocess.run(
            ["ovs-appctl", "dpctl/show", "netdev@ovs-netdev"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    ports = sum(1 for line in out.splitlines() if line.strip().startswith("port "))
    return ports or None


def machine_conditions(emu: Emulation | None = None) -> dict[str, Any]:
    """Cores, load, kernel, host and (with a running emulation) the datapath."""
    conditions: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "hostname": socket.gethostname(),
        "datapath_ports": datapath_ports(),
    }
    if emu is not None and emu.datapath is not None:
        conditions.update(
            datapath=emu.datapath.kind,
            userspace_tso=emu.datapath.tso,
            ovs_version=emu.datapath.ovs_version,
        )
    if emu is not None and emu.hosts:
        # what the GPUs' TCP uses unless a program picks its own: the congctl of their
        # fabric route (orchestrator.emulation.hostconfig), else the namespace's default
        gpu = next(iter(emu.hosts))
        route = emu.cmd(gpu, ["ip", "route", "show", FABRIC_PREFIX]).split()
        if "congctl" in route:
            cc = route[route.index("congctl") + 1]
        else:
            cc = emu.cmd(gpu, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"]).strip()
        conditions["tcp_congestion_control"] = cc
    return conditions


def start_emulation(
    spec: FabricSpec, lock_wait: float, log: Log, policy: str = "shortest"
) -> Emulation:
    """An Emulation of ``spec``, waiting up to ``lock_wait`` s for another run's lock."""
    from orchestrator.emulation.network import Emulation

    emulation = Emulation(spec, policy=policy, ready_timeout=120.0, log=log, lock_wait=lock_wait)
    return emulation.start()


def calibrate(
    spec: FabricSpec,
    plan: Plan = DEFAULT_PLAN,
    *,
    safe_share: float = DEFAULT_SAFE_SHARE,
    lock_wait: float = 600.0,
    log: Log | None = None,
) -> Calibration:
    """Measure the emulator's capacity on ``spec``'s calibration fabric (module docstring)."""
    from orchestrator.testbed.traffic import run_flows

    if os.geteuid() != 0:
        raise EnvironmentProblem("astral calibrate builds an emulated fabric: it needs root")
    say = log or (lambda _: None)
    calibrated = calibration_fabric(spec, plan.trunk_factor)
    model = build_fabric(calibrated)
    flows = calibration_flows(model)
    if not flows:
        raise EnvironmentProblem(f"fabric {spec.name} has fewer than 2 GPUs to send between")
    hops = {f: switch_hops(model, f.src)[f.dst] for f in flows}
    base_rate = calibrated.emulation.emulated(calibrated.speeds.nic)
    say(
        f"calibration fabric {calibrated.name}: {len(model.gpus)} GPUs, NIC "
        f"{format_rate(base_rate)} emulated, trunks {plan.trunk_factor:g}x; up to "
        f"{len(flows)} flows of {sum(hops.values()) / len(hops):.1f} switch hops"
    )
    emu = start_emulation(calibrated, lock_wait, say)
    steps: list[Step] = []
    try:
        conditions = machine_conditions(emu)
        say(STEP_HEADER)
        factor = 1.0
        for wanted, step_factor in plan.steps:
            chosen = flows[: min(wanted, len(flows))]
            if step_factor != factor:
                reshape(emu, calibrated.emulation.scale * step_factor)
                factor = step_factor
            rate = base_rate * factor

            def measure(chosen: list[Flow] = chosen, rate: float = rate) -> Step:
                result = run_flows(emu, chosen, duration=plan.duration, omit=plan.omit)
                return step_of(result, chosen, rate, hops)

            step = measure()
            if step.ratio < plan.threshold and plan.confirm:
                say(_step_line(step) + "  (below the threshold: measuring again)")
                step = merge_steps(step, measure())
            say(_step_line(step))
            steps.append(step)
            if step.ratio < plan.threshold:
                break
        conditions["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        emu.stop()
    capacity, bound = find_capacity(steps, plan.threshold)
    return Calibration(
        capacity_bps=capacity,
        bound=bound,
        safe_share=safe_share,
        threshold=plan.threshold,
        measured_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        conditions=conditions,
        fabric={
            "name": spec.name,
            "source": spec.source,
            "nic_rate_bps": base_rate,
            "trunk_factor": plan.trunk_factor,
            "gpus": len(model.gpus),
            "policy": "shortest",
            "duration_s": plan.duration,
            "omit_s": plan.omit,
        },
        steps=tuple(steps),
    )


STEP_HEADER = (
    f"{'flows':>5} {'rate':>6} {'hops':>4} {'offered':>9} {'hop-load':>10} "
    f"{'achieved':>9} {'ratio':>6} {'Jain':>5} {'ovs cores':>9} {'CPU':>4} {'load':>5}"
)


def _step_line(step: Step) -> str:
    return (
        f"{step.flows:>5} {format_rate(step.rate_bps):>6} {step.hops:>4.1f} "
        f"{step.offered_bps / 1e6:>7.0f} M {step.offered_hop_bps / 1e6:>8.0f} M "
        f"{step.achieved_bps / 1e6:>7.1f} M {step.ratio:>6.3f} {step.jain:>5.3f} "
        f"{step.vswitchd_cores:>9.2f} {step.cpu_busy:>4.0%} {step.loadavg:>5.2f}"
    )


def step_lines(steps: Iterable[Step]) -> list[str]:
    return [STEP_HEADER, *(_step_line(s) for s in steps)]
