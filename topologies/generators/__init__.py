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
from topologies.fabricspec import FabricSpec
from topologies.model import Fabric, LinkKind, Tier
from topologies.plan import Plan, PlanInput

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

    def build(self, spec: FabricSpec) -> Fabric:
        generator = self.get(spec.kind, spec.source)
        generator.check(spec)
        check_buildable(generator, spec)
        return generator.generate(spec)


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


def build_fabric(spec: FabricSpec) -> Fabric:
    """Check and generate ``spec`` with the built-in generators."""
    return default_registry().build(spec)
