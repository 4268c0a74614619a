"""Load-balancing policies: one class per policy behind one small Protocol, found by name.

A policy turns the fabric description and the links currently known to be down into a
:class:`~controllers.routing.ForwardingPlan` (pure data). The os-ken app
(:mod:`controllers.app`) asks it for a new plan whenever the set of failed links changes and
installs the difference. Policies never talk OpenFlow themselves.

Built in:

    shortest   one next hop per (switch, destination) on a shortest path, static tie-break
               (controllers.routing.shortest_path_plan)

Planned (later issue): ecmp (select groups), path-pinned, adaptive, fast-failover,
telemetry. They extend the contract without breaking it: richer plans (``SwitchTable``
grows a ``groups`` field) and, for policies that react to load, optional extra methods the
app looks for (e.g. ``on_port_stats``); ``render`` stays the one required entry point.

The registry is an explicit object held by whoever needs it (STYLE.md item 4): no import-time
registration, no mutable class state. :func:`default_registry` returns a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from controllers.routing import ForwardingPlan
from topologies.description import FabricDescription
from topologies.errors import ConfigError
from topologies.model import Link


class Policy(Protocol):
    """A load-balancing policy. ``name`` is what users write (``--policy shortest``)."""

    name: str

    def render(
        self, description: FabricDescription, failed_links: frozenset[Link]
    ) -> ForwardingPlan:
        """The complete forwarding state for the fabric with ``failed_links`` down.

        Must be deterministic (same input, same plan) and cover every programmable switch
        (``controllers.routing.programmable_switches``), with an empty table where a switch
        has nothing to do.
        """
        ...


PolicyFactory = Callable[[], Policy]


class PolicyRegistry:
    """Maps policy names to factories; an unknown name is a clear :class:`ConfigError`."""

    def __init__(self) -> None:
        self._factories: dict[str, PolicyFactory] = {}

    def register(self, name: str, factory: PolicyFactory) -> None:
        if name in self._factories:
            raise ValueError(f"a policy named {name!r} is already registered")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, source: str = "command line") -> Policy:
        """A new instance of the policy ``name`` (policies may keep per-run state)."""
        try:
            factory = self._factories[name]
        except KeyError:
            raise ConfigError(source, "policy", "one of " + ", ".join(self.names()), name) from None
        return factory()


def default_registry() -> PolicyRegistry:
    """A fresh registry holding the built-in policies."""
    from controllers.policies.shortest import ShortestPathPolicy

    registry = PolicyRegistry()
    registry.register(ShortestPathPolicy.name, ShortestPathPolicy)
    return registry
