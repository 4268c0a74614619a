"""Shortest routes between every two GPUs, found once per class of interchangeable ends.

:func:`topologies.properties.all_routes` searches the fabric from every GPU: GPUs x links,
52 s for 2,048 GPUs, out of reach for the 524,288 of a full-size Astral fabric. A
:class:`RouteTable` gives the same :class:`~topologies.properties.Route` for every pair
from a few searches on a much smaller graph, exactly, by two facts:

- **Ends and the transit graph.** A route between GPUs leaves its source by one of the
  source's *ends* (the switches its NIC ports reach; where GPUs forward, its server's
  NVLink switch too) and arrives by one of the destination's ends. In between it crosses
  the *transit graph*: the switches on network paths (NVLink switches only where GPUs
  forward, as :mod:`topologies.properties` defines paths), joined by their links (1 link
  each) and, where GPUs forward, by a GPU between a switch of its NIC and its NVLink switch
  (2 links and one GPU transit: the only turn a forwarding GPU makes).
- **Twins.** Nodes of the transit graph with the same neighbours (the two ToRs of a
  dual-ToR pair; all the ToRs of an Astral rail plane, which only the GPUs below tell
  apart; the cores of a group; the NVLink switches of a rail-only ToR group's servers) are
  interchangeable:
  swapping two of them maps the graph onto itself, and they are never adjacent. So the
  *quotient* has one node per class of twins, and a shortest path between two classes
  lifts to one between any of their members, crossing the same kinds of node.

How far a GPU's ends are from a node then depends only on the classes of the ends (with
how many ends fall in each: the GPU's *signature*), the node's class, and whether the node
is one of the ends (swapping twins moves both). One search per signature on the quotient,
each class of the ends split into the ends and the rest, gives the route from every GPU of
that signature to every GPU whose ends it does not share; two GPUs that share an end are 2
links apart across it. A full-size Astral fabric has one signature per rail plane: 64
searches on 8,384 classes instead of 524,288 searches on 544,768 nodes. Counting the
routes of all pairs (:meth:`RouteTable.census`) multiplies per pair of signatures, then
takes out the pairs of one server and the pairs that share an end, counted by server and
by ToR group: linear in the GPUs.

Ties: where a pair's shortest paths differ in what they cross, the route with the fewest
GPU transits, then NVLink switches, is the one given (a search from the source gives the
first it finds). tests/unit/test_topo_latency_scale.py holds every pair of small fabrics
of every kind to ``all_routes``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from topologies.model import Fabric, LinkKind, Tier
from topologies.properties import Route

#: a GPU's signature: (class, how many of the GPU's ends are in it), sorted by class
Signature = tuple[tuple[int, int], ...]
#: what a path costs, compared in this order: links, GPU transits, NVLink switches, network
#: switches (the module docstring's tie rule)
Cost = tuple[int, int, int, int]
#: a node of the quotient split for one search: (class, ENDS) the source's ends in the
#: class, (class, REST) the class's other members (or the whole class)
Part = tuple[int, int]
REST, ENDS = 0, 1
#: the route between two GPUs that share an end: GPU - switch - GPU
ACROSS_SWITCH = Route(switches=1)
ACROSS_NVLINK = Route(switches=0, nvlink_hops=1)


@dataclass(frozen=True)
class RouteCensus:
    """The ordered pairs of some GPUs, by how they are connected."""

    same_server: int  # pairs of GPUs of one server
    routes: Mapping[Route, int]  # pairs of GPUs of different servers, by route
    unreachable: int  # pairs of GPUs of different servers that no path joins


class RouteTable:
    """The shortest route between any two GPUs of ``fabric`` (module docstring).

    Built in time linear in the links; each signature's search runs the first time a
    route from it is asked for.
    """

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        near, via_gpu, nic_ends, nvlink_ends = _transit_graph(fabric)
        self._class: dict[str, int] = {}
        self._size: list[int] = []
        self._nvlink: list[bool] = []
        self._quotient: list[tuple[tuple[int, int], ...]] = []
        self._quotient_of(fabric, near, via_gpu, nic_ends, nvlink_ends)
        self._hubs: dict[str, frozenset[str]] = {}  # GPU -> its NVLink ends, where they count
        self._attachment: dict[str, int] = {}  # GPU -> id of the switches its NICs reach
        self._attachments: list[frozenset[str]] = []
        self._signature: dict[str, int] = {}  # GPU -> id of its signature
        self._signatures: list[Signature] = []
        self._classes_of: list[tuple[int, ...]] = []  # signature id -> its classes
        self._signatures_of(fabric, nic_ends, nvlink_ends)
        self._searches: dict[int, dict[Part, Cost]] = {}
        self._between: dict[tuple[int, int], Route | None] = {}
        self._sharing: dict[tuple[int, int], bool] = {}

    # --- the quotient and the signatures ---------------------------------------------------

    def _quotient_of(
        self,
        fabric: Fabric,
        near: Mapping[str, set[str]],
        via_gpu: Mapping[str, set[str]],
        nic_ends: Mapping[str, set[str]],
        nvlink_ends: Mapping[str, set[str]],
    ) -> None:
        nodes = set(near) | set(via_gpu)
        for ends in (nic_ends, nvlink_ends):
            for switches in ends.values():
                nodes |= switches
        classes: dict[tuple[bool, frozenset[str], frozenset[str]], int] = {}
        members: list[str] = []  # one member of each class
        for node in sorted(nodes):
            nvlink = fabric.switches[node].tier is Tier.NVLINK
            key = (nvlink, frozenset(near.get(node, ())), frozenset(via_gpu.get(node, ())))
            found = classes.get(key)
            if found is None:
                found = classes[key] = len(members)
                members.append(node)
                self._size.append(0)
                self._nvlink.append(nvlink)
            self._class[node] = found
            self._size[found] += 1
        for node in members:
            # Twins have the same neighbours, so one member's are its class's; a direct
            # link is shorter than a way through a GPU to the same class.
            weights = {self._class[n]: 2 for n in via_gpu.get(node, ())}
            weights.update({self._class[n]: 1 for n in near.get(node, ())})
            self._quotient.append(tuple(sorted(weights.items())))

    def _signatures_of(
        self,
        fabric: Fabric,
        nic_ends: Mapping[str, set[str]],
        nvlink_ends: Mapping[str, set[str]],
    ) -> None:
        attachments: dict[frozenset[str], int] = {}
        signatures: dict[Signature, int] = {}
        known: dict[tuple[int, frozenset[int]], int] = {}  # (attachment, hubs) -> signature
        nothing: frozenset[str] = frozenset()
        for gpu in fabric.gpus:
            nic = frozenset(nic_ends.get(gpu, nothing))
            attachment = attachments.get(nic)
            if attachment is None:
                attachment = attachments[nic] = len(self._attachments)
                self._attachments.append(nic)
            self._attachment[gpu] = attachment
            hubs = frozenset(nvlink_ends.get(gpu, nothing))
            if hubs:
                self._hubs[gpu] = hubs
            # GPUs of one attachment and NVLink switches of one class share a signature.
            key = (attachment, frozenset(self._class[h] for h in hubs))
            found = known.get(key)
            if found is None:
                ends = Counter(self._class[e] for e in nic | hubs)
                signature = tuple(sorted(ends.items()))
                found = signatures.get(signature)
                if found is None:
                    found = signatures[signature] = len(self._signatures)
                    self._signatures.append(signature)
                    self._classes_of.append(tuple(c for c, _ in signature))
                known[key] = found
            self._signature[gpu] = found

    # --- routes ----------------------------------------------------------------------------

    def route(self, src: str, dst: str) -> Route | None:
        """The shortest route from GPU ``src`` to GPU ``dst`` (two GPUs), None if none.

        The same as ``all_routes(fabric)[(src, dst)]``, pairs of one server included."""
        if src == dst:
            raise ValueError(f"a route needs two GPUs, not {src} twice")
        if self._share(self._attachment[src], self._attachment[dst]):
            return ACROSS_SWITCH  # the tie rule: a switch before an NVLink switch
        if src in self._hubs and self._hubs[src] & self._hubs.get(dst, frozenset()):
            return ACROSS_NVLINK
        return self._route_between(self._signature[src], self._signature[dst])

    def census(self, gpus: Iterable[str]) -> RouteCensus:
        """How the ordered pairs of ``gpus`` are connected, without visiting each pair:
        every pair by signatures, less the pairs that are not routed by them (a GPU with
        itself, GPUs of one server, GPUs that share an end)."""
        names = list(gpus)
        signature, attachment = self._signature, self._attachment
        count = Counter(signature[g] for g in names)
        routes: Counter[Route | None] = Counter()
        for a, n_a in count.items():
            for b, n_b in count.items():
                routes[self._route_between(a, b)] += n_a * n_b
        unrouted: Counter[tuple[int, int]] = Counter({(a, a): n for a, n in count.items()})
        across_switch = 0
        below: defaultdict[int, Counter[int]] = defaultdict(Counter)  # attachment -> signatures
        for g in names:
            below[attachment[g]][signature[g]] += 1
        for x, y in self._sharing_pairs(below):
            for a, n_a in below[x].items():
                for b, n_b in below[y].items():
                    pairs = n_a * n_b - (n_a if x == y and a == b else 0)
                    unrouted[(a, b)] += pairs
                    across_switch += pairs
        servers: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
        for g in names:
            servers[self.fabric.gpus[g].server].append((signature[g], attachment[g]))
        same_server = 0
        for members, times in Counter(tuple(sorted(m)) for m in servers.values()).items():
            for i, (a, x) in enumerate(members):
                for j, (b, y) in enumerate(members):
                    if i == j:
                        continue
                    same_server += times
                    if self._share(x, y):
                        across_switch -= times  # counted above, but one server's: NVLink
                    else:
                        unrouted[(a, b)] += times
        for (a, b), pairs in unrouted.items():
            routes[self._route_between(a, b)] -= pairs
        routes[ACROSS_SWITCH] += across_switch
        unreachable = routes.pop(None, 0)
        if unreachable < 0 or any(n < 0 for n in routes.values()):
            raise AssertionError("a pair was taken out of the census twice")
        return RouteCensus(
            same_server, {r: n for r, n in routes.items() if r is not None and n}, unreachable
        )

    def _route_between(self, a: int, b: int) -> Route | None:
        """The route from a GPU of signature ``a`` to one of signature ``b`` whose ends it
        does not share: the best of the destination's ends, plus the link into it."""
        key = (a, b)
        if key in self._between:
            return self._between[key]
        costs = self._search(a)
        best: Cost | None = None
        for c in self._classes_of[b]:
            cost = costs.get((c, REST))
            if cost is not None and (best is None or cost < best):
                best = cost
        route = None if best is None else Route(best[3], best[2], best[1])
        self._between[key] = route
        return route

    def _search(self, a: int) -> dict[Part, Cost]:
        """The cheapest path from the ends of a GPU of signature ``a`` to every part of the
        quotient: Dijkstra with a bucket per path length (edges are 1 or 2 links long, so
        no part is improved from its own bucket)."""
        found = self._searches.get(a)
        if found is not None:
            return found
        ends = dict(self._signatures[a])
        size, nvlinks, quotient = self._size, self._nvlink, self._quotient
        buckets: defaultdict[int, dict[Part, Cost]] = defaultdict(dict)
        for c in ends:
            buckets[1][(c, ENDS)] = (1, 0, int(nvlinks[c]), int(not nvlinks[c]))
        best: dict[Part, Cost] = {}
        links = 1
        while buckets:
            bucket = buckets.pop(links, None)
            links += 1
            if not bucket:
                continue
            for part, cost in bucket.items():
                if part in best:
                    continue
                best[part] = cost
                _, transits, via_nvlink, switches = cost
                for c, weight in quotient[part[0]]:
                    nvlink = nvlinks[c]
                    step = (
                        cost[0] + weight,
                        transits + (weight == 2),
                        via_nvlink + nvlink,
                        switches + (not nvlink),
                    )
                    later = buckets[step[0]]
                    in_ends = ends.get(c, 0)
                    targets = ((c, ENDS), (c, REST)) if in_ends else ((c, REST),)
                    for target in targets:
                        if target[1] == REST and size[c] <= in_ends:
                            continue  # every member is an end
                        if target not in best and (target not in later or step < later[target]):
                            later[target] = step
        self._searches[a] = best
        return best

    # --- GPUs that share an end ------------------------------------------------------------

    def _share(self, x: int, y: int) -> bool:
        """Whether the NICs of attachments ``x`` and ``y`` reach a switch in common."""
        key = (x, y) if x <= y else (y, x)
        found = self._sharing.get(key)
        if found is None:
            found = self._sharing[key] = bool(self._attachments[x] & self._attachments[y])
        return found

    def _sharing_pairs(self, attachments: Iterable[int]) -> set[tuple[int, int]]:
        """The ordered pairs of ``attachments`` that share a switch (each with itself)."""
        by_switch: defaultdict[str, list[int]] = defaultdict(list)
        for x in attachments:
            for switch in self._attachments[x]:
                by_switch[switch].append(x)
        return {(x, y) for group in by_switch.values() for x in group for y in group}


