"""The fabric model every generator produces and everyone else reads.

A :class:`Fabric` is a graph of names: switches (by tier), GPUs, servers and links with
capacities in real bit/s. It knows nothing of Mininet or OpenFlow; the emulation turns it
into namespaces and bridges, the controller into flow tables (docs/architecture.md: spec
apart from builder).

Naming (short, because Linux interface names are at most 15 characters and Mininet names
interfaces ``<node>-eth<port>``):

    GPU            p<pod>s<server>g<gpu>     p0s1g3   (gpu index = rail)
    NVLink switch  p<pod>s<server>nv         p0s1nv   (one per server)
    ToR / leaf     p<pod>r<rail>t<i>         p0r3t1   (rail fabrics)   p<pod>t<i> (fat-tree)
    Aggregation    p<pod>r<rail>a<i>         p0r3a0   (astral)         p<pod>a<i> (fat-tree)
    Spine          r<rail>s<i> / s<i>        spine of a rail-optimized fabric (tier "agg")
    Core           c<i>

Ports: every node numbers its ports from 1 in the order links are added by the generator,
which adds them tier by tier, bottom up, in sorted name order, so numbering is stable. A
GPU's port 0 is its NVLink port (``p0s1g3-eth0``), ports 1..nic_ports are its NIC ports
(``-eth1`` to the first ToR, ``-eth2`` to the dual-ToR partner). A switch's downlinks get
lower numbers than its uplinks.

Datapath ids are assigned in sorted order of (tier rank, name), starting at 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from topologies.fabricspec import FabricSpec


class Tier(str, Enum):
    """Switch tiers, bottom up. Fat-tree edge = TOR, rail-optimized spine = AGG."""

    NVLINK = "nvlink"
    TOR = "tor"
    AGG = "agg"
    CORE = "core"

    @property
    def rank(self) -> int:
        return list(Tier).index(self)


class LinkKind(str, Enum):
    """Which tier a link belongs to; capacities and shaping are per kind."""

    NVLINK = "nvlink"  # GPU <-> its server's NVLink switch
    NIC = "nic"  # GPU NIC port <-> ToR
    TOR_AGG = "tor_agg"
    AGG_CORE = "agg_core"


@dataclass(frozen=True)
class Switch:
    name: str
    tier: Tier
    dpid: int
    pod: int | None = None  # None for switches shared by all pods (core, rail-optimized spine)
    rail: int | None = None  # None for switches shared by all rails
    index: int = 0  # position within its (tier, pod, rail) group


@dataclass(frozen=True)
class Gpu:
    name: str
    rank: int  # global index, 0..n-1, in (pod, server, gpu) order
    pod: int
    server: str
    local_rank: int  # index inside the server = its rail

    @property
    def rail(self) -> int:
        return self.local_rank


@dataclass(frozen=True)
class Server:
    name: str  # p<pod>s<server>
    pod: int
    index: int  # within its pod
    gpus: tuple[str, ...]
    nvswitch: str


@dataclass(frozen=True)
class Link:
    """A bidirectional link. ``capacity`` is the real rate in bit/s (per direction)."""

    a: str
    a_port: int
    b: str
    b_port: int
    kind: LinkKind
    capacity: float

    def other(self, node: str) -> str:
        return self.b if node == self.a else self.a

    def port_of(self, node: str) -> int:
        return self.a_port if node == self.a else self.b_port


@dataclass
class Fabric:
    """A generated fabric. Build it with :class:`FabricBuilder`, then treat it as read-only."""

    spec: FabricSpec
    switches: dict[str, Switch] = field(default_factory=dict)
    gpus: dict[str, Gpu] = field(default_factory=dict)
    servers: dict[str, Server] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    # True where GPUs forward traffic for other GPUs of their server (rail-only fabrics).
    gpu_forwarding: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    def switches_in(self, tier: Tier) -> list[Switch]:
        return sorted((s for s in self.switches.values() if s.tier is tier), key=lambda s: s.name)

    def gpus_by_rank(self) -> list[Gpu]:
        return sorted(self.gpus.values(), key=lambda g: g.rank)

    def links_of(self, node: str) -> list[Link]:
        return [link for link in self.links if node in (link.a, link.b)]

    def links_between(self, a: str, b: str) -> list[Link]:
        """Every link joining ``a`` and ``b``: more than one where a generated fabric has
        parallel links between two switches (one name, several ports)."""
        return [link for link in self.links_of(a) if link.other(a) == b]

    def links_of_kind(self, kind: LinkKind) -> list[Link]:
        return [link for link in self.links if link.kind is kind]

    def nic_links(self, gpu: str) -> list[Link]:
        """The GPU's NIC links in port order (port 1 first)."""
        return sorted(
            (link for link in self.links_of(gpu) if link.kind is LinkKind.NIC),
            key=lambda link: link.port_of(gpu),
        )

    def wire_source(self, src: str, dst: str) -> str:
        """The GPU whose NIC a connection from GPU ``src`` to GPU ``dst`` leaves by.

        ``src`` itself, except on a fabric whose GPUs forward between rails (rail-only):
        there a rail's network reaches only that rail, so a connection to another rail
        crosses NVLink to the server-mate on ``dst``'s rail first, and that mate's NIC
        (its kernel's route, or the source port the orchestrator chose for it) carries it
        on. The emulated hosts route this way (orchestrator/emulation/hostconfig.py), the
        orchestrator pins such connections at the mate, and the forecast routes them so."""
        if not self.gpu_forwarding:
            return src
        a, b = self.gpus[src], self.gpus[dst]
        if a.server == b.server or a.rail == b.rail:
            return src
        for mate in self.servers[a.server].gpus:
            if self.gpus[mate].rail == b.rail:
                return mate
        return src

    def nodes(self) -> Iterator[str]:
        yield from self.switches
        yield from self.gpus


