"""The wiring plan: which bridges, veth pairs and link shapers a fabric needs, as data.

Pure (no root, no Mininet): the emulation records this plan in the run's state file before
creating anything, then creates exactly it; ``astral clean`` removes exactly it.

Mapping of the fabric model onto Linux (decisions measured in docs/emulation.md):

    model                      here
    ToR / agg / core switch    Open vSwitch bridge, OpenFlow 1.3, fail_mode secure, its
                               datapath id = Switch.dpid, OpenFlow port = model port
    NVLink switch              Linux bridge (in-kernel: NVLink traffic costs ovs-vswitchd
                               no CPU, which the rails need), no controller
    link                       veth pair ``<node>-eth<port>`` at both ends; GPU ends live in
                               the GPU's namespace, switch ends in the root namespace
    link rate                  HTB at spec.emulation.emulated(capacity) on both ends
                               (orchestrator.emulation.shaping), NVLink links included

Every interface name is checked to be a safe identifier of at most 15 characters before it
touches a command line (docs/architecture.md: commands are argument lists).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.emulation.shaping import DEFAULT_RECIPE, ShapingRecipe, shaping_commands
from topologies.description import FabricDescription
from topologies.errors import EmulationError
from topologies.model import LinkKind, Tier

IFNAMSIZ = 15
SAFE_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def intf_name(node: str, port: int) -> str:
    """Mininet's default interface name, which the addressing plan also uses."""
    return f"{node}-eth{port}"


def check_name(name: str) -> str:
    if not SAFE_NAME.match(name) or len(name) > IFNAMSIZ:
        raise EmulationError(
            f"name {name!r} cannot be a Linux interface or bridge name (lower-case letters, "
            f"digits and '-', at most {IFNAMSIZ} characters)"
        )
    return name


@dataclass(frozen=True)
class Bridge:
    """A switch of the model. ``kind`` is ``ovs`` (OpenFlow, controller) or ``linux``."""

    name: str
    kind: str
    tier: Tier
    dpid: int

    @property
    def dpid_hex(self) -> str:
        return f"{self.dpid:016x}"


@dataclass(frozen=True)
class Veth:
    """One link as a veth pair. ``a`` always lives in the root namespace; ``b`` lives in
    ``b_host``'s namespace when that is set (a GPU end), else also in the root namespace."""

    a_node: str
    a_port: int
    a_intf: str
    b_node: str
    b_port: int
    b_intf: str
    b_host: str | None
    b_mac: str | None
    kind: LinkKind
    rate_bps: float


@dataclass(frozen=True)
class Shaper:
    """HTB on one root-namespace interface (GPU ends are in the host configuration)."""

    intf: str
    rate_bps: float
    recipe: ShapingRecipe = DEFAULT_RECIPE

    def commands(self) -> list[list[str]]:
        return shaping_commands(self.intf, self.rate_bps, self.recipe)


# A cut link carries the fabric's 1500-byte frames: the underlay between machines needs
# 1550 bytes (VXLAN adds 50), or its packets are fragmented (docs/cluster.md).
TUNNEL_MTU = 1500


@dataclass(frozen=True)
class Tunnel:
    """This machine's end of a link cut between two machines (orchestrator.cluster): a VXLAN
    device named as the veth end it stands for, so that bridges, shapers, faults and
    counters treat it as that end. ``host``: the GPU whose namespace it moves into (a NIC
    link whose switch is on the other machine), else it stays in the root namespace as a
    switch port. ``local``/``remote``: the machines' underlay addresses."""

    node: str
    port: int
    intf: str
    host: str | None
    mac: str | None
    vni: int
    local: str
    remote: str
    udp_port: int
    rate_bps: float

    def create_command(self, group: str, mtu: int = TUNNEL_MTU) -> list[str]:
        """``mtu``: the fabric's (the emulator recipe's: larger with ``jumbo-packets``)."""
        argv = ["ip", "link", "add", "name", self.intf, "group", group]
        if self.mac:
            argv += ["address", self.mac]
        argv += ["mtu", str(mtu), "type", "vxlan", "id", str(self.vni)]
        argv += ["local", self.local, "remote", self.remote, "dstport", str(self.udp_port)]
        return argv


