"""Breaking a running fabric on purpose: links and switches down, slow or lossy links,
blackholes.

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

An *end* is ``(node, port)``: what leaves the fabric through that node's interface of the
link is that end's direction (shaping and drops act on egress), so a fault on one
direction ``A>B`` acts on A's end only.

- Switch down: every port of the switch down (its own interfaces; the veth peers lose
  carrier with them, as a powered-off switch's neighbours see).
- Loss: an nftables ``netdev`` table per fault with one egress chain per end,
  ``numgen random mod 1000000 < k counter drop`` (netem is absent: docs/environment.md).
  Egress is where OVS's userspace datapath transmits a switch port's packets (as HTB
  shapes them there); an ingress drop would come after the packet socket OVS reads, and
  would not stop it. A GPU end's table lives in the GPU's namespace, and goes with it.
  There the verdict is not ``drop`` but ``fwd to "lo"``: a packet an egress hook drops is
  reported to the sending socket (``NET_XMIT_DROP``), and TCP treats that as its own
  device refusing the segment (it cuts its window and sends the segment again as new
  data, no retransmission), which is not what a lossy wire does. A packet the hook
  *steals* (forwarded elsewhere) counts as sent, so the sender learns of the loss the way
  it would on a real link, from missing acknowledgements, and retransmits. The stolen
  frame goes to the namespace's own loopback, whose stack discards it (it is addressed to
  another host's MAC). Measured with iperf3 over a veth pair at 3 % of packets: ``drop``
  2.3 % fewer bytes than no loss at all, ``fwd to "lo"`` a fifth of the rate and tens of
  thousands of retransmissions. A switch end keeps ``drop``: OVS's transmitting socket
  is no TCP sender.
- Blackhole: OpenFlow entries on one switch dropping IPv4 to a set of addresses, at
  :data:`~controllers.plan.FAULT_PRIORITY` above every policy's entries, with the fault's
  own cookie (``FAULT_COOKIE | id``), which the controller leaves in place across a restart
  or a policy change. Through the executor they are one ``ovs-ofctl -O OpenFlow13``; on
  this machine's own fabric (``openflow=True``) they go over an OpenFlow connection held
  open to the switch (:mod:`orchestrator.emulation.ofchannel`), opened ahead of the fault's
  instant by :meth:`FabricFaults.prepare_blackhole`: 1-3 ms instead of 16-200+ ms.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from controllers.plan import FAULT_COOKIE, FAULT_PRIORITY
from orchestrator.emulation.executor import CommandExecutor
from orchestrator.emulation.ofchannel import (
    OpenFlowChannel,
    blackhole_messages,
    cookie_removal_message,
)
from orchestrator.emulation.recipe import EmulatorRecipe, current_recipe, recipe_named
from orchestrator.emulation.shaping import DEFAULT_RECIPE, ShapingRecipe, shaping_commands
from orchestrator.emulation.wiring import intf_name
from topologies.description import FabricDescription
from topologies.errors import EmulationError
from topologies.model import Fabric, Link

End = tuple[str, int]  # (node, port): one direction of a link, the one leaving that node

LOSS_MODULUS = 1_000_000  # numgen random mod this: loss probabilities to 1e-6


@dataclass(frozen=True)
class NodeCommand:
    """One command and the node it runs on (a GPU: its namespace; a switch: the root),
    with what it reads on its standard input, if anything."""

    node: str
    argv: tuple[str, ...]
    input: str | None = None


class LinkFaults(Protocol):
    """What a fault needs of a running fabric: links' and switches' state, a link's rate
    and loss, a switch's blackhole entries."""

    def set_link_state(self, link: Link, up: bool) -> None: ...

    def set_switch_state(self, switch: str, up: bool) -> None: ...

    def set_port_state(self, ends: Sequence[End], up: bool) -> None:
        """Some link ends only (a fault's undo leaves those another fault holds down)."""

    def set_link_rate(
        self, link: Link, rate_bps: float, ends: Sequence[End] | None = None
    ) -> None: ...

    def restore_link_rate(self, link: Link, ends: Sequence[End] | None = None) -> None: ...

    def add_link_loss(
        self, table: str, link: Link, probability: float, ends: Sequence[End] | None = None
    ) -> None: ...

    def remove_link_loss(
        self, table: str, link: Link, ends: Sequence[End] | None = None
    ) -> None: ...

    def prepare_blackhole(self, switch: str) -> None:
        """Make a later :meth:`add_blackhole` on ``switch`` as quick as it can be."""

    def add_blackhole(self, switch: str, addresses: Sequence[str], cookie: int) -> None: ...

    def remove_blackhole(self, switch: str, cookie: int) -> None: ...

    def close(self) -> None:
        """Let go of what :meth:`prepare_blackhole` holds."""


def link_ends(link: Link) -> list[End]:
    return [(link.a, link.a_port), (link.b, link.b_port)]


