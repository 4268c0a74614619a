"""The experiment a user writes (YAML), validated into a typed :class:`ExperimentSpec`.

An experiment names a fabric, the load-balancing policies to compare, the collectives to
run and the message sizes to sweep, nccl-tests style. Loading it checks everything that can
be checked without root: the document's shape, the fabric (shape and wiring, through the
topology generators), and the placement against the generated fabric's GPUs. Every problem
is one :class:`~topologies.errors.ExperimentError` naming the file, the key path, what was
expected and what was found; a fabric written inline reports its keys as ``fabric.<key>``.

Example (``experiments/default.yaml`` is the annotated one)::

    name: default
    fabric: astral-small          # a preset name, a fabric file (relative to this file),
                                  # or an inline fabric mapping (topologies/spec.py)
    policies: [ecmp, path-pinned] # or `policy: ecmp`
    host_ports: balanced          # how hosts pick NIC ports: balanced (default) | hash
                                  # (orchestrator/testbed/hostports.py)
    collectives:
      - all-reduce                # = {op: all-reduce, algorithm: ring}, the default one
      - {op: all-to-all, algorithm: pxn}
    sizes: {min: 64K, max: 4M, factor: 4}   # nccl-tests -b -e -f; 1K = 1024 bytes
    iterations: 5                 # nccl-tests -n (default 20)
    warmup: 1                     # nccl-tests -w (default 5)
    min_batch: 10s                # optional: each timed batch lasts at least this long
                                  # (more iterations for short operations: steadier
                                  # figures where TCP's losses make operations vary)
    placement: {gpus: all, order: rank}   # gpus: all | [p0s0g0, ...] | 4;
                                          # order: rank | topology-aware | random
    seed: 1                       # for order: random, and anything else random in a run
    load_limit: {force: false}    # true: run even above the emulator's measured capacity
    scale: 0.6e-4                 # optional: the fabric's emulation scale for this run
                                  # (emulated = real x scale), e.g. to fit a machine
    latency: off                  # optional: the fabric's real-world latencies for this
                                  # run: off, on, or {nic: 1us, ...} over the fabric's
                                  # figures (topologies/spec.py, docs/latency.md)
    faults:                       # optional: broken on purpose while it runs
      - {kind: link-down, target: p1s0g0-p1r0t1, at: 2s, duration: 10s}
                                  # (orchestrator/testbed/faultspec.py has every kind)
    monitor: full                 # the monitor's detail: full (default) | light
                                  # (orchestrator/testbed/monitoring.py, docs/monitoring.md)

Or, instead of ``collectives`` and ``sizes``, a training workload to replay (docs/workloads.md)::

    workload: deepseek-like       # a shipped workload (workloads/), a workload file
                                  # (relative to this file) or an inline workload mapping
    iterations: 1                 # timed training iterations per policy

Its layout must fill the placement's GPUs (``parallel``: tp x pp x dp), rank i on the
placement's GPU i; one step per policy replays ``warmup`` + ``iterations`` iterations.

:meth:`ExperimentSpec.steps` expands it into the concrete runs, policy x collective x size,
in the order a runner should execute them (a policy change reprograms the fabric, so
policies vary slowest).
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from controllers.policies import default_registry as policy_registry
from orchestrator.collectives.ceilings import min_batch_seconds
from orchestrator.collectives.latency import LatencyTable, operation_latency
from orchestrator.collectives.nccl import ELEMENT_SIZES, buffer_bytes, bus_factor, count_column
from orchestrator.collectives.plans import (
    COLLECTIVES,
    ELEMENT_BYTES,
    Layout,
    PlanError,
    element_count,
)
from orchestrator.collectives.plans import default_registry as algorithm_registry
from orchestrator.collectives.program import PROGRAM, Program, ProgramError, compose_all
from orchestrator.collectives.sizes import parse_size
from orchestrator.emulation.shaping import DEFAULT_RECIPE
from orchestrator.testbed.faultspec import WITH_UNIT, FaultSpec, parse_faults
from orchestrator.testbed.hostports import DEFAULT_HOST_PORTS, HOST_PORTS
from orchestrator.testbed.monitoring import DEFAULT_MONITOR, LEVELS
from orchestrator.worker.spec import LaunchOptions
from orchestrator.workload.iteration import iteration_program
from orchestrator.workload.spec import (
    WorkloadSpec,
    load_workload,
    parse_workload,
    resolve_workload,
)
from topologies.catalog import preset_path, resolve_fabric
from topologies.errors import ExperimentError, FabricSpecError, WorkloadError
from topologies.fabricspec import MIN_BUILT_BPS, EmulationSpec, FabricSpec
from topologies.generators import build_fabric, slowest_link
from topologies.latency import applied_latency
from topologies.model import Fabric, Gpu
from topologies.spec import (
    MIN_EMULATED_BPS,
    NAME_PATTERN,
    NAME_TEXT,
    SCALE_RANGE,
    _describe,
    _Reader,
    load_fabric_spec,
    parse_fabric_spec,
)
from topologies.units import parse_duration
from topologies.yamlfile import read_yaml

ORDERS = ("rank", "topology-aware", "random")

# What the synthetic workers move and verify: 4-byte unsigned integers, so that sums are
# exact (orchestrator/collectives/plans.py). Tables name it as nccl-tests would.
DTYPE = "uint32"

DEFAULT_ITERATIONS = 20  # nccl-tests -n
DEFAULT_WARMUP = 5  # nccl-tests -w
DEFAULT_FACTOR = 2

_TOP_KEYS = {
    "name",
    "description",
    "fabric",
    "policy",
    "policies",
    "host_ports",
    "collectives",
    "sizes",
    "iterations",
    "warmup",
    "min_batch",
    "placement",
    "seed",
    "load_limit",
    "scale",
    "latency",
    "faults",
    "monitor",
    "workload",
    "cluster",
}
# A study's own keys (orchestrator.study.spec): an experiment file with any of them is a
# study, expanded into variants, each of which is validated as an experiment without them.
STUDY_KEYS = {"fabrics", "sweep", "sweep_mode", "study"}
_TOP_KEYS |= STUDY_KEYS
# ... and their vocabulary (orchestrator.study.spec and .checks read them; the schema too)
SWEEP_MODES = ("product", "zip")
UNSWEPT = ("fabric", "name", "cluster")  # fabrics: names several; one name; one set of machines
STUDY_SECTION_KEYS = {"question", "expected", "checks", "plot"}
PLOT_KEYS = {"metric", "x"}  # study.plot: what the study plot draws against which key
PLOT_METRICS = ("busbw", "algbw")  # nccl-tests' averages over the sizes, at real speed
CHECK_KEYS = {"name", "of", "to", "collective", "policy", "size", "ratio", "completes"}
SIZE_WORDS = ("max", "min")  # a check's size: the largest or smallest the study ran
# What the reader checks beyond the top-level keys, named so that the JSON Schema
# (orchestrator/run/schema.py) is generated from the same facts.
REQUIRED_KEYS = ("name", "fabric", "collectives", "sizes")
# ... unless the experiment replays a workload, which replaces collectives and sizes
WORKLOAD_KEY = "workload"
WORKLOAD_REPLACES = ("collectives", "sizes")
COLLECTIVE_KEYS = {"op", "algorithm"}
COLLECTIVE_REQUIRED = ("op",)
SIZES_KEYS = {"min", "max", "factor"}
SIZES_REQUIRED = ("min", "max")
PLACEMENT_KEYS = {"gpus", "order"}
LOAD_LIMIT_KEYS = {"force"}
ALL_GPUS = "all"  # placement.gpus: every GPU of the fabric
MIN_RANKS = 2  # a collective needs two ranks
#: The smallest value of each integer key (a key path), as ``read.integer`` is given it.
MINIMUM = {"iterations": 1, "warmup": 0, "seed": 0, "sizes.factor": 2}
#: ``min_batch``'s bounds, seconds: the launcher's own floor for the shapers' buckets (2 s
#: with 10 ms buckets; a shorter ask would change nothing), and ten minutes (beyond, a
#: typo rather than a measurement).
MIN_BATCH_RANGE = (min_batch_seconds(DEFAULT_RECIPE.burst_s), 600.0)


@dataclass(frozen=True)
class Collective:
    """One collective to run: the operation and the algorithm that implements it."""

    op: str
    algorithm: str

    @property
    def label(self) -> str:
        return f"{self.op} ({self.algorithm})"

    @property
    def slug(self) -> str:
        """For file names: ``all-reduce-ring``."""
        return f"{self.op}-{self.algorithm}"


@dataclass(frozen=True)
class SizeSweep:
    """Message sizes min, min*factor, ... up to max (nccl-tests -b, -e, -f)."""

    min: int
    max: int
    factor: int = DEFAULT_FACTOR

    def values(self) -> list[int]:
        sizes, size = [], self.min
        while size <= self.max:
            sizes.append(size)
            size *= self.factor
        return sizes


@dataclass(frozen=True)
class Placement:
    """Which GPUs take part (None = all, a count = the first n by rank, or names) and how
    ranks are ordered over them."""

    gpus: tuple[str, ...] | int | None = None
    order: str = "rank"

    def select(self, fabric: Fabric, seed: int) -> tuple[str, ...]:
        """The chosen GPUs in rank order: element i is the GPU that plays rank i."""
        by_rank = fabric.gpus_by_rank()
        if self.gpus is None:
            chosen = by_rank
        elif isinstance(self.gpus, int):
            chosen = by_rank[: self.gpus]
        else:
            chosen = sorted((fabric.gpus[name] for name in self.gpus), key=lambda g: g.rank)
        if self.order == "topology-aware":
            chosen = topology_aware_order(chosen)
        elif self.order == "random":
            chosen = list(chosen)
            random.Random(seed).shuffle(chosen)
        return tuple(gpu.name for gpu in chosen)


def topology_aware_order(gpus: Sequence[Gpu]) -> list[Gpu]:
    """Servers in (pod, server) order, GPUs of every other server reversed (a "snake").

    A ring over this order enters and leaves each server on the same rail as its neighbour,
    so every server-to-server hop stays inside one rail plane (Astral's same-rail pattern,
    Xingmai's topology-aware rank order) and the intra-server hops ride NVLink. With an even
    number of servers the ring's wrap-around hop is same-rail too.
    """
    servers: dict[tuple[int, str], list[Gpu]] = {}
    for gpu in sorted(gpus, key=lambda g: (g.pod, g.server, g.local_rank)):
        servers.setdefault((gpu.pod, gpu.server), []).append(gpu)
    ordered: list[Gpu] = []
    for index, key in enumerate(sorted(servers)):
        members = servers[key]
        ordered.extend(members if index % 2 == 0 else reversed(members))
    return ordered


@dataclass(frozen=True)
class LoadLimit:
    """``force``: run even when the offered load exceeds the emulator's measured capacity."""

    force: bool = False


@dataclass(frozen=True)
class ConfigurationStep:
    """One concrete configuration: a policy, a collective and a message size."""

    index: int
    policy: str
    collective: Collective
    size: int  # bytes: the buffer for all-reduce, what one rank sends for all-to-all
    count: int  # nccl-tests' count column: elements, per rank for the per-rank operations
    dtype: str
    ranks: int
    # a workload's replay: its busiest rank's compute per iteration, emulated s (0: none)
    floor_s: float = 0.0


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated experiment. ``gpus`` is the placement, resolved: gpus[i] plays rank i."""

    name: str
    fabric: FabricSpec
    fabric_source: str  # the fabric file, or "inline"
    policies: tuple[str, ...]
    collectives: tuple[Collective, ...]
    sizes: SizeSweep
    gpus: tuple[str, ...]
    iterations: int = DEFAULT_ITERATIONS
    warmup: int = DEFAULT_WARMUP
    # The shortest timed batch, seconds (None: the launcher's floor, for the shapers'
    # buckets): short operations repeat until their batch lasts this long.
    min_batch: float | None = None
    placement: Placement = field(default_factory=Placement)
    seed: int = 0
    load_limit: LoadLimit = field(default_factory=LoadLimit)
    host_ports: str = DEFAULT_HOST_PORTS  # orchestrator.testbed.hostports
    monitor: str = DEFAULT_MONITOR  # the monitor's detail (orchestrator.testbed.monitoring)
    description: str = ""
    dtype: str = DTYPE
    source: str = "<inline>"
    faults: tuple[FaultSpec, ...] = ()  # orchestrator.testbed.faultspec
    # a training workload replayed instead of collectives (orchestrator/run/replay.py)
    workload: WorkloadSpec | None = None
    workload_source: str = ""  # its file, or "inline"
    # Machines of the inventory the fabric is spread over (orchestrator.cluster;
    # "localhost" is this one); empty: all of it on this machine.
    cluster: tuple[str, ...] = ()

    @property
    def batch_floor_s(self) -> float:
        """The shortest timed batch a run of it times, seconds: ``min_batch``, or the
        launcher's own floor for the shapers' buckets (orchestrator.testbed.testbed)."""
        return max(self.min_batch or 0.0, MIN_BATCH_RANGE[0])

    @property
    def ranks(self) -> int:
        return len(self.gpus)

    def error(
        self, key: str, expected: str, found: object = None, detail: str = ""
    ) -> ExperimentError:
        """An error about this experiment's ``key``, for checks made after loading."""
        return ExperimentError(self.source, key, expected, found, detail=detail)

    def step_sizes(self, op: str) -> list[int]:
        """The sweep's sizes as ``op`` runs them: rounded down to whole elements (per rank,
        for the per-rank operations) as nccl-tests does; zeros and duplicates dropped."""
        sizes: list[int] = []
        for size in self.sizes.values():
            rounded = buffer_bytes(op, size, self.dtype, self.ranks)
            if rounded > 0 and rounded not in sizes:
                sizes.append(rounded)
        return sizes

    def program(self) -> Program:
        """The workload's iteration as the workers' program, its compute stretched by the
        fabric's emulation scale (an experiment without a workload has none)."""
        if self.workload is None:
            raise ValueError(f"experiment {self.name!r} replays no workload")
        return iteration_program(self.workload, self.fabric.emulation.scale)

    def steps(self) -> list[ConfigurationStep]:
        """Every configuration to run, policy x collective x size, policies varying slowest;
        with a workload, one replay per policy."""
        steps: list[ConfigurationStep] = []
        if self.workload is not None:
            program = self.program()
            floor = program_floor(program, self.ranks)
            collective = Collective(PROGRAM, program.name)
            for policy in self.policies:
                steps.append(
                    ConfigurationStep(
                        index=len(steps),
                        policy=policy,
                        collective=collective,
                        size=program.elements() * ELEMENT_BYTES,
                        count=program.elements(),
                        dtype=self.dtype,
                        ranks=self.ranks,
                        floor_s=floor,
                    )
                )
            return steps
        for policy in self.policies:
            for collective in self.collectives:
                for size in self.step_sizes(collective.op):
                    steps.append(
                        ConfigurationStep(
                            index=len(steps),
                            policy=policy,
                            collective=collective,
                            size=size,
                            count=count_column(collective.op, size, self.dtype, self.ranks),
                            dtype=self.dtype,
                            ranks=self.ranks,
                        )
                    )
        return steps

    def ideal_seconds(self, busbw: float) -> float:
        """Seconds of traffic the whole experiment needs (warm-up included) if every
        operation ran at ``busbw`` bytes/s of bus bandwidth: sum of S * factor / busbw."""
        runs = self.iterations + self.warmup
        return sum(
            runs * step.size * bus_factor(step.collective.op, step.ranks) / busbw
            for step in self.steps()
            if step.collective.op != PROGRAM  # a workload's bytes are not one operation's
        )

    def fabric_model(self) -> Fabric:
        """The experiment's fabric, generated (pure; cheap for the shipped fabrics)."""
        return build_fabric(self.fabric)

    def step_latencies(self) -> dict[int, float]:
        """Step index -> emulated seconds of latency one operation of it adds (the fabric's
        latencies on this placement, :func:`~orchestrator.collectives.latency.operation_latency`);
        all zero with ``latency: off``."""
        fabric = self.fabric_model()
        applied = applied_latency(fabric, self.gpus)
        table = LatencyTable(applied.one_way, applied.operation)
        layout = layout_of(fabric, self.gpus)
        registry = algorithm_registry()
        per_test: dict[tuple[str, str, int], float] = {}
        latencies = {}
        if self.workload is not None:  # one program per policy: its plans' latency
            seconds = operation_latency(compose_all(self.program(), layout), table)
            return {step.index: seconds for step in self.steps()}
        for step in self.steps():
            key = (step.collective.op, step.collective.algorithm, step.size)
            if key not in per_test:
                algorithm = registry.get(key[0], key[1])
                count = element_count(key[0], step.size, self.ranks)
                plans = [algorithm.plan(layout, rank, count) for rank in range(self.ranks)]
                per_test[key] = operation_latency(plans, table)
            latencies[step.index] = per_test[key]
        return latencies

    def latency_seconds(self) -> float:
        """Seconds the fabric's latencies add to the whole experiment (warm-up included),
        :meth:`step_latencies` times the operations of each step."""
        runs = self.iterations + self.warmup
        return sum(runs * seconds for seconds in self.step_latencies().values())


class _ExperimentReader(_Reader):
    """The fabric spec's document walker, raising ExperimentError instead."""

    error = ExperimentError

    def size(self, value: object, key: str) -> int:
        return self.parsed(value, key, parse_size)

    def sequence(self, value: object, key: str) -> list[Any]:
        if not isinstance(value, list) or not value:
            self.fail(key, "a non-empty list", "an empty list" if value == [] else _describe(value))
        assert isinstance(value, list)
        return value


def parse_experiment(
    document: object,
    source: str = "<inline>",
    base_dir: str | Path = ".",
    *,
    policies: Collection[str] | None = None,
) -> ExperimentSpec:
    """Validate a parsed YAML document into an ExperimentSpec (see the module docstring).

    ``base_dir`` is where relative fabric paths start (the experiment file's directory);
    ``policies`` the names an experiment may use (default: those the controller's policy
    registry knows).
    """
    read = _ExperimentReader(source)
    check_is_experiment(document, source)
    doc = read.mapping(document, "", _TOP_KEYS)
    for key in sorted(STUDY_KEYS & set(doc)):
        read.fail(
            key,
            "an experiment without a study's keys (" + ", ".join(sorted(STUDY_KEYS)) + ")",
            "a study",
            detail="astral run runs a study (every variant); astral forecast takes its "
            "variants one at a time, e.g. with --set",
        )
    replays = WORKLOAD_KEY in doc
    for required in REQUIRED_KEYS:
        if replays and required in WORKLOAD_REPLACES:
            if required in doc:
                read.fail(
                    required,
                    f"no {required} in an experiment that replays a workload",
                    f"{required} beside workload",
                    detail="a workload's iteration is what runs; collectives and sizes "
                    "belong to another experiment",
                )
        elif required not in doc:
            read.fail(required, "this key to be present", "it missing")

    name = doc["name"]
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        read.fail("name", NAME_TEXT, name)
    description = doc.get("description", "")
    if not isinstance(description, str):
        read.fail("description", "a text", _describe(description))

    fabric_spec, fabric_source = _fabric(read, doc["fabric"], Path(base_dir))
    if "scale" in doc:
        # the same fabric, its links emulated at another rate (the load guard and the
        # nccl-tests tables' real-speed columns follow the spec's scale)
        scale = read.number(doc["scale"], "scale", *SCALE_RANGE)
        fabric_spec = replace(fabric_spec, emulation=EmulationSpec(scale=scale))
    if "latency" in doc:
        # the same fabric with other real-world latencies, or none (`latency: off`)
        latency = read.latency(doc["latency"], "latency", fabric_spec.latency)
        fabric_spec = replace(fabric_spec, latency=latency)
    # an experiment's own scale is checked against the floor below, blaming its scale
    fabric = _build(read, fabric_spec, fabric_source, floor="scale" not in doc)

    chosen_policies = _policies(read, doc, policies)
    host_ports = _host_ports(read, doc.get("host_ports", DEFAULT_HOST_PORTS))
    monitor = read.choice(
        doc.get("monitor", DEFAULT_MONITOR), "monitor", LEVELS, "the monitor's detail level"
    )
    collectives = () if replays else _collectives(read, doc["collectives"])
    sizes = SizeSweep(1, 1) if replays else _sizes(read, doc["sizes"])
    iterations = read.integer(
        doc.get("iterations", DEFAULT_ITERATIONS), "iterations", MINIMUM["iterations"]
    )
    warmup = read.integer(doc.get("warmup", DEFAULT_WARMUP), "warmup", MINIMUM["warmup"])
    min_batch = _min_batch(read, doc["min_batch"]) if "min_batch" in doc else None
    seed = read.integer(doc.get("seed", 0), "seed", MINIMUM["seed"])
    placement = _placement(read, doc.get("placement", {}), fabric)
    raw_limit = read.mapping(doc.get("load_limit", {}), "load_limit", LOAD_LIMIT_KEYS)
    load_limit = LoadLimit(force=read.boolean(raw_limit.get("force", False), "load_limit.force"))

    gpus = placement.select(fabric, seed)
    _check_latency(read, fabric, gpus, "scale" if "scale" in doc else "latency")
    if "scale" in doc:
        _check_rate_floor(read, fabric)
    faults = parse_faults(read, doc.get("faults"), fabric)
    for fault in faults:
        if fault.target.gpu is not None and fault.target.gpu not in gpus:
            read.fail(
                f"faults[{fault.id - 1}].target",
                "a GPU the experiment runs on (placement.gpus): a straggler is a rank",
                fault.target.gpu,
            )
    workload, workload_source = None, ""
    if replays:
        workload, workload_source = _workload(read, doc[WORKLOAD_KEY], Path(base_dir), fabric, gpus)
    for collective in collectives:
        if buffer_bytes(collective.op, sizes.max, DTYPE, len(gpus)) == 0:
            unit = ELEMENT_SIZES[DTYPE] * len(gpus)
            read.fail(
                "sizes.max",
                f"at least {unit} bytes for {collective.op} "
                f"(one {DTYPE} element for each of {len(gpus)} ranks)",
                sizes.max,
            )
    _check_plans(read, collectives, sizes, layout_of(fabric, gpus))
    return ExperimentSpec(
        name=name,
        fabric=fabric_spec,
        fabric_source=fabric_source,
        policies=chosen_policies,
        collectives=collectives,
        sizes=sizes,
        gpus=gpus,
        iterations=iterations,
        warmup=warmup,
        min_batch=min_batch,
        placement=placement,
        seed=seed,
        load_limit=load_limit,
        host_ports=host_ports,
        monitor=monitor,
        description=description,
        source=source,
        faults=faults,
        workload=workload,
        workload_source=workload_source,
        cluster=_cluster(read, doc.get("cluster", [])),
    )


# A key of another file of ours that no experiment has, and what that file is: a fabric
# description always has a kind (topologies/spec.py), a training workload a model
# (orchestrator/workload/spec.py).
_OTHER_FILES = (("kind", "a fabric description"), ("model", "a training workload"))


def check_is_experiment(document: object, source: str) -> None:
    """An ExperimentError when ``document`` is a fabric description or a training workload
    given where an experiment is expected (``astral run FABRIC.yaml``), saying so and how an
    experiment uses it. Why: the key check alone names the first key an experiment does
    not know (``kind``, ``emulation``), which leaves the user to work out that the file is
    of another kind, and that an experiment refers to it rather than being it."""
    if not isinstance(document, Mapping) or {"fabric", "fabrics", WORKLOAD_KEY} & set(document):
        return
    for key, what in _OTHER_FILES:
        if key not in document:
            continue
        value = document[key]
        shown = value if isinstance(value, str) else "..."
        if key == "kind":
            reference = _fabric_reference(document, source)
            names = f"names its fabric with `fabric: {reference}`"
            example = "experiments/default.yaml"
            uses = "`astral topo show FILE` shows a fabric, `astral up FILE` holds it up"
        else:
            reference = source
            names = f"replays it with `{WORKLOAD_KEY}: {reference}`"
            example = "experiments/workload-replay.yaml"
            uses = "`astral forecast FILE` forecasts one iteration of the workload"
        where = (
            " (a relative path starts at the experiment file's directory)"
            if reference == source
            else ""
        )
        raise ExperimentError(
            source,
            "",
            "an experiment (" + ", ".join(REQUIRED_KEYS) + ", ...)",
            f"{what} ({key}: {shown})",
            detail=f"an experiment {names}{where}, as {example} does; {uses}",
        )


def _fabric_reference(document: Mapping[str, Any], source: str) -> str:
    """How an experiment names the fabric file at ``source``: by its preset name when it
    is a shipped preset's file, else by its path."""
    name = document.get("name")
    if isinstance(name, str) and NAME_PATTERN.match(name):
        try:
            if preset_path(name).resolve() == Path(source).resolve():
                return name
        except (FabricSpecError, OSError):
            pass
    return source


def _check_plans(
    read: _ExperimentReader,
    collectives: Sequence[Collective],
    sizes: SizeSweep,
    layout: Layout,
) -> None:
    """Every collective's algorithm plans on the placement's layout, before anything is
    brought up: a hierarchical all-reduce needs the same local ranks on every server, so
    ``placement: {gpus: 8}`` on servers of 3 GPUs cannot run it, and the workers would
    find out only after the fabric came up (a traceback, the fabric torn down)."""
    registry = algorithm_registry()
    ranks = len(layout.servers)
    for i, collective in enumerate(collectives):
        count = element_count(collective.op, sizes.max, ranks)
        try:
            registry.get(collective.op, collective.algorithm).plan(layout, 0, count)
        except PlanError as error:
            read.fail(
                f"collectives[{i}]",
                f"an algorithm that runs on the placement's {ranks} GPUs ({error}; "
                "placement.gpus: a whole number of servers, or another algorithm)",
                f"{collective.op}/{collective.algorithm}",
            )


MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _min_batch(read: _ExperimentReader, value: object) -> float:
    low, high = MIN_BATCH_RANGE
    expected = f"a duration with its unit between {low:g}s and {high:g}s, such as 10s"
    if not isinstance(value, str) or not WITH_UNIT.search(value):
        read.fail("min_batch", expected, value if isinstance(value, str) else _describe(value))
    assert isinstance(value, str)
    try:
        seconds = parse_duration(value)
    except ValueError:
        read.fail("min_batch", expected, value)
    if not low <= seconds <= high:
        read.fail("min_batch", expected, value)
    return seconds


def _cluster(read: _ExperimentReader, value: object) -> tuple[str, ...]:
    """``cluster: [localhost, lab2]``: machine names of the inventory (docs/cluster.md)."""
    if value == []:
        return ()
    expected = "a list of machine names of the inventory (localhost: this machine)"
    names = []
    for i, entry in enumerate(read.sequence(value, "cluster")):
        if not isinstance(entry, str) or not MACHINE_NAME.match(entry):
            read.fail(f"cluster[{i}]", expected, entry)
        if entry in names:
            read.fail(f"cluster[{i}]", "each machine once", entry)
        names.append(entry)
    return tuple(names)


def _check_rate_floor(read: _ExperimentReader, fabric: Fabric) -> None:
    """The fabric's floors on emulated link rates at the scale the experiment gives it
    instead of the file's own: its speeds as written (:data:`MIN_EMULATED_BPS`) and its
    links as built, oversubscribed ones included (:data:`MIN_BUILT_BPS`). After the
    latencies' check, whose message says more where both fail (a scale small enough to
    stall a run on its links also makes its latencies outlast the step deadline, unless
    they are off)."""
    scale = fabric.spec.emulation.scale
    for slowest, floor, what in (
        (min(vars(fabric.spec.speeds).values()), MIN_EMULATED_BPS, "speed"),
        (slowest_link(fabric).capacity, MIN_BUILT_BPS, "link as built"),
    ):
        if slowest * scale < floor:
            read.fail(
                "scale",
                f"a scale at which every {what} of the fabric runs at {floor / 1e6:g} "
                f"Mbit/s emulated or more (at least {floor / slowest:g} here)",
                scale,
                detail=f"its slowest would run at {slowest * scale:.3g} bit/s emulated",
            )


def _check_latency(read: _ExperimentReader, fabric: Fabric, gpus: Sequence[str], key: str) -> None:
    """A step's scaled latency must leave the workers' step deadline room: a rank waiting
    longer than it would be taken for a hung one."""
    applied = applied_latency(fabric, gpus)
    worst = applied.operation + max((max(row) for row in applied.one_way), default=0.0)
    limit = LaunchOptions().step_deadline / 3
    if worst > limit:
        scale = fabric.spec.emulation.scale
        read.fail(
            key,
            f"a scale at which a step's latency stays under {limit:g} s (the workers' step "
            f"deadline is {LaunchOptions().step_deadline:g} s)",
            scale if key == "scale" else fabric.spec.latency.to_dict(),
            detail=f"at scale {scale:g} the fabric's latencies make a step wait up to "
            f"{worst:.1f} s; use a larger scale, smaller latencies or `latency: off`",
        )


def _fabric(read: _ExperimentReader, value: object, base_dir: Path) -> tuple[FabricSpec, str]:
    if isinstance(value, Mapping):
        try:
            return parse_fabric_spec(value, read.source), "inline"
        except FabricSpecError as err:
            raise _inline_error(err) from None
    if not isinstance(value, str) or not value.strip():
        read.fail(
            "fabric",
            "a preset name, a path to a fabric file or an inline fabric mapping",
            _describe(value),
        )
    assert isinstance(value, str)
    try:
        path = resolve_fabric(value, base_dir)
    except FabricSpecError as err:
        raise ExperimentError(read.source, "fabric", err.expected, value) from None
    if not path.is_file():
        read.fail(
            "fabric",
            "an existing fabric file (a relative path starts at the experiment's directory)",
            value,
            detail=f"no file {path}",
        )
    try:
        return load_fabric_spec(path), str(path)
    except FabricSpecError as err:
        raise _referenced_error(err, read.source) from None


def _workload(
    read: _ExperimentReader,
    value: object,
    base_dir: Path,
    fabric: Fabric,
    gpus: Sequence[str],
) -> tuple[WorkloadSpec, str]:
    """The workload to replay, validated against the placement: its layout must fill the
    placement's GPUs, its tensor-parallel groups fit one server, and its program compose
    (a program the workers could not run is refused here, before anything starts)."""
    per_server = fabric.spec.gpus_per_server
    if isinstance(value, Mapping):
        try:
            workload = parse_workload(
                value, read.source, gpus=len(gpus), gpus_per_server=per_server
            )
        except WorkloadError as err:
            key = f"{WORKLOAD_KEY}.{err.key}" if err.key else WORKLOAD_KEY
            raise ExperimentError(
                err.file, key, err.expected, err.found, detail=err.detail
            ) from None
        source = "inline"
    else:
        if not isinstance(value, str) or not value.strip():
            read.fail(
                WORKLOAD_KEY,
                "a path to a workload file or an inline workload mapping",
                _describe(value),
            )
        assert isinstance(value, str)
        try:
            path = resolve_workload(value, base_dir)
        except WorkloadError as err:
            raise ExperimentError(read.source, WORKLOAD_KEY, err.expected, value) from None
        if not path.is_file():
            read.fail(
                WORKLOAD_KEY,
                "an existing workload file (a relative path starts at the experiment's directory)",
                value,
                detail=f"no file {path}",
            )
        try:
            workload = load_workload(path, gpus=len(gpus), gpus_per_server=per_server)
        except WorkloadError as err:
            detail = "; ".join(
                filter(None, [err.detail, f"the workload of experiment {read.source}"])
            )
            raise WorkloadError(err.file, err.key, err.expected, err.found, detail=detail) from None
        source = str(path)
    try:
        compose_all(
            iteration_program(workload, fabric.spec.emulation.scale), layout_of(fabric, gpus)
        )
    except ProgramError as error:
        read.fail(WORKLOAD_KEY, "a workload whose iteration the workers can run", str(error))
    return workload, source


def layout_of(fabric: Fabric, gpus: Sequence[str]) -> Layout:
    """The ranks' servers and local ranks on ``fabric``: rank i plays ``gpus[i]``."""
    return Layout(
        tuple(fabric.gpus[g].server for g in gpus),
        tuple(fabric.gpus[g].local_rank for g in gpus),
    )


def program_floor(program: Program, ranks: int) -> float:
    """The busiest rank's compute in one run of ``program`` (emulated s): the time no
    replay of it can beat."""
    return max((program.compute_of(rank) for rank in range(ranks)), default=0.0)


def _build(
    read: _ExperimentReader, spec: FabricSpec, fabric_source: str, floor: bool = True
) -> Fabric:
    """Generate the fabric model (pure, no root) so its wiring and GPUs are checked now
    (``floor``: build_fabric's)."""
    try:
        return build_fabric(spec, floor=floor)
    except FabricSpecError as err:
        if fabric_source == "inline":
            raise _inline_error(err) from None
        raise _referenced_error(err, read.source) from None


def _inline_error(err: FabricSpecError) -> ExperimentError:
    key = f"fabric.{err.key}" if err.key else "fabric"
    return ExperimentError(err.file, key, err.expected, err.found, detail=err.detail)


def _referenced_error(err: FabricSpecError, experiment: str) -> FabricSpecError:
    detail = "; ".join(filter(None, [err.detail, f"the fabric of experiment {experiment}"]))
    return FabricSpecError(err.file, err.key, err.expected, err.found, detail=detail)


def _policies(
    read: _ExperimentReader, doc: Mapping[str, Any], known: Collection[str] | None
) -> tuple[str, ...]:
    if known is None:
        known = policy_registry().names()  # the controller's registry is the authority
    if "policy" in doc and "policies" in doc:
        read.fail("policies", "either 'policy' or 'policies', not both", "both")
    if "policy" in doc:
        return (read.choice(doc["policy"], "policy", known, "a load-balancing policy"),)
    if "policies" not in doc:
        read.fail("policies", "'policy' (one name) or 'policies' (a list)", "neither")
    chosen: list[str] = []
    for i, value in enumerate(read.sequence(doc["policies"], "policies")):
        name = read.choice(value, f"policies[{i}]", known, "a load-balancing policy")
        if name in chosen:
            read.fail(f"policies[{i}]", "each policy once", name, detail="listed twice")
        chosen.append(name)
    return tuple(chosen)


def _host_ports(read: _ExperimentReader, value: object) -> str:
    expected = "how hosts pick NIC ports: one of " + ", ".join(HOST_PORTS)
    if isinstance(value, list):
        read.fail(
            "host_ports",
            expected,
            value,
            detail="one per run: benchmarks/policies.py and benchmarks/collectives.py measure "
            "both side by side, astral compare puts two runs side by side",
        )
    return read.choice(value, "host_ports", HOST_PORTS, "how hosts pick NIC ports")


def _collectives(read: _ExperimentReader, value: object) -> tuple[Collective, ...]:
    chosen: list[Collective] = []
    for i, entry in enumerate(read.sequence(value, "collectives")):
        key = f"collectives[{i}]"
        if isinstance(entry, str):
            op = read.choice(entry, key, COLLECTIVES, "a collective")
            algorithm = COLLECTIVES[op][0]
        else:
            item = read.mapping(entry, key, COLLECTIVE_KEYS)
            for required in COLLECTIVE_REQUIRED:
                if required not in item:
                    read.fail(f"{key}.{required}", "this key to be present", "it missing")
            op = read.choice(item["op"], f"{key}.op", COLLECTIVES, "a collective")
            algorithm = read.choice(
                item.get("algorithm", COLLECTIVES[op][0]),
                f"{key}.algorithm",
                COLLECTIVES[op],
                f"an algorithm for {op}",
            )
        collective = Collective(op, algorithm)
        if collective in chosen:
            read.fail(key, "each collective once", collective.label, detail="listed twice")
        chosen.append(collective)
    return tuple(chosen)


def _sizes(read: _ExperimentReader, value: object) -> SizeSweep:
    raw = read.mapping(value, "sizes", SIZES_KEYS)
    for required in SIZES_REQUIRED:
        if required not in raw:
            read.fail(f"sizes.{required}", "this key to be present", "it missing")
    low = read.size(raw["min"], "sizes.min")
    high = read.size(raw["max"], "sizes.max")
    factor = read.integer(
        raw.get("factor", DEFAULT_FACTOR), "sizes.factor", MINIMUM["sizes.factor"]
    )
    if high < low:
        read.fail("sizes.max", f"a size >= sizes.min ({low} bytes)", raw["max"])
    return SizeSweep(low, high, factor)


def _placement(read: _ExperimentReader, value: object, fabric: Fabric) -> Placement:
    raw = read.mapping(value, "placement", PLACEMENT_KEYS)
    order = read.choice(raw.get("order", "rank"), "placement.order", ORDERS, "a rank order")
    available = len(fabric.gpus)
    gpus = raw.get("gpus", ALL_GPUS)
    chosen: tuple[str, ...] | int | None = None
    if gpus == ALL_GPUS:
        chosen = None
    elif isinstance(gpus, int) and not isinstance(gpus, bool):
        if not MIN_RANKS <= gpus <= available:
            read.fail(
                "placement.gpus",
                f"a GPU count between {MIN_RANKS} and {available} (the fabric's GPUs)",
                gpus,
            )
        chosen = gpus
    elif isinstance(gpus, list):
        names: list[str] = []
        for i, name in enumerate(gpus):
            if not isinstance(name, str) or name not in fabric.gpus:
                example = ", ".join(g.name for g in fabric.gpus_by_rank()[:3])
                read.fail(
                    f"placement.gpus[{i}]",
                    f"a GPU of fabric {fabric.name} (such as {example})",
                    name,
                )
            if name in names:
                read.fail(f"placement.gpus[{i}]", "each GPU once", name, detail="listed twice")
            names.append(name)
        if len(names) < MIN_RANKS:
            read.fail("placement.gpus", f"at least {MIN_RANKS} GPUs", len(names))
        chosen = tuple(names)
    else:
        read.fail("placement.gpus", f"'{ALL_GPUS}', a GPU count or a list of GPU names", gpus)
    return Placement(gpus=chosen, order=order)


def load_experiment(path: str | Path, *, policies: Collection[str] | None = None) -> ExperimentSpec:
    """Read and validate an experiment file; every problem becomes one ExperimentError
    (or a FabricSpecError naming the fabric file the experiment refers to). ``policies``:
    as for :func:`parse_experiment`."""
    path = Path(path)
    document = read_yaml(path, ExperimentError, "experiment")
    return parse_experiment(document, str(path), path.parent, policies=policies)
