"""Fabric kinds: one module per kind, found through an explicit registry.

A kind's class (a :class:`Generator`) is the one place that knows the kind: its name, what a
spec of it defaults to, how to check and generate it, its closed-form plan, and what it calls
its tiers. The spec validator (:mod:`topologies.spec`), the planner
(:mod:`topologies.planner`) and ``astral topo`` ask the registry, so a new kind is one module
here, registered in :func:`default_registry`, plus its tests.

:func:`default_registry` returns a fresh registry holding the built-in kinds; callers may
register their own on their instance (no mutable class state).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from topologies.errors import FabricSpecError
from topologies.fabricspec import MIN_BUILT_BPS, FabricSpec
from topologies.model import Fabric, Link, LinkKind, Tier
from topologies.plan import Plan, PlanInput
from topologies.units import format_rate

#: The most links :meth:`GeneratorRegistry.build` builds. The model holds every link as an
#: object: the paper's full-size fabric (524,288 GPUs, 3,670,016 links, NVLink included) takes
#: about 15 s and 1.2 GB to build; a spec far beyond (a switch radix of 100,000 asks for
#: billions of servers) would fill the memory for minutes before failing. ``astral topo
#: plan`` dimensions any size in closed form instead.
MAX_LINKS = 1 << 22  # 4,194,304
#: The widest switch a fabric is built or planned with (``astral topo plan --radix``): the
#: closed-form counts walk a pod's ToR groups, which a radix of billions makes a hang (a
#: radix of 2^20 plans in a few seconds); real switches have hundreds of ports.
MAX_RADIX = 1 << 20


class Generator(Protocol):
    """One fabric kind.

    ``check`` and ``generate`` build the fabric; ``plan`` must count exactly what
    ``generate`` builds (tests/unit/test_planner.py holds every kind to it), without building.
    """

    kind: str  # the spec's ``kind:``
    default_nic_ports: int  # a spec's ``nic_ports`` when it says none
    two_tier: bool  # no tier above the spines: one spine layer bounds the fabric's size
    has_rails: bool  # whether a GPU's index in its server is a rail to the network

    @property
    def tier_names(self) -> Mapping[Tier, str]:
        """What the kind calls each of the model's tiers (an edge is a TOR, a spine an AGG)."""

    def check(self, spec: FabricSpec) -> None:
        """Raise FabricSpecError if ``spec`` cannot be wired as this kind."""

    def generate(self, spec: FabricSpec) -> Fabric:
        """Build the fabric model; ``check`` has passed."""

    def plan(self, spec: FabricSpec) -> Plan:
        """The closed-form dimensions of ``spec``; ``check`` has passed."""

    def plan_inputs(self, inputs: PlanInput) -> PlanInput:
        """``inputs`` as this kind takes them when the planner compares the kinds on the same
        switches and ports (what the kind fixes replaced, e.g. a fat-tree host's one port)."""

    def max_servers_per_pod(self, inputs: PlanInput) -> int:
        """The most servers one pod holds with these (``plan_inputs``-adjusted) inputs."""

    def max_pods(self, inputs: PlanInput) -> int:
        """The most pods the kind joins with these (``plan_inputs``-adjusted) inputs."""

    def uniform_uplinks(self, spec: FabricSpec) -> bool:
        """Whether every lower switch links equally often to each switch of the tier above
        (the planner's cuts are exact only then)."""


class GeneratorRegistry:
    """Maps fabric kinds to generators; an unknown kind is a clear error.

    Iterating gives the generators in the order they were registered (the order kinds are
    listed and compared in); :meth:`kinds` gives the names sorted.
    """

    def __init__(self) -> None:
        self._generators: dict[str, Generator] = {}

    def register(self, generator: Generator) -> None:
        if generator.kind in self._generators:
            raise ValueError(f"a generator for kind {generator.kind!r} is already registered")
        self._generators[generator.kind] = generator

    def kinds(self) -> list[str]:
        return sorted(self._generators)

    def __iter__(self) -> Iterator[Generator]:
        return iter(self._generators.values())

    def get(self, kind: str, source: str = "<inline>") -> Generator:
        """The generator of ``kind`` (any value read from a file); FabricSpecError naming
        ``source`` and the known kinds if there is none."""
        generator = self._generators.get(kind) if isinstance(kind, str) else None
        if generator is None:
            known = ", ".join(self._generators)
            raise FabricSpecError(source, "kind", f"one of {known}", kind)
        return generator

    def build(self, spec: FabricSpec, *, floor: bool = True) -> Fabric:
        """Check and generate ``spec``; with ``floor``, its links as built held to the
        floor on emulated rates at its own scale (:func:`check_rate_floor`)."""
        generator = self.get(spec.kind, spec.source)
        generator.check(spec)
        check_buildable(generator, spec)
        fabric = generator.generate(spec)
        if floor:
            check_rate_floor(spec, fabric)
        return fabric


