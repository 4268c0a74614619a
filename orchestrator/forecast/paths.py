"""Where each connection of a collective goes: the policy's own path choice, as data.

Nothing here has a routing model of its own. A forecast asks the same code a run does:

- the NIC port a connection leaves by is the experiment's ``host_ports`` setting, carried
  out by the orchestrator's own functions (orchestrator/testbed/pinning.py): ``balanced``
  spreads each rank's connections of a collective over its NIC ports
  (:func:`~orchestrator.testbed.pinning.balance_nics`); ``hash`` is the kernel's hash, which
  nothing predicts, so it is drawn per connection from the salt;
- under a policy that pins source ports (path-pinned), the path is the one
  :func:`~orchestrator.testbed.pinning.assign` chooses among the paths the policy
  publishes (``policy.publish``), and the connection's source port is the one whose bits
  select it (``PortLayout.source_port``);
- then the packet is followed hop by hop through the flow tables the policy renders
  (``policy.render``, the plan the controller installs) by the controller's own tracer
  (controllers/tracer.py). A select group (ECMP) hashes the five-tuple in Open vSwitch with
  its ``hash`` selection method, a function of the five-tuple, the group's basis and its
  bucket ids only, which controllers/ovshash.py computes as the switch does (checked
  against the switches' own traces: docs/forecast.md, "ECMP's hash, reproduced"). What is
  left unknown until a run is drawn per salt: the source port where a run asks a GPU's
  kernel for one (two NIC ports or more under ``balanced``: the first of the flow's
  candidate ports that the kernel's seeded multipath hash sends out of the chosen port;
  an ephemeral port under ``hash``; a forwarded connection's on rail-only), and the bucket
  of a group hashed some other way (``dp_hash``), by rendezvous hashing of (salt, the
  group's basis, the connection, the bucket id). On a fabric of one NIC port per GPU under
  ``balanced`` ECMP has one outcome, computed, and no draws.

A path is the list of nodes ``[src GPU, ToR, ..., dst GPU]``; peers on one server talk over
NVLink (``[src GPU, NVLink switch, dst GPU]``). On fabrics whose GPUs forward between rails
(rail-only), a connection to another rail first crosses NVLink to the server-mate on the
destination's rail, which sends it on: its NIC port is chosen among that mate's, and under
path-pinned its path among those published from the mate, as a run chooses them
(:func:`~orchestrator.testbed.pinning.senders`).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controllers.ovshash import pick, reproducible
from controllers.pinning import PortLayout
from controllers.plan import Bucket, FlowEntry, ForwardingPlan, GroupEntry, Packet
from controllers.policies import Policy
from controllers.policies import default_registry as policy_registry
from controllers.routing import RoutingError
from controllers.tracer import follow_hops
from orchestrator.testbed.hostports import BALANCED, check_host_ports
from orchestrator.testbed.pinning import (
    CANDIDATES,
    EPHEMERAL,
    PORT_BASE,
    Candidate,
    Flow,
    assign,
    balance_nics,
    candidates,
    senders,
)
from orchestrator.worker.spec import WORKER_PORT, WorkerSpec
from topologies.description import FabricDescription
from topologies.errors import AstralError
from topologies.model import Link

#: a directed link told apart from its parallel twins: from, to, the port it leaves by
Lane = tuple[str, str, int]


@dataclass
class Routed:
    """The path of every connection of one collective under one policy and one salt;
    ``lanes``: where a select group chose among parallel links (two switches joined by
    several), which one each connection takes."""

    paths: dict[Flow, tuple[str, ...]] = field(default_factory=dict)
    source_ports: dict[Flow, int] = field(default_factory=dict)
    lanes: dict[Flow, tuple[Lane, ...]] = field(default_factory=dict)


class IndexedPlan(ForwardingPlan):
    """A rendered plan whose packet lookup goes straight to the entries for the packet's
    destination (every entry names one), instead of scanning the switch's whole table:
    the same answer as :meth:`ForwardingPlan.lookup_packet`, fast enough to follow every
    connection of an all-to-all through a 64-GPU fabric's plan."""

    @classmethod
    def of(cls, plan: ForwardingPlan) -> IndexedPlan:
        indexed = cls(plan.policy, plan.tables, plan.failed_links, plan.extra)
        by_dst: dict[tuple[int, str], list[FlowEntry]] = {}
        for dpid, table in plan.tables.items():
            for entry in table.flows:
                by_dst.setdefault((dpid, entry.ipv4_dst), []).append(entry)
        object.__setattr__(indexed, "_by_dst", by_dst)
        return indexed

    def lookup_packet(
        self, dpid: int, packet: Packet, in_port: int | None = None
    ) -> FlowEntry | None:
        by_dst: dict[tuple[int, str], list[FlowEntry]] = object.__getattribute__(self, "_by_dst")
        best: FlowEntry | None = None
        for entry in by_dst.get((dpid, packet.ipv4_dst), ()):
            if entry.matches(packet, in_port) and (best is None or entry.priority > best.priority):
                best = entry
        return best