def _transit_graph(
    fabric: Fabric,
) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """The transit graph (module docstring) as the switches one link apart and the
    switches a forwarding GPU joins, and every GPU's ends: the switches of its NIC links
    and, where GPUs forward, of its NVLink link."""
    gpus, forwarding = fabric.gpus, fabric.gpu_forwarding
    near: defaultdict[str, set[str]] = defaultdict(set)
    nic_ends: defaultdict[str, set[str]] = defaultdict(set)
    nvlink_ends: defaultdict[str, set[str]] = defaultdict(set)
    for link in fabric.links:
        nvlink = link.kind is LinkKind.NVLINK
        if nvlink and not forwarding:
            continue  # not a network path (topologies.properties)
        a, b = link.a, link.b
        if a in gpus or b in gpus:
            if a in gpus and b in gpus:
                raise ValueError(f"link {a} - {b} joins two GPUs, which no path model covers")
            gpu, switch = (a, b) if a in gpus else (b, a)
            (nvlink_ends if nvlink else nic_ends)[gpu].add(switch)
        else:
            near[a].add(b)
            near[b].add(a)
    via_gpu: defaultdict[str, set[str]] = defaultdict(set)
    if forwarding:
        # A forwarding GPU turns only NVLink <-> NIC: it joins each switch of its NIC links
        # to its NVLink switch, and nothing else.
        for gpu, hubs in nvlink_ends.items():
            for up in nic_ends.get(gpu, ()):
                for hub in hubs:
                    via_gpu[up].add(hub)
                    via_gpu[hub].add(up)
    return near, via_gpu, nic_ends, nvlink_ends
