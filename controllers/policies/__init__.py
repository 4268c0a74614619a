"""Load-balancing policies: one class per policy behind one small Protocol, found by name.

A policy turns the fabric description and the links currently known to be down into a
:class:`~controllers.plan.ForwardingPlan` (pure data). The os-ken app
(:mod:`controllers.app`) asks it for a new plan whenever the set of failed links changes and
installs the difference. Policies never talk OpenFlow themselves.

Built in:

    shortest        one next hop per (switch, destination) on a shortest path, static
                    tie-break (controllers.routing.shortest_path_plan)
    ecmp            select groups hashing the five-tuple (OVS selection_method=hash), a
                    different basis (salt) per switch (controllers.policies.ecmp)
    ecmp-polarized  the same, one basis on every switch: polarization on purpose
    path-pinned     the TCP source port picks the path, rules per destination and hop
                    (controllers.policies.path_pinned, controllers.pinning)
    adaptive        TCP connections placed per connection, long ones moved off hot links
                    (Hedera-like; controllers.policies.adaptive)

Options: ``NAME:key=value,...`` (``controllers.policies.options``), passed to the policy's
factory as keyword arguments; every built-in policy but ``adaptive`` takes
``fast_failover=on|off`` (fast-failover groups so the data plane recovers before the
controller re-routes; default on, except for ``shortest``, the plain baseline); adaptive's
options are its thresholds (``adaptive:hot=0.8,cooldown=5``).

Optional methods the app looks for besides ``render``: ``publish(description, failed)``
returns a JSON document the app writes to the paths file after each render
(path-pinned's paths). Policies that react to traffic (adaptive) declare ``needs_load =
True`` (the telemetry app then polls and publishes even without a telemetry file) and
implement ``on_link_load(load, now)`` (every poll round, ``controllers.counters.LinkLoad``)
and ``on_packet_in(switch, in_port, packet, now)`` (a TCP packet one of their entries
copied to the controller); both return the connections they placed, moved or forgot
(``controllers.counters.FlowRoute``): if any, the app re-renders, pushes the difference and
hands the records to the telemetry file.

A controller can only program switches. What a policy needs the hosts to do as well is a
class attribute of the policy, pure data that the orchestrator reads from the registry
(:meth:`PolicyRegistry.get`, no policy created) and carries out: ``pins_source_ports``
(path-pinned: connections must leave from source ports chosen from the published paths,
which ``orchestrator.testbed.pinning`` does). The orchestrator learns the policy names and
these declarations here and never branches on a name, so a new policy is its own module
plus a line in :func:`default_registry`.

The registry is an explicit object held by whoever needs it (docs/architecture.md, "The
registries"): no import-time registration, no mutable class state. :func:`default_registry`
returns a fresh one.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from controllers.plan import ForwardingPlan
from controllers.policies.options import split_policy
from topologies.description import FabricDescription
from topologies.errors import ConfigError
from topologies.model import Link


class Policy(Protocol):
    """A load-balancing policy. ``name`` is what users write (``--policy shortest``)."""

    name: str
    # True if the fabric picks a TCP connection's path by its source port and the policy
    # publishes the paths (``publish``): the orchestrator then opens every worker
    # connection from a port chosen from them (orchestrator.testbed.pinning).
    pins_source_ports: ClassVar[bool]

    def render(
        self, description: FabricDescription, failed_links: frozenset[Link]
    ) -> ForwardingPlan:
        """The complete forwarding state for the fabric with ``failed_links`` down.

        Must be deterministic (same input, same plan) and cover every programmable switch
        (``controllers.routing.programmable_switches``), with an empty table where a switch
        has nothing to do.
        """
        ...


class PolicyFactory(Protocol):
    """What the registry holds: a policy class, whose declarations the orchestrator reads
    without creating a policy; called with the policy's options (strings) as keywords."""

    name: str
    pins_source_ports: bool

    def __call__(self, *args: Any, **options: Any) -> Policy: ...


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

    def get(self, name: str, source: str = "command line") -> PolicyFactory:
        """The policy class registered as ``name`` (a name without options): its
        declarations, such as ``pins_source_ports``."""
        try:
            return self._factories[name]
        except KeyError:
            raise ConfigError(source, "policy", "one of " + ", ".join(self.names()), name) from None

    def create(self, spec: str, source: str = "command line") -> Policy:
        """A new instance of the policy ``spec`` names (policies may keep per-run state).

        ``spec`` is a name, optionally with options: ``ecmp:fast_failover=off``.
        """
        try:
            name, options = split_policy(spec)
        except ValueError as err:
            raise ConfigError(source, "policy", "NAME or NAME:key=value,...", spec) from err
        factory = self.get(name, source)
        try:
            policy: Policy = factory(**options)
        except TypeError as err:
            raise ConfigError(
                source, "policy", f"options the policy {name} takes ({err})", spec
            ) from None
        except ValueError as err:
            raise ConfigError(source, "policy", f"valid options ({err})", spec) from None
        return policy


def default_registry() -> PolicyRegistry:
    """A fresh registry holding the built-in policies."""
    from controllers.policies.adaptive import AdaptivePolicy
    from controllers.policies.ecmp import EcmpPolicy
    from controllers.policies.ecmp_polarized import EcmpPolarizedPolicy
    from controllers.policies.path_pinned import PathPinnedPolicy
    from controllers.policies.shortest import ShortestPathPolicy

    registry = PolicyRegistry()
    factories: list[PolicyFactory] = [
        ShortestPathPolicy,
        EcmpPolicy,
        EcmpPolarizedPolicy,
        PathPinnedPolicy,
        AdaptivePolicy,
    ]
    for factory in factories:
        registry.register(factory.name, factory)
    return registry