def default_registry() -> GeneratorRegistry:
    from topologies.generators.astral import AstralGenerator
    from topologies.generators.fat_tree import FatTreeGenerator
    from topologies.generators.rail_only import RailOnlyGenerator
    from topologies.generators.rail_optimized import RailOptimizedGenerator

    registry = GeneratorRegistry()
    registry.register(AstralGenerator())
    registry.register(FatTreeGenerator())
    registry.register(RailOptimizedGenerator())
    registry.register(RailOnlyGenerator())
    return registry


def check_buildable(generator: Generator, spec: FabricSpec) -> None:
    """Raise FabricSpecError if ``spec`` (which passed ``generator.check``) is too large to
    build (:data:`MAX_LINKS`), counting its links in closed form (``generator.plan``, which
    counts exactly what ``generate`` builds). The key named is the one that sized what
    overflows: the radix for the tiers above the ToRs and for pods left to fill, the
    servers per pod where they were given and their GPUs' links are the most."""
    radix = spec.switch.radix
    if radix > MAX_RADIX:
        raise spec.error(
            "switch.radix",
            f"a switch of at most {MAX_RADIX:,} ports (real switches have hundreds)",
            radix,
        )
    plan = generator.plan(spec)
    links = sum(plan.links.values())
    if links <= MAX_LINKS:
        return
    gpu_links = plan.links.get(LinkKind.NIC, 0) + plan.links.get(LinkKind.NVLINK, 0)
    if spec.servers_per_pod is not None and 2 * gpu_links > links:
        key, found = "servers_per_pod", spec.servers_per_pod
    else:
        key, found = "switch.radix", radix
    raise spec.error(
        key,
        f"a fabric small enough to build: at most {MAX_LINKS:,} links (`astral topo plan` "
        "dimensions larger ones in closed form)",
        found,
        detail=f"it would have {plan.gpus:,} GPUs in {spec.pods:,} pod(s) of "
        f"{plan.servers_per_pod:,} servers of {spec.gpus_per_server:,}, "
        f"{plan.network_switches:,} network switches and {links:,} links",
    )


def build_fabric(spec: FabricSpec, *, floor: bool = True) -> Fabric:
    """Check and generate ``spec`` with the built-in generators (``floor``: as
    :meth:`GeneratorRegistry.build`; an experiment that sets its own scale checks it
    itself, blaming its scale)."""
    return default_registry().build(spec, floor=floor)


#: The oversubscription that divides each tier's links (the fabric file's key).
OVERSUBSCRIBED_BY = {LinkKind.TOR_AGG: "tor", LinkKind.AGG_CORE: "agg"}


def slowest_link(fabric: Fabric) -> Link:
    """The fabric's slowest link as built: a tier's speed divided by its oversubscription
    (and, in some kinds, shared among parallel links), which the speeds alone do not say."""
    return min(fabric.links, key=lambda link: link.capacity)


def check_rate_floor(spec: FabricSpec, fabric: Fabric) -> None:
    """FabricSpecError if a link as built runs below :data:`MIN_BUILT_BPS` emulated: the
    speeds are checked as read (topologies/spec.py), but an oversubscription of 1000
    divides a tier's links by it (0.02 Mbit/s at the default scale), which stalls a run
    as a mistyped speed does. The key named is the oversubscription that slowed it, or
    the scale."""
    link = slowest_link(fabric)
    emulated = link.capacity * spec.emulation.scale
    if emulated >= MIN_BUILT_BPS:
        return
    tier = OVERSUBSCRIBED_BY.get(link.kind)
    over = getattr(spec.oversubscription, tier) if tier else 1.0
    detail = (
        f"its {link.kind.value} links ({link.a}-{link.b}, {format_rate(link.capacity)} real) "
        f"would run at {emulated:.3g} bit/s emulated at scale {spec.emulation.scale:g}"
    )
    if over > 1:
        most = over * emulated / MIN_BUILT_BPS
        raise spec.error(
            f"oversubscription.{tier}",
            f"an oversubscription that leaves its links {MIN_BUILT_BPS / 1e6:g} Mbit/s "
            f"emulated or more (at most {most:.4g} here, or a larger emulation.scale)",
            over,
            detail=detail,
        )
    raise spec.error(
        "emulation.scale",
        f"a scale at which every link as built runs at {MIN_BUILT_BPS / 1e6:g} Mbit/s "
        "emulated or more",
        spec.emulation.scale,
        detail=detail,
    )
