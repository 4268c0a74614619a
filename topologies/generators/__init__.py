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
from topologies.model import Fabric, Tier
from topologies.plan import Plan, PlanInput


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


def build_fabric(spec: FabricSpec) -> Fabric:
    """Check and generate ``spec`` with the built-in generators."""
    return default_registry().build(spec)
