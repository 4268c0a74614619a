"""What each emulated GPU's network namespace is configured with, rendered as data.

Pure: :func:`render_host_config` turns one GPU of a
:class:`~topologies.description.FabricDescription` into argument lists, the emulation runs
them inside that GPU's namespace (docs/architecture.md: render, then check, then start).
Every address comes from the description's addressing plan; nothing here derives one.

The contract (shared with the controller, ``controllers/``)::

    eth0            NVLink port: NVLink address /24 (the server's NVLink subnet)
    eth1..ethN      NIC ports: the GPU's fabric address /32 on each (the same address on
                    both ports of a dual-ToR GPU), MACs from the plan, and a permanent
                    neighbour entry GATEWAY_IP -> GATEWAY_MAC (the gateway is virtual: the
                    switches route on the destination address and never answer ARP)
    routes          FABRIC_PREFIX via GATEWAY_IP onlink, one nexthop per NIC port, src = the
                    fabric address; rail-only fabrics add 10.<r>.0.0/16 via the NVLink address
                    of the server's GPU on rail r (it forwards: ip_forward=1)
    rules           rail-only, dual-port NICs: a forwarded TCP packet whose source port lies
                    in NIC port i's range of FORWARDING_PORTS leaves by NIC port i (table
                    FORWARDING_TABLE + i); any other takes the multipath route

Sysctls, and why:

- ``fib_multipath_hash_policy=1``: hash on the L4 five-tuple, so different flows between the
  same pair of GPUs spread over both NIC ports (policy 0 hashes addresses only).
- ``conf.all.ignore_routes_with_linkdown=1``: a nexthop whose port lost carrier drops out of
  the multipath route, so a failed ToR link halves a dual-ToR GPU's bandwidth, not cuts it.
- ``rp_filter=0`` everywhere: the same source address arrives on either port, and rail-only
  forwarding receives fabric traffic on the NVLink port.
- ``arp_ignore=1``, ``arp_announce=2``: with one address on two ports, answer ARP only on the
  port the request came in on and announce the address of the outgoing port.
- IPv6 off: no router solicitations, DAD or MLD noise on the emulated links.
The TCP stack, tuned for a faithful NIC (docs/fidelity.md, "With the current recipe"):

- ``tcp_timestamps=0``: 12 fewer option bytes in every segment, so a 1500-byte frame carries
  1460 bytes of payload: TCP can reach 1460/1514 = 0.964 of a link's rate (0.956 with
  timestamps). RoCE, which the emulated fabric stands for, spends about 1.5 % on headers
  with 4 kB frames; this keeps the emulation's own overhead closer to that. Nothing here
  needs timestamps: RTTs are sampled from the kernel's own send times, and sequence numbers
  cannot wrap at emulated rates.
- ``tcp_min_tso_segs=4`` and ``gso_max_segs 4`` on every port: every TCP packet a GPU hands
  its NIC is the same size, 4 segments. A GPU's own NIC never drops (TCP Small Queues keeps
  each socket's share of the queue small), so nothing tells CUBIC flows leaving one NIC to
  converge; each flow keeps a few packets queued and the FIFO serves packets in turn, which
  is fair only if every flow's packets are the same size. Left alone, TCP sizes them from
  its pacing rate, and a flow that started first (large window) sent larger ones: 8 flows
  out of one NIC got Jain's index 0.62-0.96; with 4 segments everywhere, 1.000 (the way a
  real NIC serves its queue pairs in turn). 4 rather than 2: fewer, larger packets cost
  ovs-vswitchd less, and one flow over 5 switches kept 0.955 of the rate instead of 0.948.

Which NIC port a forwarded packet leaves by, and why rules: on a rail-only fabric a
connection to another rail crosses NVLink to the server-mate on that rail, which forwards
it out of one of its NIC ports. Its multipath hash cannot be planned for a forwarded packet:
under policy 1 Linux uses the layer-4 hash the packet already carries ("short-circuit if we
already have L4 hash present", ``fib_multipath_hash`` in net/ipv4/route.c), which for a
TCP segment is its sending socket's random ``sk_txhash``, kept across the veth and drawn
anew after a retransmission timeout. Measured on rail-only-small (path-pinned ring,
2026-12-04): a mate sent both channels of a forwarded connection out of one port for 8 s,
then split them, where ``ip route get ... iif`` (which hashes the five-tuple) had named one
port each. Policy 3 (the named fields of every packet) would fix forwarding but breaks the
planning of the GPUs' own connections: the kernel hashes a connection's route lookup and
``ip route get`` differently under it (with the same ring's hierarchical all-reduce,
path-pinned 4 MiB fell from 71.5 to 46.3 GB/s). So the mate's choice is made explicit,
as NCCL's PXN makes it on a real rail-only server: the source port of a forwarded connection
says which of the mate's NIC ports carries it (the orchestrator picks it so:
orchestrator/testbed/pinning.py), by rules the mate's kernel applies to what it forwards
and ``ip route get ... iif`` answers alike. The ranges lie below the kernel's ephemeral
ports, so a connection with an ephemeral port is hashed as before.

Congestion control, and why it is set on the routes: every route the GPU's traffic takes
(fabric, NVLink subnet, rail-only detours) carries ``congctl cubic``. A namespace otherwise
inherits the machine's default, BBR on many current distributions, and BBR (v1) flows sharing
a shallow drop-tail bottleneck get Jain's index 0.48-0.57 here, CUBIC 0.98-0.99 with the
head-drop switch queue (docs/calibration.md). Loss-based TCP is also closer to what a
datacenter fabric's congestion control reacts to (drops or marks at a switch queue). The
sysctl ``net.ipv4.tcp_congestion_control`` would be simpler, but a child namespace may only
choose an algorithm of the root's ``tcp_allowed_congestion_control`` (here "reno bbr": EPERM
for cubic), which the emulation should not change machine-wide; a route's ``congctl`` has
no such restriction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import ip_interface

from orchestrator.emulation.recipe import EmulatorRecipe, current_recipe
from orchestrator.emulation.shaping import shaping_commands
from topologies.addressing import FABRIC_PREFIX, GATEWAY_IP, GATEWAY_MAC, GpuAddresses
from topologies.description import FabricDescription
from topologies.model import LinkKind

Argv = list[str]

#: TCP congestion control of every route of a GPU (module docstring: why, and why on routes).
TCP_CONGESTION_CONTROL = "cubic"
#: Source ports that choose a forwarding GPU's NIC port (module docstring): split evenly
#: among its NIC ports, in port order; below Linux's ephemeral range (32768-60999).
FORWARDING_PORTS = (16384, 32767)
#: Routing table of a forwarding GPU's NIC port i: FORWARDING_TABLE + i (rule priority too).
FORWARDING_TABLE = 100


def forwarding_ranges(nic_ports: int) -> list[tuple[int, int]]:
    """The source-port range (inclusive) of each of a forwarding GPU's ``nic_ports`` NIC
    ports, in port order: FORWARDING_PORTS split evenly (none for a single port, which
    needs no choice)."""
    if nic_ports < 2:
        return []
    low, high = FORWARDING_PORTS
    width = (high - low + 1) // nic_ports
    return [(low + i * width, low + (i + 1) * width - 1) for i in range(nic_ports)]


@dataclass(frozen=True)
class HostConfig:
    """Everything one GPU's namespace is configured with, in the order it is applied."""

    gpu: str
    sysctls: tuple[tuple[str, str], ...]
    links: tuple[Argv, ...]  # MACs and link state
    addresses: tuple[Argv, ...]
    neighbours: tuple[Argv, ...]
    routes: tuple[Argv, ...]
    shaping: tuple[Argv, ...]  # tc, for the GPU's end of each shaped link
    interfaces: tuple[str, ...] = field(default=())

    def sysctl_argv(self) -> Argv:
        return ["sysctl", "-q", "-w", *(f"{key}={value}" for key, value in self.sysctls)]

    def commands(self) -> list[Argv]:
        """Every command, in order: sysctls, links, addresses, neighbours, routes, shaping."""
        return [
            self.sysctl_argv(),
            *self.links,
            *self.addresses,
            *self.neighbours,
            *self.routes,
            *self.shaping,
        ]