@dataclass(frozen=True)
class Wiring:
    bridges: tuple[Bridge, ...]
    veths: tuple[Veth, ...]
    shapers: tuple[Shaper, ...]
    tunnels: tuple[Tunnel, ...] = ()

    def ovs_bridges(self) -> list[Bridge]:
        return [b for b in self.bridges if b.kind == "ovs"]

    def linux_bridges(self) -> list[Bridge]:
        return [b for b in self.bridges if b.kind == "linux"]

    def root_interfaces(self) -> list[str]:
        """Every veth end in the root namespace (deleting one end deletes its pair)."""
        names = []
        for veth in self.veths:
            names.append(veth.a_intf)
            if veth.b_host is None:
                names.append(veth.b_intf)
        return names + [t.intf for t in self.tunnels if t.host is None]

    def bridge_ports(self, bridge: str) -> list[tuple[int, str]]:
        """(model port, interface) of every port of ``bridge``, in port order."""
        ports = []
        for veth in self.veths:
            if veth.a_node == bridge:
                ports.append((veth.a_port, veth.a_intf))
            if veth.b_node == bridge:
                ports.append((veth.b_port, veth.b_intf))
        ports += [(t.port, t.intf) for t in self.tunnels if t.node == bridge]
        return sorted(ports)

    def restricted(self, nodes: Iterable[str], tunnels: Iterable[Tunnel]) -> Wiring:
        """The part of this plan one machine of a cluster creates: the bridges of its
        switches, the links with both ends on it, the shapers of its root-namespace ends,
        and its ``tunnels`` (orchestrator.cluster). A tunnel's shaper is the link's own."""
        here = set(nodes)
        tunnels = tuple(tunnels)
        veths = tuple(v for v in self.veths if v.a_node in here and v.b_node in here)
        kept = {v.a_intf for v in veths} | {v.b_intf for v in veths if v.b_host is None}
        recipe = self.shapers[0].recipe if self.shapers else DEFAULT_RECIPE
        shapers = [s for s in self.shapers if s.intf in kept]
        shapers += [Shaper(t.intf, t.rate_bps, recipe) for t in tunnels if t.host is None]
        return Wiring(
            tuple(b for b in self.bridges if b.name in here), veths, tuple(shapers), tunnels
        )


def plan_wiring(description: FabricDescription, shaping: ShapingRecipe = DEFAULT_RECIPE) -> Wiring:
    """The bridges, veth pairs and root-namespace shapers of ``description``'s fabric,
    shaped by ``shaping`` (the emulator recipe's, orchestrator.emulation.recipe)."""
    fabric = description.fabric
    bridges = tuple(
        Bridge(
            name=check_name(switch.name),
            kind="linux" if switch.tier is Tier.NVLINK else "ovs",
            tier=switch.tier,
            dpid=switch.dpid,
        )
        for switch in sorted(fabric.switches.values(), key=lambda s: s.dpid)
    )
    veths = []
    shapers = []
    for link in fabric.links:
        a, a_port, b, b_port = link.a, link.a_port, link.b, link.b_port
        if a in fabric.gpus:  # keep the switch end first: it lives in the root namespace
            a, a_port, b, b_port = b, b_port, a, a_port
        if a in fabric.gpus:
            raise EmulationError(f"link {link.a}-{link.b} joins two GPUs; no generator does that")
        rate = description.emulated_rate(link)
        b_host = b if b in fabric.gpus else None
        if b_host is not None:
            port = description.addresses[b].nvlink
            nics = {nic.port: nic for nic in description.addresses[b].nics}
            address = port if b_port == port.port else nics[b_port]
            b_intf, b_mac = address.intf, address.mac
        else:
            b_intf, b_mac = intf_name(b, b_port), None
        veth = Veth(
            a_node=a,
            a_port=a_port,
            a_intf=check_name(intf_name(a, a_port)),
            b_node=b,
            b_port=b_port,
            b_intf=check_name(b_intf),
            b_host=b_host,
            b_mac=b_mac,
            kind=link.kind,
            rate_bps=rate,
        )
        veths.append(veth)
        shapers.append(Shaper(veth.a_intf, rate, shaping))
        if b_host is None:
            shapers.append(Shaper(veth.b_intf, rate, shaping))
    return Wiring(bridges, tuple(veths), tuple(shapers))