def switch_state_commands(fabric: Fabric, switch: str, up: bool) -> list[NodeCommand]:
    """``ip link set`` on every port of ``switch`` (its own ends of its links)."""
    state = "up" if up else "down"
    return [
        NodeCommand(switch, ("ip", "link", "set", "dev", intf_name(switch, port), state))
        for port in sorted(link.port_of(switch) for link in fabric.links_of(switch))
    ]


def loss_table(run_id: str, fault_id: int) -> str:
    """The nftables table of one loss fault: unique per run and fault, so that ``astral
    clean`` deletes exactly it (nft names: letters, digits and '_')."""
    return f"astral_{''.join(c if c.isalnum() else '_' for c in run_id)}_f{fault_id}"


def loss_threshold(probability: float) -> int:
    """``k`` of ``numgen random mod LOSS_MODULUS < k``: the drop probability, rounded."""
    return max(1, min(LOSS_MODULUS, round(probability * LOSS_MODULUS)))


def loss_commands(
    table: str,
    link: Link,
    probability: float,
    ends: Sequence[End] | None = None,
    hosts: Collection[str] = (),
) -> list[NodeCommand]:
    """One ``nft -f -`` per end: a netdev table ``table`` whose egress chain on the end's
    interface loses packets at random with ``probability`` (and counts them). An end on
    one of ``hosts`` (the GPUs, whose own TCP sends through it) steals the packet to the
    namespace's loopback instead of dropping it, so that its sender sees a wire's loss
    (module docstring)."""
    k = loss_threshold(probability)
    commands = []
    for node, port in ends or link_ends(link):
        device = intf_name(node, port)
        chain = "loss_" + "".join(c if c.isalnum() else "_" for c in device)
        verdict = 'fwd to "lo"' if node in hosts else "drop"
        script = (
            f"table netdev {table} {{\n"
            f"  chain {chain} {{\n"
            f'    type filter hook egress device "{device}" priority 0; policy accept;\n'
            f"    numgen random mod {LOSS_MODULUS} < {k} counter {verdict}\n"
            f"  }}\n"
            f"}}\n"
        )
        commands.append(NodeCommand(node, ("nft", "-f", "-"), script))
    return commands


def loss_removal_commands(
    table: str, link: Link, ends: Sequence[End] | None = None
) -> list[NodeCommand]:
    """Delete the loss fault's table wherever :func:`loss_commands` made it."""
    return [
        NodeCommand(node, ("nft", "delete", "table", "netdev", table))
        for node, _ in ends or link_ends(link)
    ]


def fault_cookie(fault_id: int) -> int:
    """The OpenFlow cookie of one fault's entries (controllers.plan.FAULT_COOKIE family)."""
    if not 0 <= fault_id < 1 << 32:
        raise ValueError("a fault id between 0 and 2**32 - 1")
    return FAULT_COOKIE | fault_id


def blackhole_commands(switch: str, addresses: Sequence[str], cookie: int) -> list[NodeCommand]:
    """One ``ovs-ofctl add-flows`` (the entries on its standard input, so that they arrive
    together): per address, drop IPv4 to it, above every policy's entries."""
    entries = "".join(
        f"cookie={cookie:#x},table=0,priority={FAULT_PRIORITY},ip,nw_dst={address},actions=drop\n"
        for address in addresses
    )
    return [
        NodeCommand(switch, ("ovs-ofctl", "-O", "OpenFlow13", "add-flows", switch, "-"), entries)
    ]


def blackhole_removal_commands(switch: str, cookie: int) -> list[NodeCommand]:
    """Delete exactly the entries with ``cookie`` (the mask -1: all 64 bits must match)."""
    return [
        NodeCommand(
            switch,
            ("ovs-ofctl", "-O", "OpenFlow13", "del-flows", switch, f"cookie={cookie:#x}/-1"),
        )
    ]


def link_state_commands(link: Link, up: bool) -> list[NodeCommand]:
    """``ip link set`` on both ends of ``link`` (down: carrier lost on both sides)."""
    return port_state_commands(link_ends(link), up)


def port_state_commands(ends: Sequence[End], up: bool) -> list[NodeCommand]:
    """``ip link set`` on each of ``ends``, on its own node."""
    state = "up" if up else "down"
    return [
        NodeCommand(node, ("ip", "link", "set", "dev", intf_name(node, port), state))
        for node, port in ends
    ]


def link_rate_commands(
    description: FabricDescription,
    link: Link,
    rate_bps: float,
    recipe: ShapingRecipe = DEFAULT_RECIPE,
    ends: Sequence[End] | None = None,
) -> list[NodeCommand]:
    """The shaper of ``ends`` of ``link`` (default both) at ``rate_bps`` (emulated bit/s),
    GPU ends with the host-side leaf, as the emulation shaped them at bring-up: its HTB
    class and leaf replaced. The root HTB qdisc it hangs from stays as it is (replacing a
    root HTB by an identical one is a change, which HTB refuses: "Change operation not
    supported by specified qdisc", measured on Linux 6.18)."""
    gpus = description.fabric.gpus
    return [
        NodeCommand(node, tuple(argv))
        for node, port in ends or link_ends(link)
        for argv in shaping_commands(
            intf_name(node, port), rate_bps, recipe, host_side=node in gpus
        )
        if not (argv[:3] == ["tc", "qdisc", "replace"] and "root" in argv)
    ]


