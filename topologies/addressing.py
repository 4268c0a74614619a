"""The one addressing plan: (rail, pod, server, GPU) -> addresses. Computed here, read everywhere.

The emulation applies it to the hosts, the controller routes on it, the workers connect to
it; none of them derives an address on its own (they read the generated fabric description,
``topologies.description``).

Plan (IPv4, all inside the project's own namespaces)::

    fabric address of a GPU      10.<rail>.<pod>.<server+1>/32   one per GPU, on every NIC port
    NVLink address of a GPU      10.<128+pod>.<server>.<gpu+1>/24 on port 0 (eth0), the
                                                                 server's NVLink subnet
    NIC port MAC                 02:a5:<pod>:<server>:<gpu>:<port>   (hex)
    NVLink port MAC              02:a5:<pod>:<server>:<gpu>:00
    fabric gateway               10.255.255.254, MAC 02:a5:ff:ff:ff:fe (virtual: answered by
                                 a static neighbour entry on the GPU, never by ARP)

Why the rail is the second octet: traffic that stays on its rail plane (Astral's same-rail
pattern) is exactly the traffic to ``10.<own rail>.0.0/16``; rail-only fabrics and PXN route
the other rails' /16s through the NVLink peer of that rail with one route per rail.

Every GPU sends fabric traffic to the gateway over a multipath route across its NIC ports
(dual-ToR uses both; a port whose link is down drops out), and the controller's switches
route on the destination address, rewriting the destination MAC on the last hop.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from topologies.errors import FabricSpecError
from topologies.model import Fabric, LinkKind

GATEWAY_IP = "10.255.255.254"
GATEWAY_MAC = "02:a5:ff:ff:ff:fe"
FABRIC_PREFIX = "10.0.0.0/9"  # rails 0..127
NVLINK_BASE = 128

MAX_RAILS = 128
MAX_PODS = 127
MAX_SERVERS = 254


@dataclass(frozen=True)
class PortAddress:
    """One GPU interface: its port number, Mininet interface name, MAC and address."""

    port: int
    intf: str
    mac: str
    ip: str  # without prefix length
    prefixlen: int
    peer: str  # the switch at the other end
    peer_port: int


@dataclass(frozen=True)
class GpuAddresses:
    gpu: str
    rank: int
    rail: int
    pod: int
    server: str
    server_index: int
    fabric_ip: str
    nvlink: PortAddress
    nics: tuple[PortAddress, ...]

    def rail_prefix(self) -> str:
        return f"10.{self.rail}.0.0/16"


def _mac(*octets: int) -> str:
    return "02:a5:" + ":".join(f"{o:02x}" for o in octets)


def fabric_ip(rail: int, pod: int, server_index: int) -> str:
    return f"10.{rail}.{pod}.{server_index + 1}"


def rail_of_ip(ip: str) -> int:
    """The rail a fabric address belongs to (its second octet)."""
    return int(ipaddress.IPv4Address(ip).packed[1])


def check_addressable(fabric: Fabric) -> None:
    """Raise if the fabric is too large for this plan (emulated fabrics are small)."""
    spec = fabric.spec
    servers = max((s.index for s in fabric.servers.values()), default=0) + 1
    for key, value, limit in (
        ("gpus_per_server", spec.rails, MAX_RAILS),
        ("pods", spec.pods, MAX_PODS),
        ("servers_per_pod", servers, MAX_SERVERS),
    ):
        if value > limit:
            raise FabricSpecError(
                spec.source, key, f"at most {limit} to be emulated (addressing plan)", value
            )


def address_plan(fabric: Fabric) -> dict[str, GpuAddresses]:
    """Addresses for every GPU of ``fabric``, keyed by GPU name."""
    check_addressable(fabric)
    plan: dict[str, GpuAddresses] = {}
    for gpu in fabric.gpus_by_rank():
        server = fabric.servers[gpu.server]
        ip = fabric_ip(gpu.rail, gpu.pod, server.index)
        nv_link = next(link for link in fabric.links_of(gpu.name) if link.kind is LinkKind.NVLINK)
        nvlink = PortAddress(
            port=0,
            intf=f"{gpu.name}-eth0",
            mac=_mac(gpu.pod, server.index, gpu.local_rank, 0),
            ip=f"10.{NVLINK_BASE + gpu.pod}.{server.index}.{gpu.local_rank + 1}",
            prefixlen=24,
            peer=nv_link.other(gpu.name),
            peer_port=nv_link.port_of(nv_link.other(gpu.name)),
        )
        nics = tuple(
            PortAddress(
                port=link.port_of(gpu.name),
                intf=f"{gpu.name}-eth{link.port_of(gpu.name)}",
                mac=_mac(gpu.pod, server.index, gpu.local_rank, link.port_of(gpu.name)),
                ip=ip,
                prefixlen=32,
                peer=link.other(gpu.name),
                peer_port=link.port_of(link.other(gpu.name)),
            )
            for link in fabric.nic_links(gpu.name)
        )
        plan[gpu.name] = GpuAddresses(
            gpu=gpu.name,
            rank=gpu.rank,
            rail=gpu.rail,
            pod=gpu.pod,
            server=gpu.server,
            server_index=server.index,
            fabric_ip=ip,
            nvlink=nvlink,
            nics=nics,
        )
    return plan
