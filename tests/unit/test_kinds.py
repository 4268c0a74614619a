"""Fabric kinds live in the generator registry: what each declares, and a fifth kind that
needs nothing but its own class to be validated, generated and planned."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from topologies.errors import FabricSpecError
from topologies.fabricspec import FabricSpec
from topologies.generators import GeneratorRegistry, default_registry
from topologies.generators.common import TIER_NAMES
from topologies.model import Fabric, FabricBuilder, LinkKind, Tier
from topologies.plan import Plan, PlanInput
from topologies.planner import compare
from topologies.spec import parse_fabric_spec

BUILT_IN = ["astral", "fat-tree", "rail-optimized", "rail-only"]


def document(kind: str, **fields: Any) -> dict[str, Any]:
    return {"name": "k", "kind": kind, "gpus_per_server": 2, "switch": {"radix": 4}, **fields}


def test_kinds_are_listed_and_compared_in_registration_order() -> None:
    assert [generator.kind for generator in default_registry()] == BUILT_IN
    assert [result.kind for result in compare(16, PlanInput(radix=8, rails=2, pods=1))] == (
        BUILT_IN
    )
    with pytest.raises(FabricSpecError) as info:
        parse_fabric_spec(document("torus"), "f.yaml")
    assert info.value.key == "kind"
    assert info.value.expected == "one of " + ", ".join(BUILT_IN)


@pytest.mark.parametrize("found", [["astral"], {"astral": 1}, 3, None])
def test_a_kind_that_is_no_name_is_one_sentence(found: object) -> None:
    with pytest.raises(FabricSpecError) as info:
        parse_fabric_spec(document("astral") | {"kind": found}, "f.yaml")
    assert (info.value.key, info.value.found) == ("kind", found)


@pytest.mark.parametrize("kind", BUILT_IN)
def test_the_spec_takes_the_kinds_default_nic_ports(kind: str) -> None:
    generator = default_registry().get(kind)
    doc = document(kind, pods=1, servers_per_pod=1)
    assert parse_fabric_spec(doc).nic_ports == generator.default_nic_ports


@pytest.mark.parametrize("kind", BUILT_IN)
def test_every_tier_has_a_name(kind: str) -> None:
    assert set(default_registry().get(kind).tier_names) == set(Tier)


def test_what_the_kinds_declare() -> None:
    declared = {
        g.kind: (g.default_nic_ports, g.two_tier, g.has_rails, g.tier_names[Tier.TOR])
        for g in default_registry()
    }
    assert declared == {
        "astral": (2, False, True, "ToR"),
        "fat-tree": (1, False, False, "edge"),
        "rail-optimized": (1, True, True, "leaf (ToR)"),
        "rail-only": (1, True, True, "rail leaf"),
    }


# --- a fifth kind ----------------------------------------------------------------------


class StarGenerator:
    """Every GPU of a pod on one switch; the pods' switches under one core."""

    kind = "star"
    default_nic_ports = 1
    two_tier = True
    has_rails = False
    tier_names: Mapping[Tier, str] = {**TIER_NAMES, Tier.TOR: "hub"}

    def check(self, spec: FabricSpec) -> None:
        if self._servers(spec) * spec.rails > spec.switch.down_ports:
            raise spec.error("servers_per_pod", "GPUs of a pod at most the down ports")

    def generate(self, spec: FabricSpec) -> Fabric:
        builder = FabricBuilder(spec)
        for pod in range(spec.pods):
            hub = builder.add_switch(f"p{pod}t0", Tier.TOR, pod=pod, index=0)
            for index in range(self._servers(spec)):
                for gpu in builder.add_server(pod, index).gpus:
                    builder.connect(gpu, hub, LinkKind.NIC, spec.speeds.nic)
        return builder.build()

    def plan(self, spec: FabricSpec) -> Plan:
        servers = self._servers(spec)
        gpus = spec.pods * servers * spec.rails
        switches = {Tier.TOR: spec.pods, Tier.NVLINK: spec.pods * servers}
        links = {LinkKind.NIC: gpus, LinkKind.NVLINK: gpus}
        return Plan(spec, servers, switches, links, 1)

    def plan_inputs(self, inputs: PlanInput) -> PlanInput:
        return inputs

    def max_servers_per_pod(self, inputs: PlanInput) -> int:
        return inputs.down // inputs.rails

    def max_pods(self, inputs: PlanInput) -> int:
        return 1

    def uniform_uplinks(self, spec: FabricSpec) -> bool:
        return True

    def _servers(self, spec: FabricSpec) -> int:
        return spec.servers_per_pod or spec.switch.down_ports // spec.rails


def test_a_fifth_kind_is_its_class_registered() -> None:
    registry = default_registry()
    registry.register(StarGenerator())
    spec = parse_fabric_spec(document("star", switch={"radix": 8}), "star.yaml", registry)
    assert spec.nic_ports == 1  # its declared default
    fabric = registry.build(spec)
    plan = registry.get("star").plan(spec)
    assert plan.gpus == len(fabric.gpus) == 4
    assert plan.switches == dict(Counter(s.tier for s in fabric.switches.values()))
    assert plan.links == dict(Counter(link.kind for link in fabric.links))
    with pytest.raises(FabricSpecError, match="one of astral, fat-tree, rail-optimized"):
        parse_fabric_spec(document("star"), "star.yaml")  # the built-in registry is untouched


def test_a_kind_is_registered_once() -> None:
    registry = GeneratorRegistry()
    registry.register(StarGenerator())
    with pytest.raises(ValueError, match="'star' is already registered"):
        registry.register(StarGenerator())
