"""Fault diagnosis against injected ground truth: a suite of faulty and healthy runs.

    sudo .venv/bin/python benchmarks/diagnosis.py [--seed 1] [--per-kind 4] [--healthy 10]
        [--kinds link-slow,...] [--fabrics astral-small,fat-tree-2pod]
        [--policies ecmp,path-pinned] [--out DIR] [--lock-wait 900] [--quick] [--json FILE]
    .venv/bin/python benchmarks/diagnosis.py --diagnose-only DIR     diagnose the bundles
                                                                     of a saved suite again

Generates a scenario suite from the fabric model (:func:`suite`): per fault kind
(``faults:`` of an experiment, docs/monitoring.md) ``--per-kind`` runs spread over the
fabrics, the policies and two onsets (``at: 0s`` and mid-run), plus ``--healthy`` runs
without a fault, of four shapes in turn (:data:`HEALTHY_SHAPES`): the fault runs' two, a
sweep of sizes from 64 KiB to 4 MiB of both (the default experiment's shape), and four
other collectives and algorithms in one run (:func:`shape_document`). Locations are drawn
with a seeded random generator from what the run's 8-rank ring actually crosses
(:func:`ring_usage`): the fabric connections between consecutive ranks (pairs on one server
ride NVLink), a NIC link of a sending GPU (with ``balanced`` host ports each rank's
connections use both its NIC ports), a ToR-aggregation or aggregation-core link on a
shortest path of such a pair, a first-hop ToR of a sending GPU or an aggregation switch on
such a path (switch-down, blackhole; a blackhole's destination is a GPU whose connection
crosses the switch), any GPU of the ring (straggler). Link tiers, switch tiers and GPUs
rotate over a kind's runs, so a suite of four runs per kind puts a link fault on every tier
a fabric has. ``--seed`` draws another suite.

Fabrics: ``astral-small`` (the preset: dual-ToR, three tiers) and ``fat-tree-2pod``, no
preset: a k = 4 fat-tree cut to 2 pods of 2 servers x 2 GPUs (one NIC port per GPU, 4 edge,
4 aggregation and 2 core switches), written as a fabric file into the suite's directory. A
preset's name or a fabric file works too. Each run is one ``astral run`` (a subprocess:
real emulation, the machine-wide lock taken by it, ``--lock-wait``); a fault run runs one
collective, ring all-reduce or direct all-to-all (alternating), 1 MiB (less on a fabric
with a slower tier: :func:`size_for`, so that an operation keeps its length), at the scale
of experiments/faults.yaml (0.6e-4, 12 Mbit/s per 200G port), with iterations for about 18
s of collectives (and a timed batch of at least 18 s by the warm-up's time per operation,
for a fabric whose operations are shorter than the estimate); every fault lasts 7 s (a GPU
with one NIC port cut off stalls the collective until it ends). Then
``orchestrator.diagnosis.diagnose_bundle`` on the bundle, in this process; the bundle's
``faults`` table is the ground truth (the diagnosis never reads it).

A suspect the diagnosis reports (scored at or above its threshold: what ``astral diagnose``
prints) matches an injection when component, target and fault match (:func:`matches`):
link names match by their two ends in either order, ``A>B`` and ``A-B`` alike. Printed: one
line per run, the confusion table (injected kind against the top suspect's fault; a
healthy verdict is ``healthy``), top-1 and top-3 accuracy per kind and over all, false
alarms on healthy runs, detection delay (a suspect's ``onset``, if it has one, minus the
fault's ``applied`` instant), time to localize (``Diagnosis.seconds``) and the machine's
conditions (cores, load average, the runs' emulator_load saturation flags). The machine is
shared and has 2 cores: durations and saturated runs vary with what else runs.

Layout of ``--out DIR`` (default: a temporary directory, kept): ``suite.json`` (the
scenarios), ``fabrics/`` (the fabric files), and per run ``runs/NNN-kind-fabric-policy/``
with ``experiment.yaml``, ``scenario.json``, ``astral-run.log``, ``bundle/`` (the results
bundle) and ``outcome.json``. ``--diagnose-only DIR`` reads exactly that (every run whose
bundle has a results.sqlite; runs a suite cut short did not reach are skipped), so the
diagnosis can be iterated on against a saved suite without emulating again.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from topologies.catalog import resolve_fabric
from topologies.generators import build_fabric
from topologies.model import Fabric, LinkKind, Tier
from topologies.spec import FabricSpec, load_fabric_spec

KINDS = (
    "link-slow",
    "link-down",
    "link-flap",
    "link-loss",
    "switch-down",
    "straggler",
    "blackhole",
    "controller-crash",
)
#: What the diagnosis calls each kind: (component, fault).
EXPECTED: dict[str, tuple[str, str]] = {
    "link-slow": ("link", "slow"),
    "link-down": ("link", "down"),
    "link-flap": ("link", "flapping"),
    "link-loss": ("link", "lossy"),
    "switch-down": ("switch", "down"),
    "straggler": ("gpu", "straggler"),
    "blackhole": ("switch", "blackhole"),
    "controller-crash": ("controller", "controller outage"),
}
FAULTS = ("down", "flapping", "slow", "lossy", "blackhole", "straggler", "controller outage")
HEALTHY = "healthy"

#: Non-preset fabrics, written into the suite's directory as fabric files.
INLINE_FABRICS: dict[str, dict[str, Any]] = {
    "fat-tree-2pod": {
        "name": "fat-tree-2pod",
        "kind": "fat-tree",
        "pods": 2,
        "servers_per_pod": 2,
        "gpus_per_server": 2,
        "nic_ports": 1,
        "switch": {"radix": 4, "down_ports": 2},
        "speeds": {"nic": "200G", "tor_agg": "200G", "agg_core": "200G", "nvlink": "3.6T"},
        "emulation": {"scale": 1.0e-4},
    },
}
DEFAULT_FABRICS = ("astral-small", "fat-tree-2pod")
DEFAULT_POLICIES = ("ecmp", "path-pinned")
COLLECTIVES = ("ring", "direct")  # all-reduce (ring), all-to-all (direct)
#: What a healthy run runs, in turn: the fault runs' two shapes, then two a user's own
#: experiment is more like (:func:`shape_document`). A false alarm that only a sweep of
#: sizes raised (queues full in bursts between operations) was found outside the suite.
HEALTHY_SHAPES = (*COLLECTIVES, "sweep", "mixed")
SWEEP_SIZES = {"min": "64K", "max": "4M", "factor": 4}
MIXED = (
    {"op": "all-reduce", "algorithm": "hierarchical"},
    {"op": "all-to-all", "algorithm": "shifted"},
    {"op": "all-gather", "algorithm": "ring"},
    {"op": "reduce-scatter", "algorithm": "ring"},
)
RANKS = 8
SIZE = 1 << 20
SCALE = 0.6e-4  # experiments/faults.yaml: 12 Mbit/s per 200G port
COLLECTIVE_SECONDS = 18.0  # aimed at: long enough for a 7 s fault and time around it
#: Seconds per 1 MiB iteration with 2 NIC ports per GPU, measured on the 2-core machine.
#: Healthy runs of the default suite took 24-26 s (ring, astral-small) and 17-21 s (direct);
#: on fat-tree-2pod (one port, half the iterations) 14 s (ring) and 15-16 s (direct).
SECONDS_PER_ITERATION = {"ring": 1.1, "direct": 0.7}
FAULT_SECONDS = 7.0
MID_RUN = 6.0  # the mid-run onset, s after the first timed collective
LINK_TIERS = (LinkKind.NIC, LinkKind.TOR_AGG, LinkKind.AGG_CORE)
SWITCH_TIERS = (Tier.TOR, Tier.AGG)
PARAMS: dict[str, dict[str, Any]] = {
    "link-slow": {"rate": 0.25},
    "link-flap": {"period": "2s"},
    "link-loss": {"probability": 0.03},
    "straggler": {"delay": "200ms"},
}
#: With ``--vary``: each fault run's magnitude drawn from these instead of :data:`PARAMS`
#: (a draw of its own, so that the suite's targets, onsets and shapes stay those of the
#: same seed without it). Acceptance injects faults of other strengths than the suite's,
#: and rules tuned on one strength must be measured on others; a magnitude whose fault
#: leaves the job untouched (a link slowed to half that no connection needed whole) is a
#: miss all the same.
VARIED: dict[str, dict[str, tuple[Any, ...]]] = {
    "link-slow": {"rate": (0.1, 0.25, 0.5)},
    "link-flap": {"period": ("1s", "2s", "4s")},
    "link-loss": {"probability": (0.01, 0.03, 0.1)},
    "straggler": {"delay": ("100ms", "200ms", "500ms")},
}


# --- the fabric model: what a ring crosses -----------------------------------------------


@dataclass
class Usage:
    """What the fabric connections of a ring over ``gpus`` (rank order) cross.

    ``links``: per tier, the directed links (from, to) in the direction data flows on a
    shortest path of some connection (NIC links only on the sending side, where the host
    picks the port and ``balanced`` uses both); ``switches``: per tier, the switches (ToRs
    only as a sender's first hop, which it certainly crosses); ``destinations``: per switch,
    the GPUs that connections crossing it go to; ``pairs``: the (src, dst) fabric pairs."""

    gpus: list[str]
    pairs: list[tuple[str, str]]
    links: dict[LinkKind, list[tuple[str, str]]] = field(default_factory=dict)
    switches: dict[Tier, list[str]] = field(default_factory=dict)
    destinations: dict[str, list[str]] = field(default_factory=dict)


def _network_adjacency(fabric: Fabric) -> dict[str, list[str]]:
    adj: dict[str, list[str]] = {}
    for link in fabric.links:
        if link.kind is LinkKind.NVLINK:
            continue
        adj.setdefault(link.a, []).append(link.b)
        adj.setdefault(link.b, []).append(link.a)
    return adj


def _distances(fabric: Fabric, adj: Mapping[str, list[str]], src: str) -> dict[str, int]:
    """Hops from ``src`` over network links, never through another GPU."""
    dist = {src: 0}
    queue = deque([src])
    while queue:
        node = queue.popleft()
        if node != src and node in fabric.gpus:
            continue
        for nxt in adj.get(node, ()):
            if nxt not in dist:
                dist[nxt] = dist[node] + 1
                queue.append(nxt)
    return dist


def shortest_path_links(fabric: Fabric, src: str, dst: str) -> set[tuple[str, str]]:
    """Every directed link (u, v) on some shortest network path from ``src`` to ``dst``."""
    adj = _network_adjacency(fabric)
    from_src = _distances(fabric, adj, src)
    to_dst = _distances(fabric, adj, dst)
    total = from_src.get(dst)
    if total is None:
        return set()
    on = set()
    for u, du in from_src.items():
        if u in fabric.gpus and u != src:
            continue
        for v in adj.get(u, ()):
            if v in to_dst and du + 1 + to_dst[v] == total:
                on.add((u, v))
    return on


def ring_pairs(fabric: Fabric, gpus: Sequence[str]) -> list[tuple[str, str]]:
    """(rank i, rank i+1) pairs of a ring over ``gpus`` that cross the network (GPUs of one
    server talk over NVLink)."""
    pairs = []
    for i, src in enumerate(gpus):
        dst = gpus[(i + 1) % len(gpus)]
        if fabric.gpus[src].server != fabric.gpus[dst].server:
            pairs.append((src, dst))
    return pairs


def _link_kind(fabric: Fabric, a: str, b: str) -> LinkKind:
    return next(x.kind for x in fabric.links if {x.a, x.b} == {a, b})


def ring_usage(fabric: Fabric, gpus: Sequence[str]) -> Usage:
    """What a ring over ``gpus`` crosses (:class:`Usage`)."""
    usage = Usage(list(gpus), ring_pairs(fabric, gpus))
    links: dict[LinkKind, set[tuple[str, str]]] = {kind: set() for kind in LINK_TIERS}
    switches: dict[Tier, set[str]] = {tier: set() for tier in SWITCH_TIERS}
    destinations: dict[str, set[str]] = {}
    for src, dst in usage.pairs:
        # a rail-only fabric's cross-rail pair leaves by the server-mate on dst's rail
        wire = fabric.wire_source(src, dst)
        for u, v in shortest_path_links(fabric, wire, dst):
            kind = _link_kind(fabric, u, v)
            if kind is LinkKind.NIC and u != wire:
                continue  # the receiving end's port is the switches' choice
            links[kind].add((u, v))
            for node in (u, v):
                switch = fabric.switches.get(node)
                if switch is None:
                    continue
                destinations.setdefault(node, set()).add(dst)
                if switch.tier is Tier.AGG or (switch.tier is Tier.TOR and u == wire):
                    switches[switch.tier].add(node)
    usage.links = {kind: sorted(found) for kind, found in links.items() if found}
    usage.switches = {tier: sorted(found) for tier, found in switches.items() if found}
    usage.destinations = {s: sorted(d) for s, d in sorted(destinations.items())}
    return usage


# --- scenarios ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One run of the suite: a fault (``kind`` None: healthy) on a fabric under a policy.

    ``target``: as the experiment writes it (``A-B``, ``A>B``, a switch, a GPU,
    ``controller``); ``tier``: where it sits (``nic``, ``tor_agg``, ``agg_core``, ``tor``,
    ``agg``, ``gpu``, ``controller``, ``-``); ``at``: s after the first timed collective."""

    index: int
    kind: str | None
    fabric: str
    policy: str
    collective: str
    target: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0
    duration: float = FAULT_SECONDS
    tier: str = "-"

    @property
    def name(self) -> str:
        return f"{self.index:03d}-{self.kind or HEALTHY}-{self.fabric}-{self.policy}"

    @property
    def onset(self) -> str:
        return "-" if self.kind is None else ("start" if self.at == 0 else "mid-run")

    def fault_entry(self) -> dict[str, Any] | None:
        """The entry of the experiment's ``faults:`` list (None when healthy)."""
        if self.kind is None:
            return None
        entry: dict[str, Any] = {"kind": self.kind}
        if self.kind != "controller-crash":
            entry["target"] = self.target
        entry |= self.params
        entry["at"] = f"{self.at:g}s"
        entry["duration"] = f"{self.duration:g}s"
        return entry

    def expected(self) -> tuple[str, str, str] | None:
        """(component, target, fault) the diagnosis should name; None when healthy."""
        if self.kind is None:
            return None
        component, fault = EXPECTED[self.kind]
        return component, self.target or "controller", fault

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scenario:
        return cls(**dict(data))


def iterations_for(spec: FabricSpec, collective: str) -> int:
    """Iterations for about :data:`COLLECTIVE_SECONDS` of collectives: 1 MiB takes about
    :data:`SECONDS_PER_ITERATION` with two 12 Mbit/s NIC ports per GPU, twice that with one
    (both collectives are bound by the GPU's NIC ports here). A lower bound: the
    experiment's ``min_batch`` lengthens a batch whose operations are shorter than this
    estimate (seed 27's 8-rank all-to-all of 512 KiB on a rail-optimized fabric took
    0.46 s, its 13 iterations 6 s, and a straggler from 6 s on delayed nothing)."""
    per_iteration = SECONDS_PER_ITERATION[collective] * 2 / spec.nic_ports
    return max(4, round(COLLECTIVE_SECONDS / per_iteration))


def size_for(spec: FabricSpec) -> int:
    """:data:`SIZE` scaled by the fabric's slowest network link against its NIC links
    (a 3:1 core: a third), in whole 64 KiB, at least 256 KiB: an operation whose ring
    crosses a slow core would take that many times longer, and a fault of
    :data:`FAULT_SECONDS` would cover one operation or none (seed 10's straggler on a
    3:1 core, 200 ms for 7 s, delayed one operation of 8 s), which no rule reading
    operations can tell from noise. Fabrics without a slower tier keep 1 MiB."""
    fabric = build_fabric(spec)
    network = [k for k in fabric.links if k.kind is not LinkKind.NVLINK]
    nic = max((k.capacity for k in network if k.kind is LinkKind.NIC), default=0.0)
    slowest = min((k.capacity for k in network), default=nic)
    if nic <= 0 or slowest >= nic:
        return SIZE
    step = 64 << 10
    return max(4 * step, int(SIZE * slowest / nic) // step * step)


def _rotation(rng: random.Random, options: Sequence[Any]) -> list[Any]:
    order = list(options)
    rng.shuffle(order)
    return order


def _link_target(rng: random.Random, kind: str, link: tuple[str, str]) -> str:
    """``A>B`` (the direction data flows) for a kind that acts on one direction, half of
    the time; else ``A-B`` in either order."""
    a, b = link
    if kind in ("link-slow", "link-loss") and rng.random() < 0.5:
        return f"{a}>{b}"
    return f"{a}-{b}" if rng.random() < 0.5 else f"{b}-{a}"


def fault_scenarios(
    kind: str,
    runs: int,
    fabrics: Mapping[str, Fabric],
    policies: Sequence[str],
    seed: int,
    vary: bool = False,
) -> list[Scenario]:
    """``runs`` scenarios of ``kind`` (index 0: renumbered by :func:`suite`), over the
    fabrics x policies in turn, onsets balanced over both, locations rotating over the
    tiers each fabric's ring crosses; magnitudes :data:`PARAMS`, or drawn from
    :data:`VARIED` with ``vary``."""
    rng = random.Random(f"{seed}:{kind}")
    magnitudes = random.Random(f"{seed}:{kind}:magnitude")
    combos = [(f, p) for f in fabrics for p in policies]
    start = rng.randrange(len(combos))
    usages = {name: ring_usage(fabric, ring_gpus(fabric)) for name, fabric in fabrics.items()}
    for name, usage in usages.items():
        if kind.startswith("link-") and not usage.links:
            raise ValueError(
                f"fabric {name}: its ring crosses no network link (its ranks share one "
                f"server), so there is nowhere to put a {kind}; pick another fabric, or "
                "--kinds without link faults"
            )
    link_turns = {n: _rotation(rng, list(u.links)) for n, u in usages.items()}
    switch_turns = {n: _rotation(rng, list(u.switches)) for n, u in usages.items()}
    gpu_turns = {n: _rotation(rng, u.gpus) for n, u in usages.items()}
    used: Counter[str] = Counter()
    out = []
    for j in range(runs):
        fabric, policy = combos[(start + j) % len(combos)]
        usage = usages[fabric]
        turn = used[fabric]
        used[fabric] += 1
        at = MID_RUN if (j + j // len(policies) + KINDS.index(kind)) % 2 else 0.0
        collective = COLLECTIVES[(j + KINDS.index(kind)) % 2]
        params = dict(PARAMS.get(kind, {}))
        if vary:
            params |= {k: magnitudes.choice(v) for k, v in VARIED.get(kind, {}).items()}
        target: str | None
        if kind.startswith("link-"):
            tiers = link_turns[fabric]
            link_kind = tiers[turn % len(tiers)]
            link = rng.choice(usage.links[link_kind])
            target, tier = _link_target(rng, kind, link), link_kind.value
        elif kind in ("switch-down", "blackhole"):
            switch_tiers = switch_turns[fabric]
            switch_tier = switch_tiers[turn % len(switch_tiers)]
            target, tier = rng.choice(usage.switches[switch_tier]), switch_tier.value
            if kind == "blackhole":
                params["destination"] = rng.choice(usage.destinations[target])
        elif kind == "straggler":
            gpus = gpu_turns[fabric]
            target, tier = gpus[turn % len(gpus)], "gpu"
        else:
            target, tier = "controller", "controller"
        out.append(Scenario(0, kind, fabric, policy, collective, target, params, at, tier=tier))
    return out


def healthy_scenarios(runs: int, fabrics: Sequence[str], policies: Sequence[str]) -> list[Scenario]:
    """``runs`` runs without a fault: the shapes of :data:`HEALTHY_SHAPES` in turn, each
    on the next (fabric, policy) of its own turn: in the default suite's 10, every shape
    meets both fabrics, and over 16 every (fabric, policy)."""
    combos = [(f, p) for p in policies for f in fabrics]  # the fabric turns fastest
    shapes = len(HEALTHY_SHAPES)
    out = []
    for j in range(runs):
        fabric, policy = combos[(j // shapes + j) % len(combos)]
        out.append(Scenario(0, None, fabric, policy, HEALTHY_SHAPES[j % shapes]))
    return out


def suite(
    fabrics: Mapping[str, Fabric],
    policies: Sequence[str],
    kinds: Sequence[str],
    per_kind: int,
    healthy: int,
    seed: int,
    vary: bool = False,
) -> list[Scenario]:
    """The whole suite in running order: round j holds the j-th run of every kind, healthy
    runs spread evenly in between, so that a suite cut short still covers every kind."""
    by_kind = {k: fault_scenarios(k, per_kind, fabrics, policies, seed, vary) for k in kinds}
    faulty = [by_kind[k][j] for j in range(per_kind) for k in kinds]
    calm = healthy_scenarios(healthy, list(fabrics), policies)
    ordered: list[Scenario] = []
    every = (len(faulty) + 1) / (len(calm) + 1) if calm else 0.0
    pending = deque(calm)
    for i, scenario in enumerate(faulty):
        ordered.append(scenario)
        if pending and (i + 1) >= every * (len(calm) - len(pending) + 1) - 1e-9:
            ordered.append(pending.popleft())
    ordered += pending
    return [_renumber(s, i + 1) for i, s in enumerate(ordered)]


def _renumber(scenario: Scenario, index: int) -> Scenario:
    data = scenario.to_dict()
    data["index"] = index
    return Scenario.from_dict(data)


def rank_count(fabric: Fabric) -> int:
    """How many GPUs a run takes: at most :data:`RANKS`, whole servers (a hierarchical
    all-reduce needs the same local ranks on every server: 8 of a fabric of 3-GPU servers
    cannot run it, 6 can), every GPU of a smaller fabric."""
    per_server = max(Counter(g.server for g in fabric.gpus.values()).values())
    whole = max(per_server, RANKS // per_server * per_server)
    return min(whole, len(fabric.gpus))


def ring_gpus(fabric: Fabric) -> list[str]:
    """The run's ranks: the first :func:`rank_count` GPUs in rank order (the experiment's
    ``placement: {gpus: N}``, rank order)."""
    return [g.name for g in fabric.gpus_by_rank()[: rank_count(fabric)]]


def experiment_document(scenario: Scenario, fabric_ref: str, spec: FabricSpec) -> dict[str, Any]:
    """The ``astral run`` experiment of one scenario (``fabric_ref``: a preset's name or
    a fabric file's path)."""
    document: dict[str, Any] = {
        "name": f"diag-{scenario.index:03d}-{scenario.kind or HEALTHY}",
        "description": f"benchmarks/diagnosis.py: {scenario.kind or HEALTHY} {scenario.target}",
        "fabric": fabric_ref,
        "policy": scenario.policy,
        **shape_document(scenario.collective, spec),
        "warmup": 1,
        # whole servers, every GPU of a smaller fabric (the ranks of ring_gpus)
        "placement": {"gpus": rank_count(build_fabric(spec))},
        "scale": SCALE,
    }
    entry = scenario.fault_entry()
    if entry is not None:
        document["faults"] = [entry]
    return document


def shape_document(shape: str, spec: FabricSpec) -> dict[str, Any]:
    """The collectives, sizes and iterations of a run of ``shape``:

    - ``ring``, ``direct``: ring all-reduce or direct all-to-all of :func:`size_for`,
      :func:`iterations_for` and a timed batch of at least :data:`COLLECTIVE_SECONDS`;
    - ``sweep``: both, at every size from 64 KiB to 4 MiB (x4), 3 iterations, the
      experiment's own batches (short operations, idle gaps between sizes): the default
      experiment's shape;
    - ``mixed``: hierarchical all-reduce, shifted all-to-all, all-gather and
      reduce-scatter at :func:`size_for`, 4 iterations, batches of 4 s."""
    size = size_for(spec)
    if shape == "sweep":
        collectives = [{"op": "all-reduce", "algorithm": "ring"},
                       {"op": "all-to-all", "algorithm": "direct"}]  # fmt: skip
        return {"collectives": collectives, "sizes": dict(SWEEP_SIZES), "iterations": 3}
    if shape == "mixed":
        return {
            "collectives": [dict(c) for c in MIXED],
            "sizes": {"min": size, "max": size},
            "iterations": 4,
            "min_batch": "4s",
        }
    op, algorithm = ("all-reduce", "ring") if shape == "ring" else ("all-to-all", "direct")
    return {
        "collectives": [{"op": op, "algorithm": algorithm}],
        "sizes": {"min": size, "max": size},
        "iterations": iterations_for(spec, shape),
        # ... and at least COLLECTIVE_SECONDS by the warm-up's time (iterations_for's
        # estimate is astral-small's: on a fabric unlike it an operation can be shorter)
        "min_batch": f"{COLLECTIVE_SECONDS:g}s",
    }


# --- matching and scoring ----------------------------------------------------------------


def link_ends(target: str) -> frozenset[str] | None:
    """The two node names of a link target (``A-B`` or ``A>B``); None for another target.
    Node names never contain ``-`` or ``>`` (topologies/model.py)."""
    for sep in (">", "-"):
        a, found, b = target.partition(sep)
        if found and a and b:
            return frozenset((a, b))
    return None


def matches(component: str, target: str, fault: str, expected: tuple[str, str, str]) -> bool:
    """A suspect (component, target, fault) names the injection ``expected``: the same
    component and fault, and the same target; links by their two ends (``A>B``, ``B>A``,
    ``A-B`` and ``B-A`` name one link)."""
    want_component, want_target, want_fault = expected
    if component != want_component or fault != want_fault:
        return False
    if component == "link":
        ends = link_ends(target)
        return ends is not None and ends == link_ends(want_target)
    return target == want_target


@dataclass
class Outcome:
    """One run's verdict: the scenario, the run's status, the diagnosis (as ``to_dict``,
    with each suspect's ``onset`` where it had one), the rank (1-based) of the first
    matching suspect, the fault's ``applied`` instant, the bundle's saturation flag."""

    scenario: Scenario
    status: str
    run_seconds: float = float("nan")
    diagnosis: dict[str, Any] | None = None
    error: str | None = None
    hit_rank: int | None = None
    applied: float | None = None
    onset: float | None = None
    saturated: bool | None = None
    crossed: bool | None = None
    alerts: list[dict[str, Any]] | None = None  # the run's live alerts (run.json)
    # the alerts are a replay of the live diagnosis on the bundle (--replay), not the run's
    replayed: bool = False

    @property
    def top(self) -> str:
        """The top-1 verdict's fault, ``healthy``, or ``error``/``no diagnosis``."""
        if self.diagnosis is None:
            return "error" if self.error else "no diagnosis"
        suspects = self.diagnosis.get("suspects") or []
        if self.diagnosis.get("healthy") or not suspects:
            return HEALTHY
        return str(suspects[0]["fault"])

    @property
    def delay(self) -> float | None:
        if self.onset is None or self.applied is None:
            return None
        return self.onset - self.applied

    @property
    def alert_delay(self) -> float | None:
        """The first live alert that names the injected fault, after it was applied."""
        expected = self.scenario.expected()
        if expected is None or self.applied is None or not self.alerts:
            return None
        hits = [
            a["t"] - self.applied
            for a in self.alerts
            if matches(a["component"], a["target"], a["fault"], expected)
        ]
        return min(hits) if hits else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["scenario"] = self.scenario.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        fields = dict(data)
        fields["scenario"] = Scenario.from_dict(fields["scenario"])
        return cls(**fields)


def crossed(scenario: Scenario, paths: Iterable[Sequence[str]]) -> bool | None:
    """Whether a recorded connection path (its nodes, GPU to GPU; a first-hop-only path is
    two nodes long) crosses the scenario's link or switch: True, False, or None when it
    cannot tell (the target is a GPU or the controller, or the paths known do not reach it
    and some are first hops only). A blackhole counts only paths to its destination."""
    if scenario.kind is None or scenario.tier in ("gpu", "controller", "-"):
        return None
    ends = link_ends(scenario.target or "")
    destination = scenario.params.get("destination")  # a blackhole drops only what goes there
    partial = False
    for nodes in paths:
        partial = partial or len(nodes) <= 2
        if destination is not None and nodes[-1] != destination:
            continue
        if ends is None and scenario.target in nodes:
            return True
        if ends is not None and any(frozenset(p) == ends for p in pairwise(nodes)):
            return True
    return None if partial else False


def score(outcome: Outcome, suspects: Sequence[Any]) -> None:
    """Fill ``hit_rank`` and ``onset`` from the ranked suspects (objects with component,
    target, fault and perhaps ``onset``)."""
    expected = outcome.scenario.expected()
    if expected is None:
        return
    for rank, suspect in enumerate(suspects, start=1):
        if matches(suspect.component, suspect.target, suspect.fault, expected):
            outcome.hit_rank = rank
            onset = getattr(suspect, "onset", None)
            outcome.onset = float(onset) if isinstance(onset, (int, float)) else None
            return


def diagnosis_dict(diagnosis: Any) -> dict[str, Any]:
    """``Diagnosis.to_dict()`` with each suspect's ``onset`` where the Suspect has one."""
    data: dict[str, Any] = dict(diagnosis.to_dict())
    rows = data.get("suspects") or []
    for row, suspect in zip(rows, getattr(diagnosis, "listed", diagnosis.suspects), strict=False):
        onset = getattr(suspect, "onset", None)
        if onset is not None and "onset" not in row:
            row["onset"] = onset
    return data


# --- tables ------------------------------------------------------------------------------


def confusion_table(outcomes: Sequence[Outcome]) -> list[str]:
    """Injected kind (rows, ``healthy`` last) against the top suspect's fault (columns)."""
    rows = [k for k in KINDS if any(o.scenario.kind == k for o in outcomes)]
    if any(o.scenario.kind is None for o in outcomes):
        rows.append(HEALTHY)
    columns = [*FAULTS, HEALTHY]
    extra = sorted({o.top for o in outcomes} - set(columns))
    columns += extra
    counts = Counter((o.scenario.kind or HEALTHY, o.top) for o in outcomes)
    short = {"controller outage": "ctl-out", "flapping": "flap", "blackhole": "blackh",
             "straggler": "stragg", "no diagnosis": "none"}  # fmt: skip
    heads = [short.get(c, c)[:7] for c in columns]
    corner = "injected \\ top-1"
    lines = [f"  {corner:<18}" + "".join(f"{h:>8}" for h in heads) + f"{'runs':>7}"]
    for row in rows:
        cells = [counts.get((row, c), 0) for c in columns]
        text = "".join(f"{n if n else '.':>8}" for n in cells)
        lines.append(f"  {row:<18}{text}{sum(cells):>7}")
    return lines


def _share(hits: int, total: int) -> str:
    return f"{hits}/{total} ({hits / total:.0%})" if total else "-"


def accuracy_lines(outcomes: Sequence[Outcome]) -> list[str]:
    """Top-1 and top-3 accuracy per kind and over all fault runs that were diagnosed;
    false alarms on healthy runs; runs not diagnosed."""
    diagnosed = [o for o in outcomes if o.diagnosis is not None]
    faulty = [o for o in diagnosed if o.scenario.kind is not None]
    lines = [f"  {'kind':<18}{'top-1':>14}{'top-3':>14}"]
    for kind in KINDS:
        mine = [o for o in faulty if o.scenario.kind == kind]
        if mine:
            top1 = sum(1 for o in mine if o.hit_rank == 1)
            top3 = sum(1 for o in mine if o.hit_rank is not None and o.hit_rank <= 3)
            lines.append(f"  {kind:<18}{_share(top1, len(mine)):>14}{_share(top3, len(mine)):>14}")
    top1 = sum(1 for o in faulty if o.hit_rank == 1)
    top3 = sum(1 for o in faulty if o.hit_rank is not None and o.hit_rank <= 3)
    everything = f"{_share(top1, len(faulty)):>14}{_share(top3, len(faulty)):>14}"
    lines.append(f"  {'all faults':<18}{everything}")
    unseen = [o for o in faulty if o.crossed is False]
    if unseen:
        seen = [o for o in faulty if o.crossed is not False]
        top1 = sum(1 for o in seen if o.hit_rank == 1)
        top3 = sum(1 for o in seen if o.hit_rank is not None and o.hit_rank <= 3)
        lines.append(
            f"  {'faults seen':<18}{_share(top1, len(seen)):>14}{_share(top3, len(seen)):>14}"
            f"   (without the {len(unseen)} whose target no recorded path crossed)"
        )
    calm = [o for o in diagnosed if o.scenario.kind is None]
    alarms = [o for o in calm if o.top != HEALTHY]
    lines.append(f"  false alarms on healthy runs: {_share(len(alarms), len(calm))}")
    missed = [o for o in faulty if o.top == HEALTHY]
    lines.append(f"  fault runs called healthy: {_share(len(missed), len(faulty))}")
    undiagnosed = [o for o in outcomes if o.diagnosis is None]
    if undiagnosed:
        lines.append(f"  not diagnosed: {len(undiagnosed)} ({_reasons(undiagnosed)})")
    return lines


def _reasons(outcomes: Iterable[Outcome]) -> str:
    counts = Counter((o.error or o.status).splitlines()[0][:60] for o in outcomes)
    return "; ".join(f"{n} x {why}" for why, n in counts.most_common(3))


def _spread(values: Sequence[float], unit: str = "s") -> str:
    if not values:
        return "-"
    return (
        f"median {statistics.median(values):.2f} {unit}, min {min(values):.2f}, "
        f"max {max(values):.2f} (n={len(values)})"
    )


def timing_lines(outcomes: Sequence[Outcome]) -> list[str]:
    delays = [d for o in outcomes if (d := o.delay) is not None]
    seconds = [
        float(o.diagnosis["seconds"])
        for o in outcomes
        if o.diagnosis is not None and isinstance(o.diagnosis.get("seconds"), (int, float))
    ]
    hits = [o for o in outcomes if o.hit_rank is not None]
    no_onset = len(hits) - len(delays)
    lines = [f"  detection delay (matching suspect's onset - applied): {_spread(delays)}"]
    alerted = [d for o in outcomes if (d := o.alert_delay) is not None]
    recorded = [o for o in outcomes if o.alerts is not None]
    if recorded:
        faulty = [o for o in recorded if o.scenario.kind is not None]
        healthy_alerts = sum(bool(o.alerts) for o in recorded if o.scenario.kind is None)
        how = (
            "replayed from the bundles with the code of now, not the runs' own alerts"
            if any(o.replayed for o in recorded)
            else "first matching ALERT - applied"
        )
        lines.append(
            f"  live alert delay ({how}): {_spread(alerted)}; "
            f"{len(alerted)} of {len(faulty)} fault runs alerted on the injected fault, "
            f"{sum(d <= 5.0 for d in alerted)} within 5 s; healthy runs with an alert: "
            f"{healthy_alerts} of {len(recorded) - len(faulty)}"
        )
    if no_onset:
        lines.append(f"    {no_onset} matching suspect(s) without an onset")
    lines.append(f"  time to localize (Diagnosis.seconds): {_spread(seconds)}")
    runs = [o.run_seconds for o in outcomes if o.run_seconds == o.run_seconds]
    lines.append(f"  astral run, wall clock per run: {_spread(runs)}")
    return lines


def magnitude(s: Scenario) -> str:
    """The fault's strength in a run line (the rate, loss, period or delay; a blackhole's
    destination is in its target already)."""
    return " ".join(str(v) for k, v in s.params.items() if k != "destination")


def run_line(o: Outcome) -> str:
    s = o.scenario
    if o.diagnosis is None:
        verdict = o.error or "no diagnosis"
    elif o.top == HEALTHY:
        verdict = HEALTHY
    else:
        first = o.diagnosis["suspects"][0]
        verdict = f"{first['component']} {first['target']} {first['fault']} {first['score']:.2f}"
    hit = f"#{o.hit_rank}" if o.hit_rank else "miss"
    if o.diagnosis is None:
        hit = "-"
    elif s.kind is None:
        hit = "ok" if o.top == HEALTHY else ("ALARM" if o.diagnosis is not None else "-")
    delay = f"{o.delay:+.2f}s" if o.delay is not None else "-"
    path = {True: "yes", False: "no", None: "?"}[o.crossed]
    if s.tier in ("gpu", "controller", "-"):
        path = "-"
    flag = " SATURATED" if o.saturated else ""
    what = f"{s.kind or HEALTHY} {s.target or ''} {magnitude(s)}".strip()
    return (
        f"  {s.index:>3} {what:<40} {s.tier:>10} {s.fabric:>13} {s.policy:>11} {s.collective:>6}"
        f" {s.onset:>7} {o.status:>8} {path:>4} {hit:>5} {delay:>7}  {verdict}{flag}"
    )


def report(outcomes: Sequence[Outcome]) -> list[str]:
    """Everything printed at the end (conditions apart)."""
    head = (
        f"  {'#':>3} {'injected':<40} {'tier':>10} {'fabric':>13} {'policy':>11} {'coll':>6}"
        f" {'onset':>7} {'run':>8} {'path':>4} {'hit':>5} {'delay':>7}  top-1 suspect"
    )
    lines = ["# runs", head, *[run_line(o) for o in outcomes], ""]
    lines += ["# confusion: injected kind (rows) x the top suspect's fault (columns)"]
    lines += confusion_table(outcomes)
    lines += ["", "# accuracy (a suspect matches: component, target and fault)"]
    lines += accuracy_lines(outcomes)
    lines += ["", "# timing"]
    lines += timing_lines(outcomes)
    return lines


def suite_counts(scenarios: Sequence[Scenario]) -> list[str]:
    """What the suite contains: runs per kind, fabric, policy, collective, onset, tier."""
    lines = []
    for label, key in (
        ("kind", lambda s: s.kind or HEALTHY),
        ("fabric", lambda s: s.fabric),
        ("policy", lambda s: s.policy),
        ("collective", lambda s: s.collective),
        ("onset", lambda s: s.onset),
        ("tier", lambda s: s.tier),
    ):
        counts = Counter(key(s) for s in scenarios)
        lines.append(f"  {label:<11}" + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    return lines


# --- running -----------------------------------------------------------------------------


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so the running ``astral run`` is stopped (a
    BaseException: the diagnosis' ``except Exception`` must not swallow it)."""


def astral_command() -> list[str]:
    """The ``astral`` of this interpreter's environment (the CLI's module otherwise)."""
    script = Path(sys.executable).parent / "astral"
    return [str(script)] if script.exists() else [sys.executable, "-m", "orchestrator.cli"]


def resolve_fabrics(names: Sequence[str], directory: Path) -> dict[str, tuple[str, FabricSpec]]:
    """Each fabric's (reference for the experiment, spec): a non-preset of
    :data:`INLINE_FABRICS` written as a fabric file into ``directory``."""
    out = {}
    for name in names:
        if name in INLINE_FABRICS:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"{name}.yaml"
            path.write_text(yaml.safe_dump(INLINE_FABRICS[name], sort_keys=False))
            out[name] = (str(path.resolve()), load_fabric_spec(path))
        else:
            path = resolve_fabric(name)
            spec = load_fabric_spec(path)
            out[Path(name).stem if name.endswith((".yaml", ".yml")) else name] = (str(path), spec)
    return out


def bundle_facts(bundle: Path, outcome: Outcome) -> None:
    """The ground truth (``applied`` of the injected fault) and the saturation flag."""
    from orchestrator.results.store import ResultsBundle

    with ResultsBundle.open(bundle) as opened:
        faults = opened.faults()
        if faults:
            outcome.applied = faults[0].applied
            if faults[0].error:
                outcome.error = f"fault failed: {faults[0].error}"
        loads = opened.emulator_loads()
        outcome.saturated = any(load.saturated for load in loads.values()) if loads else None
        paths = [[hop.node for hop in hops] for hops in opened.paths().values()]
        outcome.crossed = crossed(outcome.scenario, paths)
    run_file = bundle / "run.json"
    if run_file.is_file():
        alerts = json.loads(run_file.read_text(encoding="utf-8")).get("alerts")
        outcome.alerts = list(alerts) if isinstance(alerts, list) else None


def diagnose(bundle: Path, outcome: Outcome) -> None:
    """``diagnose_bundle`` on ``bundle`` (imported here: the package may be absent), into
    ``outcome``; an exception is recorded, not raised (one bad bundle must not stop a suite)."""
    try:
        # by name: the package is written apart from this benchmark and may be absent
        package = importlib.import_module("orchestrator.diagnosis")
    except ImportError as error:
        outcome.error = f"orchestrator.diagnosis unavailable: {error}"
        return
    try:
        diagnosis = package.diagnose_bundle(bundle)
    except Exception as error:  # the suite goes on; the error is reported
        outcome.error = f"diagnose_bundle: {type(error).__name__}: {error}"
        return
    outcome.diagnosis = diagnosis_dict(diagnosis)
    # what the diagnosis lists: the suspects above its threshold, then the less likely ones
    score(outcome, list(diagnosis.listed))


def evaluate(run_dir: Path, scenario: Scenario, status: str, seconds: float) -> Outcome:
    outcome = Outcome(scenario, status, seconds)
    bundle = run_dir / "bundle"
    if not (bundle / "results.sqlite").exists():
        outcome.error = f"no bundle ({status})"
        return outcome
    bundle_facts(bundle, outcome)
    if outcome.error is None:
        diagnose(bundle, outcome)
    return outcome


STATUS = {0: "ok", 4: "failed", 7: "wrong", 130: "stopped", 143: "stopped", 5: "locked"}


def run_one(
    scenario: Scenario,
    fabrics: Mapping[str, tuple[str, FabricSpec]],
    runs_dir: Path,
    lock_wait: float,
) -> Outcome:
    """One ``astral run`` of ``scenario`` into ``runs_dir/<name>/``, then its diagnosis."""
    ref, spec = fabrics[scenario.fabric]
    run_dir = runs_dir / scenario.name
    run_dir.mkdir(parents=True, exist_ok=True)
    experiment = run_dir / "experiment.yaml"
    experiment.write_text(yaml.safe_dump(experiment_document(scenario, ref, spec), sort_keys=False))
    (run_dir / "scenario.json").write_text(json.dumps(scenario.to_dict(), indent=1) + "\n")
    argv = [*astral_command(), "run", str(experiment), "--out", str(run_dir / "bundle")]
    argv += ["--force", "--no-plots", "--quiet", "--lock-wait", f"{lock_wait:g}"]
    began = time.monotonic()
    with (run_dir / "astral-run.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = process.wait()
        except BaseException:  # SIGTERM or Ctrl-C here: stop the run before leaving
            stop(process)
            raise
    seconds = time.monotonic() - began
    status = STATUS.get(code, f"exit {code}")
    outcome = evaluate(run_dir, scenario, status, seconds)
    (run_dir / "outcome.json").write_text(json.dumps(outcome.to_dict(), indent=1) + "\n")
    if code in (130, 143):
        raise KeyboardInterrupt
    return outcome


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a running ``astral run`` (it tears its fabric down and marks its bundle
    interrupted), then wait; SIGKILL only if it has not ended after two minutes."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def saved_runs(directory: Path) -> list[tuple[Path, Scenario]]:
    """The runs of a saved suite, in order: every run directory with a scenario and a
    finished bundle (its outcome written, or the bundle's run.json: a run still going, or
    cut short by a kill, has neither)."""
    runs = []
    for run_dir in sorted((directory / "runs").glob("*")):
        scenario_file = run_dir / "scenario.json"
        bundle = run_dir / "bundle"
        finished = (run_dir / "outcome.json").exists() or (bundle / "run.json").exists()
        if scenario_file.exists() and (bundle / "results.sqlite").exists() and finished:
            runs.append((run_dir, Scenario.from_dict(json.loads(scenario_file.read_text()))))
    return runs


def rediagnose(directory: Path, replay: bool = False) -> list[Outcome]:
    """Every saved run diagnosed again (its status and duration from its outcome.json);
    ``replay``: its live alerts replayed from the bundle with the code of now
    (orchestrator.diagnosis.replay) in place of those the run raised."""
    outcomes = []
    for run_dir, scenario in saved_runs(directory):
        status, seconds = "ok", float("nan")
        saved = run_dir / "outcome.json"
        if saved.exists():
            before = json.loads(saved.read_text())
            status, seconds = before.get("status", "ok"), before.get("run_seconds", seconds)
        outcome = evaluate(run_dir, scenario, status, seconds)
        if replay and outcome.error is None:
            replayed = importlib.import_module("orchestrator.diagnosis.replay")
            evidence = importlib.import_module("orchestrator.diagnosis.evidence")
            obs = evidence.observe(run_dir / "bundle")
            outcome.alerts = [a.to_dict() for a in replayed.replay(obs)]
            outcome.replayed = True
        outcomes.append(outcome)
    return outcomes


def conditions(outcomes: Sequence[Outcome]) -> list[str]:
    load = os.getloadavg()
    flags = [o.saturated for o in outcomes]
    lines = [
        f"  machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f} (shared: other emulations may run, timings are noisy)",
        f"  emulator_load: {flags.count(True)} of {len(flags)} runs saturated in some "
        f"configuration, {flags.count(None)} without a verdict",
    ]
    bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=False)
    if bridges.returncode == 0:
        lines.append(f"  Open vSwitch bridges on the machine now: {len(bridges.stdout.split())}")
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog="See the module docstring (and docs/benchmarks.md) for what is measured.",
    )
    parser.add_argument("--seed", type=int, default=1, help="draws the suite (default 1)")
    parser.add_argument("--per-kind", type=int, default=4, help="fault runs per kind (4)")
    parser.add_argument("--healthy", type=int, default=10, help="runs without a fault (10)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, comma-separated")
    parser.add_argument(
        "--fabrics",
        default=",".join(DEFAULT_FABRICS),
        help=f"presets, fabric files or {', '.join(INLINE_FABRICS)} (default: %(default)s)",
    )
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--out", type=Path, default=None, help="keep the suite here")
    parser.add_argument("--lock-wait", type=float, default=900.0, help="for each astral run")
    parser.add_argument(
        "--quick", action="store_true", help="a handful of runs: 1 per kind, 1 healthy"
    )
    parser.add_argument(
        "--diagnose-only", type=Path, default=None, metavar="DIR",
        help="diagnose the bundles of a saved suite again, no emulation (--kinds, "
        "--fabrics and --policies select among them)",
    )  # fmt: skip
    parser.add_argument(
        "--replay", action="store_true",
        help="with --diagnose-only: the live alerts replayed from each bundle with the code "
        "of now, in place of those the run raised (approximate: docs/diagnosis.md)",
    )  # fmt: skip
    parser.add_argument(
        "--resume", action="store_true",
        help="with --out: keep the runs of DIR that finished (outcome.json), run the rest",
    )  # fmt: skip
    parser.add_argument(
        "--vary", action="store_true",
        help="draw each fault's magnitude (slow rate, loss, flap period, straggler delay) "
        "from a range instead of the fixed ones",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="write every outcome here")
    args = parser.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    args.fabrics = [f for f in args.fabrics.split(",") if f]
    args.policies = [p for p in args.policies.split(",") if p]
    if args.quick:
        args.per_kind, args.healthy = 1, 1
    return args


def resumed_mismatch(saved: Path, document: Mapping[str, Any]) -> str | None:
    """Why a suite resumed from ``saved`` is not the one asked for (another seed,
    ``--vary`` or not, other runs), or None: its finished runs would be counted beside
    runs drawn otherwise."""
    if not saved.exists():
        return None
    old = json.loads(saved.read_text())
    drawn = {"seed": old.get("seed"), "vary": old.get("vary", False)}  # before --vary: not
    for key, value in drawn.items():
        if value != document[key]:
            return f"it was drawn with {key} {value}, not {document[key]}"
    if old.get("scenarios") != document["scenarios"]:
        return "its runs differ from those these options draw (kinds, fabrics, policies)"
    return None


def selected(scenario: Scenario, args: argparse.Namespace) -> bool:
    """Whether ``--kinds``, ``--fabrics`` and ``--policies`` keep a saved run (healthy runs
    stay with any kinds): --diagnose-only on a part of a suite."""
    kind_kept = scenario.kind is None or scenario.kind in args.kinds
    return (
        kind_kept
        and scenario.fabric in fabric_names(args.fabrics)
        and scenario.policy in args.policies
    )


def fabric_names(fabrics: Sequence[str]) -> set[str]:
    """The names runs know their fabrics by: a preset's name, or a fabric file's stem (as
    :func:`resolve_fabrics` keys them)."""
    return {Path(f).stem if f.endswith((".yaml", ".yml")) else f for f in fabrics}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    if args.diagnose_only is not None:
        saved = rediagnose(args.diagnose_only, args.replay)
        again = [o for o in saved if selected(o.scenario, args)]
        if saved and not again:
            held = sorted({o.scenario.fabric for o in saved})
            print(
                f"benchmarks/diagnosis.py: no saved run of {args.diagnose_only} is on "
                f"--fabrics {','.join(args.fabrics)} under --policies "
                f"{','.join(args.policies)}; its runs are on {', '.join(held)}",
                file=sys.stderr,
            )
            return 2
        print(f"# re-diagnosed {len(again)} saved runs of {args.diagnose_only}")
        print("# suite")
        for line in suite_counts([o.scenario for o in again]):
            print(line)
        return finish(again, args, began)
    out = args.out or Path(tempfile.mkdtemp(prefix="astral-diagnosis-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    fabrics = resolve_fabrics(args.fabrics, out / "fabrics")
    models = {name: build_fabric(spec) for name, (_, spec) in fabrics.items()}
    try:
        scenarios = suite(
            models, args.policies, args.kinds, args.per_kind, args.healthy, args.seed, args.vary
        )
    except ValueError as error:
        print(f"diagnosis benchmark: {error}", file=sys.stderr)
        return 2
    document = {"seed": args.seed, "vary": args.vary,
                "fabrics": {n: r for n, (r, _) in fabrics.items()},
                "scenarios": [s.to_dict() for s in scenarios]}  # fmt: skip
    mismatch = resumed_mismatch(out / "suite.json", document) if args.resume else None
    if mismatch:
        print(f"diagnosis benchmark: --resume of {out}: {mismatch}", file=sys.stderr)
        return 2
    (out / "suite.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"# diagnosis suite: {len(scenarios)} runs (seed {args.seed}) in {out}")
    for line in suite_counts(scenarios):
        print(line)
    print("# before")
    for line in conditions([]):
        print(line)

    def terminate(signum: int, frame: object) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, terminate)
    outcomes: list[Outcome] = []
    status = 0
    try:
        for scenario in scenarios:
            done = out / "runs" / scenario.name / "outcome.json"
            if done.exists() and args.resume:
                outcome = Outcome.from_dict(json.loads(done.read_text()))
            else:
                outcome = run_one(scenario, fabrics, out / "runs", args.lock_wait)
            outcomes.append(outcome)
            print(run_line(outcome), flush=True)
    except (KeyboardInterrupt, Terminated) as interrupted:
        status = 143 if isinstance(interrupted, Terminated) else 130
        print(f"# interrupted: {len(outcomes)} of {len(scenarios)} runs done; the rest is "
              f"not in {out} (--diagnose-only reads what is)")  # fmt: skip
    finish(outcomes, args, began)
    print(f"# suite kept in {out}")
    return status


def finish(outcomes: Sequence[Outcome], args: argparse.Namespace, began: float) -> int:
    print()
    for line in report(outcomes):
        print(line)
    print("# conditions")
    for line in conditions(outcomes):
        print(line)
    print(f"took {time.monotonic() - began:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps([o.to_dict() for o in outcomes], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
