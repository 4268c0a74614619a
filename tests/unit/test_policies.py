"""The policy registry and the built-in policies."""

from __future__ import annotations

from pathlib import Path

import pytest

from controllers.policies import PolicyRegistry, default_registry
from controllers.policies.shortest import ShortestPathPolicy
from controllers.routing import shortest_path_plan
from topologies.description import FabricDescription
from topologies.errors import ConfigError
from topologies.generators import build_fabric
from topologies.spec import load_fabric_spec

PRESET = Path(__file__).resolve().parents[2] / "topologies" / "presets" / "astral-small.yaml"


def test_unknown_policy_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="expected one of shortest, found 'ecmp'"):
        default_registry().create("ecmp")


def test_registries_are_independent_and_refuse_duplicates() -> None:
    mine = default_registry()
    mine.register("other", ShortestPathPolicy)
    assert mine.names() == ["other", "shortest"]
    assert default_registry().names() == ["shortest"]
    with pytest.raises(ValueError, match="already registered"):
        mine.register("shortest", ShortestPathPolicy)
    assert PolicyRegistry().names() == []


def test_create_returns_a_fresh_instance() -> None:
    registry = default_registry()
    assert registry.create("shortest") is not registry.create("shortest")


def test_shortest_policy_renders_the_shortest_path_plan() -> None:
    desc = FabricDescription.of(build_fabric(load_fabric_spec(PRESET)))
    policy = default_registry().create("shortest")
    plan = policy.render(desc, frozenset())
    assert plan.policy == policy.name == "shortest"
    assert plan == shortest_path_plan(desc)
