"""Dimension a full-size fabric in closed form, from the switch radix and the port speed.

No graph is built: every count is the arithmetic the generators' loops carry out (each
kind's closed form is its generator's ``plan``, in ``topologies.generators``), so a plan for
512K GPUs takes microseconds; ``tests/unit/test_planner.py`` checks, on small specs of every
kind, that the counts, the maximum hops and the bisection cuts equal those of the generated
fabric.

The paper's fabric (docs/astral.md; our reading of its numbers): 51.2 Tbit/s switches as
256 x 200G, half down, half up; 8 rails; dual-ToR::

    GPUs per ToR            D                       = 128
    GPUs per rail plane     D ToRs x D ports / 2    = 8,192   (64 dual-ToR pairs)
    GPUs per pod            x 8 rails               = 65,536
    GPUs                    x 8 pods                = 524,288 (about 512K)
    bandwidth per server    8 NICs x 2 x 200G       = 3.2 Tbit/s

Assumptions, stated once:

- **Links** are counted per cable: a NIC port to its ToR is one NIC link (a dual-ToR GPU
  has two), a switch-to-switch cable is one link of its tier. NVLink is inside the server
  and counted apart (one NVLink switch per server), not as network.
- **Transceivers**: 2 per switch-to-switch link (one optic at each end). NIC-to-ToR links
  are counted the same way, 2 per link (one in the NIC port, one in the ToR port), and
  reported separately: in a rail-optimized fabric a rail's ToR sits in another rack than
  most of its servers, so these are optical too; if they were copper (DAC), drop them.
  One transceiver per 200G port; breakout optics (one 800G module for 4 x 200G) would
  divide the count by the breakout factor.
- **Bisection** is the same quantity ``topologies.properties`` computes by max-flow: the
  least capacity across each balanced cut aligned with the fabric (``pods``, ``servers``,
  ``rails``), minimised. Here each cut is a closed-form min-cut, derived for the tree-like
  tiers (per ToR: cut its GPUs or its uplinks, whichever is cheaper), and only computed
  when the halves fall on whole pods / servers / rails (an even number of them).
- **Comparing kinds at one GPU count** uses the same radix, port speed, rails and NIC ports
  for every kind, except that a fat-tree host has one NIC port (so half the bandwidth per
  GPU) and a fat-tree switch splits k/2 down, k/2 up. Each kind takes the fewest pods it
  needs; the two-tier kinds (rail-optimized, rail-only) cannot exceed what one spine layer
  terminates and are reported as out of reach beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topologies.errors import FabricSpecError
from topologies.fabricspec import FabricSpec
from topologies.generators import Generator, default_registry
from topologies.generators.common import ceil_div
from topologies.plan import Plan, PlanInput
from topologies.spec import parse_fabric_spec

SOURCE = "astral topo plan"


@dataclass(frozen=True)
class Unreachable:
    """A kind that cannot be built for the GPU count asked with these switches."""

    kind: str
    gpus: int
    max_gpus: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "gpus": self.gpus,
            "max_gpus": self.max_gpus,
            "reason": self.reason,
        }


def plan_spec(
    kind: str,
    inputs: PlanInput,
    *,
    pods: int | None = None,
    servers_per_pod: int | None = None,
) -> FabricSpec:
    """The FabricSpec of ``kind`` the inputs describe, shape-checked and wire-checked.

    Raises FabricSpecError (source ``astral topo plan``) with the spec's key names.
    """
    document = plan_document(kind, inputs, pods=pods, servers_per_pod=servers_per_pod)
    spec = parse_fabric_spec(document, SOURCE)
    default_registry().get(kind, SOURCE).check(spec)
    return spec


def plan_document(
    kind: str,
    inputs: PlanInput,
    *,
    pods: int | None = None,
    servers_per_pod: int | None = None,
) -> dict[str, Any]:
    """The fabric document (as a fabric file holds it) of :func:`plan_spec`: what a
    what-if (``--set speeds.nic=400G``) edits before the spec is parsed and checked."""
    generator = default_registry().get(kind, SOURCE)
    given = generator.plan_inputs(inputs)
    servers = given.servers_per_pod if servers_per_pod is None else servers_per_pod
    document: dict[str, Any] = {
        "name": f"plan-{kind}",
        "kind": kind,
        "pods": given.pods if pods is None else pods,
        "gpus_per_server": given.rails,
        "nic_ports": given.nic_ports,
        "switch": {"radix": given.radix, "down_ports": given.down},
        "speeds": {
            "nic": given.port_speed,
            "tor_agg": given.port_speed,
            "agg_core": given.port_speed,
            "nvlink": given.nvlink,
        },
        "oversubscription": {
            "tor": given.oversubscription_tor,
            "agg": given.oversubscription_agg,
        },
    }
    if servers is not None:
        document["servers_per_pod"] = servers
    return document


def plan(spec: FabricSpec) -> Plan:
    """Closed-form dimensions of ``spec`` (which must have passed its generator's check)."""
    return default_registry().get(spec.kind, spec.source).plan(spec)


def plan_astral(inputs: PlanInput) -> Plan:
    """The Astral fabric the inputs describe (``pods`` pods, full pods unless told)."""
    return plan(plan_spec("astral", inputs))


# --- comparison at one GPU count ---------------------------------------------------------


def max_gpus(kind: str, inputs: PlanInput) -> int:
    """The most GPUs ``kind`` reaches with these switches (closed form)."""
    return _max_gpus(default_registry().get(kind, SOURCE), inputs)


def _max_gpus(generator: Generator, inputs: PlanInput) -> int:
    given = generator.plan_inputs(inputs)
    return generator.max_pods(given) * generator.max_servers_per_pod(given) * given.rails


def plan_for_gpus(kind: str, gpus: int, inputs: PlanInput) -> Plan | Unreachable:
    """The smallest ``kind`` fabric (fewest pods) holding at least ``gpus`` GPUs."""
    generator = default_registry().get(kind, SOURCE)
    servers = ceil_div(gpus, inputs.rails)
    per_pod = generator.max_servers_per_pod(generator.plan_inputs(inputs))
    most = _max_gpus(generator, inputs)
    if per_pod < 1 or gpus > most:
        tiers = "two-tier " if generator.two_tier else ""
        return Unreachable(
            kind,
            gpus,
            most,
            f"a {tiers}{kind} fabric of radix {inputs.radix} holds at most {most:,} GPUs",
        )
    pods = ceil_div(servers, per_pod)
    try:
        spec = plan_spec(kind, inputs, pods=pods, servers_per_pod=ceil_div(servers, pods))
    except FabricSpecError as err:
        return Unreachable(kind, gpus, most, err.expected)
    return plan(spec)


def compare(gpus: int, inputs: PlanInput) -> list[Plan | Unreachable]:
    """Every kind dimensioned for ``gpus`` GPUs with the same switches and ports."""
    return [plan_for_gpus(generator.kind, gpus, inputs) for generator in default_registry()]


def common_reach(inputs: PlanInput) -> int:
    """The largest GPU count every kind reaches (a multiple of the rails)."""
    return min(_max_gpus(generator, inputs) for generator in default_registry())


def uniform_uplinks(spec: FabricSpec) -> bool:
    """Whether every lower switch links equally often to each switch of the tier above: the
    closed-form cuts here are exact only then (each kind's ``uniform_uplinks`` says why it
    may not be)."""
    return default_registry().get(spec.kind, spec.source).uniform_uplinks(spec)
