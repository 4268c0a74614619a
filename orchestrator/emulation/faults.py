"""Breaking a running fabric on purpose: a link down or up, a link at another rate.

Like Mininet's ``configLinkStatus`` (both ends of a veth down, so the carrier loss reaches
both sides and the controller sees a port-status message from each switch end), but on the
fabric model's names and through a :class:`~orchestrator.emulation.executor.CommandExecutor`,
so that the same code breaks a fabric on this machine or on a remote one.

The commands are rendered as data first (:func:`link_state_commands`,
:func:`link_rate_commands`; unit-tested without root), then applied by
:class:`FabricFaults`, which implements the :class:`LinkFaults` protocol the layers above
program against (scheduled faults, benchmarks, integration tests).

A link's rate is changed by replacing its HTB class and leaf at both ends with the shaping
recipe's commands for the new rate (``tc ... replace``: no moment without a shaper); the
original emulated rate is put back by :meth:`LinkFaults.restore_link_rate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.emulation.executor import CommandExecutor
from orchestrator.emulation.shaping import DEFAULT_RECIPE, ShapingRecipe, shaping_commands
from orchestrator.emulation.wiring import intf_name
from topologies.description import FabricDescription
from topologies.errors import EmulationError
from topologies.model import Link


@dataclass(frozen=True)
class NodeCommand:
    """One command and the node it runs on (a GPU: its namespace; a switch: the root)."""

    node: str
    argv: tuple[str, ...]


class LinkFaults(Protocol):
    """What a fault needs of a running fabric: a link's state and rate."""

    def set_link_state(self, link: Link, up: bool) -> None: ...

    def set_link_rate(self, link: Link, rate_bps: float) -> None: ...

    def restore_link_rate(self, link: Link) -> None: ...


def link_ends(link: Link) -> list[tuple[str, int]]:
    return [(link.a, link.a_port), (link.b, link.b_port)]


def link_state_commands(link: Link, up: bool) -> list[NodeCommand]:
    """``ip link set`` on both ends of ``link`` (down: carrier lost on both sides)."""
    state = "up" if up else "down"
    return [
        NodeCommand(node, ("ip", "link", "set", "dev", intf_name(node, port), state))
        for node, port in link_ends(link)
    ]


def link_rate_commands(
    description: FabricDescription,
    link: Link,
    rate_bps: float,
    recipe: ShapingRecipe = DEFAULT_RECIPE,
) -> list[NodeCommand]:
    """The shaper of both ends of ``link`` at ``rate_bps`` (emulated bit/s), GPU ends with
    the host-side leaf, as the emulation shaped them at bring-up."""
    gpus = description.fabric.gpus
    return [
        NodeCommand(node, tuple(argv))
        for node, port in link_ends(link)
        for argv in shaping_commands(
            intf_name(node, port), rate_bps, recipe, host_side=node in gpus
        )
    ]


class FabricFaults:
    """:class:`LinkFaults` over any :class:`CommandExecutor` (see the module docstring)."""

    def __init__(
        self,
        executor: CommandExecutor,
        description: FabricDescription,
        recipe: ShapingRecipe = DEFAULT_RECIPE,
    ) -> None:
        self.executor = executor
        self.description = description
        self.recipe = recipe

    def set_link_state(self, link: Link, up: bool) -> None:
        self._apply(link_state_commands(link, up))

    def set_link_rate(self, link: Link, rate_bps: float) -> None:
        self._apply(link_rate_commands(self.description, link, rate_bps, self.recipe))

    def restore_link_rate(self, link: Link) -> None:
        self.set_link_rate(link, self.description.emulated_rate(link))

    def _apply(self, commands: Sequence[NodeCommand]) -> None:
        for command in commands:
            node = command.node if command.node in self.description.fabric.gpus else None
            done = self.executor.run(node, command.argv)
            if not done.ok:
                raise EmulationError(
                    f"{' '.join(command.argv)} on {command.node} failed: {done.stderr.strip()}"
                )