class FabricBuilder:
    """Accumulates switches, GPUs and links, numbering ports and datapath ids stably.

    Generators call :meth:`add_switch`, :meth:`add_server` and :meth:`connect`, bottom-up,
    in sorted order, then :meth:`build`.
    """

    def __init__(self, spec: FabricSpec) -> None:
        self.spec = spec
        self._switches: dict[str, tuple[Tier, int | None, int | None, int]] = {}
        self._gpus: dict[str, Gpu] = {}
        self._servers: dict[str, Server] = {}
        self._links: list[Link] = []
        self._next_port: dict[str, int] = {}
        self.gpu_forwarding = False

    def add_switch(
        self,
        name: str,
        tier: Tier,
        pod: int | None = None,
        rail: int | None = None,
        index: int = 0,
    ) -> str:
        if name in self._switches or name in self._gpus:
            raise ValueError(f"duplicate node name {name}")
        self._switches[name] = (tier, pod, rail, index)
        self._next_port[name] = 1
        return name

    def add_server(self, pod: int, index: int) -> Server:
        """Add a server with ``gpus_per_server`` GPUs and its NVLink switch, linked up."""
        name = f"p{pod}s{index}"
        nvswitch = self.add_switch(f"{name}nv", Tier.NVLINK, pod=pod, index=index)
        gpus = []
        for local in range(self.spec.gpus_per_server):
            gpu = Gpu(
                name=f"{name}g{local}",
                rank=len(self._gpus),
                pod=pod,
                server=name,
                local_rank=local,
            )
            self._gpus[gpu.name] = gpu
            self._next_port[gpu.name] = 1
            gpus.append(gpu.name)
            # GPU port 0 is its NVLink port, by convention.
            self._links.append(
                Link(
                    gpu.name,
                    0,
                    nvswitch,
                    self._take_port(nvswitch),
                    LinkKind.NVLINK,
                    self.spec.speeds.nvlink,
                )
            )
        server = Server(name, pod, index, tuple(gpus), nvswitch)
        self._servers[name] = server
        return server

    def connect(self, a: str, b: str, kind: LinkKind, capacity: float) -> Link:
        link = Link(a, self._take_port(a), b, self._take_port(b), kind, capacity)
        self._links.append(link)
        return link

    def _take_port(self, node: str) -> int:
        port = self._next_port[node]
        self._next_port[node] = port + 1
        return port

    def build(self) -> Fabric:
        ordered = sorted(self._switches.items(), key=lambda item: (item[1][0].rank, item[0]))
        switches = {
            name: Switch(name, tier, dpid, pod, rail, index)
            for dpid, (name, (tier, pod, rail, index)) in enumerate(ordered, start=1)
        }
        return Fabric(
            spec=self.spec,
            switches=switches,
            gpus=dict(self._gpus),
            servers=dict(self._servers),
            links=list(self._links),
            gpu_forwarding=self.gpu_forwarding,
        )


def all_names(fabric: Fabric) -> Iterable[str]:
    """Every node name, switches first, for checks that names fit interface limits."""
    return list(fabric.nodes())