def _score(*parts: object) -> int:
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class PolicyRouter:
    """One policy's paths on one fabric (its plan rendered once, with ``failed`` down)."""

    def __init__(
        self,
        description: FabricDescription,
        policy: str,
        failed: frozenset[Link] = frozenset(),
    ) -> None:
        self.description = description
        self.policy_name = policy
        registry = policy_registry()
        self.policy: Policy = registry.create(policy)
        self.pins = registry.get(policy.split(":")[0]).pins_source_ports
        self.failed = failed
        publish = getattr(self.policy, "publish", None)
        try:
            self.plan: ForwardingPlan = IndexedPlan.of(self.policy.render(description, failed))
            self.published = publish(description, failed) if self.pins and publish else None
        except Exception as error:
            raise AstralError(
                f"policy {policy} cannot route fabric {description.fabric.name}, so there is "
                f"nothing to forecast ({type(error).__name__}: {error})"
            ) from error
        self._options = candidates(self.published) if self.published else None
        select = [g for g in self.plan.groups() if g.type.value == "select" and len(g.buckets) > 1]
        # Open vSwitch's choice in a select group hashing the five-tuple is computed
        # (controllers.ovshash); what stays unknown until a run is the source port where the
        # orchestrator asked a GPU's kernel for it (two NIC ports or more: the kernel's
        # multipath hash has a random seed per boot), a forwarded connection's (rail-only),
        # and a group hashed some other way: those are drawn per salt
        fabric = description.fabric
        #: every select group's choice computed from the five-tuple (no group hashed some
        #: other way): a connection's source port and NIC port then decide its path
        self.reproduced = all(reproducible(g) for g in select)
        multiport = any(len(a.nics) > 1 for a in description.addresses.values())
        self.hashed = bool(select) and (not self.reproduced or multiport or fabric.gpu_forwarding)
        self._follow_cache: dict[tuple[Any, ...], tuple[str, ...]] = {}
        self._lanes_cache: dict[tuple[Any, ...], tuple[Lane, ...]] = {}

    def route(
        self,
        workers: Sequence[WorkerSpec],
        groups: Sequence[Sequence[Flow]],
        host_ports: str,
        salt: int = 0,
    ) -> Routed:
        """The path of every flow of ``groups`` (one group per collective, in run order)."""
        check_host_ports(host_ports)
        fabric = self.description.fabric
        host = {w.rank: w.host for w in workers}
        flows = list(dict.fromkeys(f for group in groups for f in group))
        # the GPU whose NIC a flow leaves by: its source, or a rail-only server-mate
        sender = senders(self.description, workers, flows)
        wire = {f: sender.get(f, host[f[0]]) for f in flows}
        live = {f: set(self._nic_ports(wire[f])) for f in flows}
        if self._options is not None:
            for f in flows:
                live[f] &= {c.nic for c in self._options.get((wire[f], host[f[1]]), ())}
        if host_ports == BALANCED:
            nic = balance_nics(groups, workers, self.description, live, sender)
        else:
            rng = random.Random(_score("nic", salt))
            nic = {f: rng.choice(sorted(live[f])) for f in flows if live[f]}
        routed = Routed()
        chosen: dict[Flow, Candidate] = {}
        if self._options is not None:
            allowed = {f: {n} for f, n in nic.items()}
            chosen = assign(groups, workers, self._options, allowed, sender)
        index: dict[int, int] = {}
        for f in flows:
            src, dst = host[f[0]], host[f[1]]
            if fabric.gpus[src].server == fabric.gpus[dst].server:
                routed.paths[f] = (src, fabric.servers[fabric.gpus[src].server].nvswitch, dst)
                continue
            if f not in nic:
                raise RoutingError(f"{src} has no live NIC port towards {dst}")
            start = wire[f]
            j = index.get(f[0], 0)
            index[f[0]] = j + 1
            if f in chosen:
                layout = self._layout()
                port = layout.source_port(chosen[f].value, j % 64)
            else:
                port = self._source_port(f, j, len(live[f]), host_ports, start != src, salt)
            routed.source_ports[f] = port
            routed.paths[f] = self._wired(src, start, dst, nic[f], port, salt)
            self._lane(routed, f, start, dst, nic[f], port, salt)
        return routed

    def planned(
        self,
        workers: Sequence[WorkerSpec],
        ports: Mapping[Flow, int],
        nics: Mapping[Flow, int],
    ) -> Routed:
        """The paths of the fabric flows a run planned a source port and a NIC port for
        (orchestrator/testbed/pinning.py ``Pinning``), followed through the policy's plan
        with those ports: what a run that takes them will find, where every select group
        hashes the five-tuple (:attr:`reproduced`; otherwise nothing, the draws stay)."""
        routed = Routed()
        if not self.reproduced:
            return routed
        host = {w.rank: w.host for w in workers}
        flows = [f for f in ports if f in nics]
        sender = senders(self.description, workers, flows)
        for f in flows:
            src, dst = host[f[0]], host[f[1]]
            start = sender.get(f, src)
            routed.paths[f] = self._wired(src, start, dst, nics[f], ports[f], 0)
            routed.source_ports[f] = ports[f]
            self._lane(routed, f, start, dst, nics[f], ports[f], 0)
        return routed

    # --- helpers ---------------------------------------------------------------------------

    def _wired(
        self, src: str, start: str, dst: str, nic: int, port: int, salt: int
    ) -> tuple[str, ...]:
        """The path of a connection from ``src`` that leaves by ``start``'s NIC port ``nic``
        with source ``port``: on rail-only, over NVLink to the server-mate first."""
        path = self._follow(start, dst, nic, port, salt)
        if start == src:
            return path
        fabric = self.description.fabric
        return (src, fabric.servers[fabric.gpus[src].server].nvswitch, *path)

    def _lane(
        self, routed: Routed, f: Flow, start: str, dst: str, nic: int, port: int, salt: int
    ) -> None:
        """Keep the parallel links the flow's path took (:meth:`_follow` found them)."""
        lanes = self._lanes_cache.get(self._key(start, dst, nic, port, salt))
        if lanes:
            routed.lanes[f] = lanes

    def _source_port(
        self, f: Flow, j: int, nics: int, host_ports: str, forwarded: bool, salt: int
    ) -> int:
        """The source port of the rank's ``j``-th unpinned fabric flow, as a run picks it
        (orchestrator/testbed/pinning.py): under ``balanced`` the first of its
        :data:`CANDIDATES` ports (``PORT_BASE + j * CANDIDATES`` on) that the kernel routes
        out of the chosen NIC port. With one NIC port that is the first, as a run takes
        it; with more, each candidate matches with probability 1/ports by the kernel's
        seeded hash, so the offset is drawn per salt, as is a forwarded connection's
        (from its mate's NIC range) and an ephemeral port under ``hash``."""
        first = PORT_BASE + (j * CANDIDATES) % (65535 - PORT_BASE)
        if not self.hashed or (nics <= 1 and not forwarded and host_ports == BALANCED):
            return first
        rng = random.Random(_score("port", salt, f))
        if host_ports != BALANCED:
            return rng.randint(*EPHEMERAL)
        offset = 0
        while offset < CANDIDATES - 1 and rng.random() >= 1.0 / max(1, nics):
            offset += 1
        return first + offset

    def _layout(self) -> PortLayout:
        assert self.published is not None
        return PortLayout.from_dict(self.published["layout"])

    def _nic_ports(self, gpu: str) -> list[int]:
        down = {(x.a, x.a_port) for x in self.failed} | {(x.b, x.b_port) for x in self.failed}
        return [n.port for n in self.description.addresses[gpu].nics if (gpu, n.port) not in down]

    def _key(self, src: str, dst: str, nic: int, port: int, salt: int) -> tuple[Any, ...]:
        return (src, dst, nic, port, salt if self.hashed else 0)

    def _follow(self, src: str, dst: str, nic: int, port: int, salt: int) -> tuple[str, ...]:
        key = self._key(src, dst, nic, port, salt)
        if key in self._follow_cache:
            return self._follow_cache[key]
        addresses = self.description.addresses
        tor = next(n.peer for n in addresses[src].nics if n.port == nic)
        packet = Packet.tcp(addresses[src].fabric_ip, addresses[dst].fabric_ip, port, WORKER_PORT)

        def choose(switch: str, group: GroupEntry, live: list[Bucket]) -> Bucket:
            # Open vSwitch's own choice where it is reproduced, else a draw by the salt
            exact = pick(group, live, packet)
            if exact is None:
                ids = group.bucket_ids()
                basis = group.selection.basis if group.selection else 0
                by_bucket = dict(zip(group.buckets, ids, strict=True))
                exact = max(live, key=lambda b: _score(salt, basis, key, by_bucket[b]))
            return exact

        hops = follow_hops(self.description, self.plan, tor, packet, choose=choose)
        path = (src, *(node for node, _ in hops))
        self._follow_cache[key] = path
        self._lanes_cache[key] = self._twins(hops)
        return path

    def _twins(self, hops: Sequence[tuple[str, int | None]]) -> tuple[Lane, ...]:
        """The lanes a path took where two switches are joined by several links (parallel
        twins; elsewhere the node pair names the link): whichever entry chose it, a select
        group's bucket (ECMP) or a rule matching the source port's bits (path-pinned). A
        connection crosses one of them, at that one's rate, not their sum (a path-pinned
        ring's connection across 4 parallel aggregation-core links was forecast at their
        summed rate, twice what the one it took carried: seed 49 run 21)."""
        fabric = self.description.fabric
        lanes = []
        for (a, _), (b, came_in) in itertools.pairwise(hops):
            if came_in is None or len(fabric.links_between(a, b)) < 2:
                continue
            link = next(x for x in fabric.links_of(b) if x.port_of(b) == came_in)
            lanes.append((a, b, link.port_of(a)))
        return tuple(lanes)