def _sysctls(addresses: GpuAddresses, forwarding: bool, gso_segments: int) -> list[tuple[str, str]]:
    intfs = ["lo", addresses.nvlink.intf, *(nic.intf for nic in addresses.nics)]
    values = [
        ("net.ipv6.conf.all.disable_ipv6", "1"),
        ("net.ipv6.conf.default.disable_ipv6", "1"),
        ("net.ipv4.fib_multipath_hash_policy", "1"),
        ("net.ipv4.conf.all.ignore_routes_with_linkdown", "1"),
        ("net.ipv4.conf.default.ignore_routes_with_linkdown", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.default.rp_filter", "0"),
        *((f"net.ipv4.conf.{intf}.rp_filter", "0") for intf in intfs),
        ("net.ipv4.conf.all.arp_ignore", "1"),
        ("net.ipv4.conf.all.arp_announce", "2"),
        ("net.ipv4.conf.default.arp_ignore", "1"),
        ("net.ipv4.conf.default.arp_announce", "2"),
        ("net.ipv4.ip_forward", "1" if forwarding else "0"),
        ("net.ipv4.tcp_timestamps", "0"),
        ("net.ipv4.tcp_min_tso_segs", str(gso_segments)),
    ]
    if forwarding:
        # A forwarding GPU must not tell its server-mates to "go direct": they cannot.
        values += [
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.default.send_redirects", "0"),
        ]
    return values


def _rail_routes(description: FabricDescription, addresses: GpuAddresses) -> list[Argv]:
    """Rail-only: reach the other rails through the server-mate on that rail (over NVLink)."""
    server = description.fabric.servers[addresses.server]
    routes = []
    for mate in server.gpus:
        peer = description.addresses[mate]
        if peer.rail == addresses.rail:
            continue
        routes.append(
            [
                "ip",
                "route",
                "replace",
                peer.rail_prefix(),
                "via",
                peer.nvlink.ip,
                "dev",
                addresses.nvlink.intf,
                "src",
                addresses.fabric_ip,
                "congctl",
                TCP_CONGESTION_CONTROL,
            ]
        )
    return routes


def _forwarding_rules(addresses: GpuAddresses, congctl: list[str]) -> list[Argv]:
    """A forwarding GPU's NIC port per forwarded source-port range (module docstring): a
    table with the fabric route over that port alone, and a rule for packets arriving on
    the NVLink port. A table whose port lost its link has no usable route, and the lookup
    goes on to the main table's multipath route (``ignore_routes_with_linkdown``)."""
    nics = sorted(addresses.nics, key=lambda n: n.port)
    argvs: list[Argv] = []
    for i, (nic, (low, high)) in enumerate(zip(nics, forwarding_ranges(len(nics)), strict=False)):
        table = str(FORWARDING_TABLE + i)
        argvs.append(
            ["ip", "route", "replace", FABRIC_PREFIX, "via", GATEWAY_IP, "dev", nic.intf,
             "onlink", "table", table, *congctl]
        )  # fmt: skip
        argvs.append(
            ["ip", "rule", "add", "priority", table, "iif", addresses.nvlink.intf,
             "ipproto", "tcp", "sport", f"{low}-{high}", "lookup", table]
        )  # fmt: skip
    return argvs


def _link_rates(description: FabricDescription, gpu: str) -> dict[int, float]:
    """Emulated rate of each of the GPU's ports (port number -> bit/s)."""
    rates = {}
    for link in description.fabric.links_of(gpu):
        if link.kind in (LinkKind.NVLINK, LinkKind.NIC):
            rates[link.port_of(gpu)] = description.emulated_rate(link)
    return rates


def render_host_config(
    description: FabricDescription, gpu: str, recipe: EmulatorRecipe | None = None
) -> HostConfig:
    """The namespace configuration of ``gpu`` (see the module docstring for the contract)
    under ``recipe`` (default: :func:`~orchestrator.emulation.recipe.current_recipe`)."""
    recipe = (recipe or current_recipe()).fitted(description)
    addresses = description.addresses[gpu]
    nvlink, nics = addresses.nvlink, addresses.nics
    if not nics:
        raise ValueError(f"GPU {gpu} has no NIC port")
    ports = [nvlink, *nics]

    links: list[Argv] = [["ip", "link", "set", "dev", "lo", "up"]]
    for port in ports:
        links.append(["ip", "link", "set", "dev", port.intf, "address", port.mac])
        gso = str(recipe.segments)
        links.append(["ip", "link", "set", "dev", port.intf, "gso_max_segs", gso])
        links.append(["ip", "link", "set", "dev", port.intf, "mtu", str(recipe.mtu)])
    for port in ports:
        links.append(["ip", "link", "set", "dev", port.intf, "up"])

    address_cmds = [
        ["ip", "addr", "replace", f"{port.ip}/{port.prefixlen}", "dev", port.intf] for port in ports
    ]
    neighbours = [
        [
            "ip",
            "neigh",
            "replace",
            GATEWAY_IP,
            "lladdr",
            GATEWAY_MAC,
            "dev",
            nic.intf,
            "nud",
            "permanent",
        ]
        for nic in nics
    ]
    # `src` before the nexthops: ip(8) reads everything after `nexthop` as nexthop options.
    congctl = ["congctl", TCP_CONGESTION_CONTROL]
    fabric_route = ["ip", "route", "replace", FABRIC_PREFIX, "src", addresses.fabric_ip, *congctl]
    if len(nics) == 1:
        fabric_route += ["via", GATEWAY_IP, "dev", nics[0].intf, "onlink"]
    else:
        for nic in nics:
            fabric_route += ["nexthop", "via", GATEWAY_IP, "dev", nic.intf, "onlink"]
    # The kernel's connected route of the NVLink subnet, replaced to carry the congctl.
    nvlink_subnet = ip_interface(f"{nvlink.ip}/{nvlink.prefixlen}").network
    nvlink_route = ["ip", "route", "replace", str(nvlink_subnet), "dev", nvlink.intf]
    nvlink_route += ["proto", "kernel", "scope", "link", "src", nvlink.ip, *congctl]
    routes = [fabric_route, nvlink_route]
    forwarding = description.fabric.gpu_forwarding
    if forwarding:
        routes += _rail_routes(description, addresses)
        routes += _forwarding_rules(addresses, congctl)

    rates = _link_rates(description, gpu)
    # host_side: the GPU's own egress is its NIC (or NVLink port), which backpressures
    # instead of dropping (orchestrator.emulation.shaping explains the recipe).
    shaping = [
        argv
        for port in ports
        for argv in shaping_commands(port.intf, rates[port.port], recipe.shaping, host_side=True)
    ]

    return HostConfig(
        gpu=gpu,
        sysctls=tuple(_sysctls(addresses, forwarding, recipe.segments)),
        links=tuple(links),
        addresses=tuple(address_cmds),
        neighbours=tuple(neighbours),
        routes=tuple(routes),
        shaping=tuple(shaping),
        interfaces=tuple(port.intf for port in ports),
    )


def render_all(
    description: FabricDescription, recipe: EmulatorRecipe | None = None
) -> dict[str, HostConfig]:
    """Host configurations of every GPU, by GPU name in rank order."""
    recipe = recipe or current_recipe()
    return {
        gpu.name: render_host_config(description, gpu.name, recipe)
        for gpu in description.fabric.gpus_by_rank()
    }