def fabric_recipe(description: FabricDescription) -> EmulatorRecipe:
    """The emulator recipe ``description``'s fabric was brought up with (the one runs use
    when the description does not say)."""
    name = description.extra.get("recipe")
    return recipe_named(str(name), "fabric description: recipe") if name else current_recipe()


class FabricFaults:
    """:class:`LinkFaults` over any :class:`CommandExecutor` (see the module docstring)."""

    def __init__(
        self,
        executor: CommandExecutor,
        description: FabricDescription,
        recipe: ShapingRecipe | None = None,
        *,
        openflow: bool = False,
    ) -> None:
        self.executor = executor
        self.description = description
        # blackholes over held OpenFlow connections (a fabric on this machine), one per
        # switch, each used by one fault's thread at a time
        self.openflow = openflow
        self._channels: dict[str, OpenFlowChannel] = {}
        self._channel_locks: dict[str, threading.Lock] = {}
        self._channels_lock = threading.Lock()
        # A link's rate is re-shaped by the recipe it was shaped with at bring-up (the
        # fabric description records its name; orchestrator.emulation.recipe).
        self.recipe = recipe or fabric_recipe(description).shaping

    def set_link_state(self, link: Link, up: bool) -> None:
        self._apply(link_state_commands(link, up))

    def set_switch_state(self, switch: str, up: bool) -> None:
        self._apply(switch_state_commands(self.description.fabric, switch, up))

    def set_port_state(self, ends: Sequence[End], up: bool) -> None:
        self._apply(port_state_commands(ends, up))

    def set_link_rate(self, link: Link, rate_bps: float, ends: Sequence[End] | None = None) -> None:
        self._apply(link_rate_commands(self.description, link, rate_bps, self.recipe, ends))

    def restore_link_rate(self, link: Link, ends: Sequence[End] | None = None) -> None:
        self.set_link_rate(link, self.description.emulated_rate(link), ends)

    def add_link_loss(
        self, table: str, link: Link, probability: float, ends: Sequence[End] | None = None
    ) -> None:
        gpus = self.description.fabric.gpus
        self._apply(loss_commands(table, link, probability, ends, hosts=gpus))

    def remove_link_loss(self, table: str, link: Link, ends: Sequence[End] | None = None) -> None:
        self._apply(loss_removal_commands(table, link, ends), missing_ok=True)

    def _held_here(self, switch: str) -> bool:
        """Whether an OpenFlow channel reaches ``switch`` from here (a cluster's switch on
        another machine is programmed through its machine's ``ovs-ofctl`` instead)."""
        holds = getattr(self.executor, "holds", None)
        return self.openflow and (holds is None or bool(holds(switch)))

    def prepare_blackhole(self, switch: str) -> None:
        if self._held_here(switch):
            channel, lock = self._channel(switch)
            with lock:
                channel.open()

    def add_blackhole(self, switch: str, addresses: Sequence[str], cookie: int) -> None:
        if not self._held_here(switch):
            self._apply(blackhole_commands(switch, addresses, cookie))
            return
        channel, lock = self._channel(switch)
        with lock:
            channel.request(blackhole_messages(addresses, cookie, FAULT_PRIORITY))

    def remove_blackhole(self, switch: str, cookie: int) -> None:
        if not self._held_here(switch):
            self._apply(blackhole_removal_commands(switch, cookie))
            return
        channel, lock = self._channel(switch)
        with lock:
            channel.request([cookie_removal_message(cookie)])

    def close(self) -> None:
        with self._channels_lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def _channel(self, switch: str) -> tuple[OpenFlowChannel, threading.Lock]:
        with self._channels_lock:
            if switch not in self._channels:
                self._channels[switch] = OpenFlowChannel(switch)
                self._channel_locks[switch] = threading.Lock()
            return self._channels[switch], self._channel_locks[switch]

    def _apply(self, commands: Sequence[NodeCommand], missing_ok: bool = False) -> None:
        """Run every command, root-namespace ones first (a veth end down there takes the
        carrier from its peer at once; entering a GPU's namespace costs a process start);
        the first that fails raises (``missing_ok``: one whose object is already gone, "No
        such file or directory", counts as done)."""
        gpus = self.description.fabric.gpus
        for command in sorted(commands, key=lambda c: c.node in gpus):
            # a switch's commands run where it is (the root namespace of its machine)
            done = self.executor.run(command.node, command.argv, input=command.input)
            if not done.ok and missing_ok and "No such file or directory" in done.stderr:
                continue
            if not done.ok:
                raise EmulationError(
                    f"{' '.join(command.argv)} on {command.node} failed: {done.stderr.strip()}"
                )
