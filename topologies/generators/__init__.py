"""Topology generators: one module per fabric kind, found through an explicit registry.

A generator is an object with a ``kind`` name, ``check(spec)`` (raise
:class:`~topologies.errors.FabricSpecError` if the fabric cannot be wired) and
``generate(spec) -> Fabric``. :func:`default_registry` returns a fresh registry holding the
built-in kinds; callers may register their own on their instance (no mutable class state).
"""

from __future__ import annotations

from typing import Protocol

from topologies.errors import FabricSpecError
from topologies.model import Fabric
from topologies.spec import FabricSpec


class Generator(Protocol):
    kind: str

    def check(self, spec: FabricSpec) -> None:
        """Raise FabricSpecError if ``spec`` cannot be wired as this kind."""

    def generate(self, spec: FabricSpec) -> Fabric:
        """Build the fabric model; ``check`` has passed."""


class GeneratorRegistry:
    """Maps fabric kinds to generators; an unknown kind is a clear error."""

    def __init__(self) -> None:
        self._generators: dict[str, Generator] = {}

    def register(self, generator: Generator) -> None:
        if generator.kind in self._generators:
            raise ValueError(f"a generator for kind {generator.kind!r} is already registered")
        self._generators[generator.kind] = generator

    def kinds(self) -> list[str]:
        return sorted(self._generators)

    def get(self, spec: FabricSpec) -> Generator:
        try:
            return self._generators[spec.kind]
        except KeyError:
            raise FabricSpecError(
                spec.source, "kind", "one of " + ", ".join(self.kinds()), spec.kind
            ) from None

    def build(self, spec: FabricSpec) -> Fabric:
        generator = self.get(spec)
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
