"""The probe mesh: TCP probes whose paths cover every link direction, run beside a run.

The collectives' connections show the links they cross; a fault elsewhere is invisible to
them until traffic moves there. The probe mesh makes every link direction carry a few
small probes (:mod:`orchestrator.testbed.prober` sends them) whose paths are known, so the
diagnosis can tell a lossy or blackholing element from the pattern of probes that lost
packets and probes that did not (network tomography: NetBouncer, 007; Astral's monitor
probes its fabric as SkeletonHunter and Pingmesh do).

Choosing the probes (:func:`choose`, pure): candidates are TCP five-tuples between GPUs of
different servers, a few source ports per ordered pair; each is traced through the
switches as they forward it (``ip route get`` for the NIC, then ``ofproto/trace`` hop by
hop: :mod:`orchestrator.testbed.tracing`), and a greedy cover picks, while any link
direction has fewer than ``cover`` probes or any (switch, destination GPU) that a
candidate passes fewer than ``pair_cover``, the candidate that raises the most of them
towards that (then pairs not used yet, then fewer hops). Several probes per direction from
different sources and to different destinations are what lets the diagnosis tell the
links of one path apart: a direction is suspected when the probes that cross it lost
packets and cleared when one that crosses it did not. The (switch, destination) cover is
for drop rules, which match destinations: a switch that drops what goes to one GPU is
seen only by probes that pass it towards that GPU (or whose acknowledgements do).

A policy switch reprograms the switches: the same probes are traced again
(:meth:`ProbeMesh.retrace`) and each tracing is kept with its time, so the diagnosis reads
a probe's loss against the path it had then. What the mesh costs: each probe sends
:data:`~orchestrator.testbed.prober.MESSAGE` bytes every ``interval`` (64 B at 20 per
second, about 10 kbit/s of frames per probe direction, under 0.1 % of a 12 Mbit/s
emulated port per probe), plus a train of :data:`~orchestrator.testbed.prober.TRAIN`
bytes every :data:`~orchestrator.testbed.prober.TRAIN_CYCLE_S` seconds paced at
:data:`PACE` times its path's slowest link (about 65 kbit/s a probe), and the prober
samples ``TCP_INFO`` every ``sample`` seconds. Those bytes are the same on every link, so
on a slow one (a 15:1 core) they would take a large share of it: :func:`budget` thins the
probes that cross a crowded direction, so that on every direction the messages take at
most :data:`MESSAGE_BUDGET` of its rate and the trains :data:`TRAIN_BUDGET`.

Files in the bundle: ``probes.json`` (the probes, their paths per tracing, what failed)
and ``probes.jsonl`` (the prober's samples). Single-machine emulations only: a cluster
run's GPUs live on several machines, which one process cannot enter (said in run.json).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchestrator.emulation.pathtrace import TracedPath, open_control, trace_paths
from orchestrator.results.store import PROBE_SAMPLES_FILE, PROBES_FILE
from orchestrator.testbed.prober import MESSAGE, TRAIN, TRAIN_CYCLE_S, TRAINS_PER_S, ProbeSpec
from orchestrator.testbed.tracing import flow_requests
from topologies.description import FabricDescription
from topologies.fivetuple import FiveTuple
from topologies.model import LinkKind

PROBE_PORT = 46999  # the probes' listening port in every destination (the workers': 47000+)
SPORT_BASE = 61000  # above Linux's ephemeral range (32768-60999), the workers' (16384+) too
PER_PAIR = 4  # candidate source ports per ordered GPU pair
MAX_CANDIDATES = 2000  # traced at most (about 0.2 ms a switch)
COVER = 3  # probes wanted across each link direction
PAIR_COVER = 1  # ... and through each switch towards each GPU
INTERVAL_S = 0.05  # a message per probe this often, at most
MESSAGES_PER_S = 1500  # all probes together at most (each a few switch hops, and an
# acknowledgement back: what the userspace datapath forwards for them, beside the
# collectives' few thousand packets a second)
SAMPLE_S = 0.1  # the kernels' counters read this often
PACE = 1.5  # a train's pace, times its path's slowest link
STOP_S = 3.0
#: the most of a link direction's rate the probes' messages and their acknowledgements
#: may take, and their trains (:func:`budget`)
MESSAGE_BUDGET = 0.03
TRAIN_BUDGET = 0.05
MAX_MESSAGE_GAP_S = 0.5  # a probe's messages at least this often, whatever its budget
HEADERS = 54  # bytes of Ethernet, IPv4 and TCP headers on a probe's segment (no timestamps)
ACK_FRAME = 60  # bytes of an acknowledgement's frame (Ethernet's minimum)
SEGMENT = 1448  # payload bytes of a train's full segments


class Emulated(Protocol):
    """What the mesh needs of an emulation (orchestrator.emulation.network.Emulation)."""

    def netns_paths(self) -> dict[str, str]: ...

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]: ...

    def run(self, node: str | None, argv: Sequence[str], *, input: str | None = ...,
            timeout: float = ...) -> Any: ...  # fmt: skip


def candidates(
    description: FabricDescription, gpus: Iterable[str], seed: int = 0
) -> list[ProbeSpec]:
    """A few probes per ordered pair of ``gpus`` on different servers (at most
    :data:`MAX_CANDIDATES`, pairs sampled with ``seed`` beyond that), each with its own
    source port."""
    fabric = description.fabric
    names = sorted(gpus)
    pairs = [
        (s, d) for s in names for d in names
        if s != d and fabric.gpus[s].server != fabric.gpus[d].server
    ]  # fmt: skip
    if len(pairs) * PER_PAIR > MAX_CANDIDATES:
        pairs = sorted(random.Random(seed).sample(pairs, MAX_CANDIDATES // PER_PAIR))
    found: list[ProbeSpec] = []
    for i, (s, d) in enumerate(pairs):
        for k in range(PER_PAIR):
            found.append(
                ProbeSpec(
                    id=len(found),
                    src=s,
                    dst=d,
                    src_ip=description.addresses[s].fabric_ip,
                    # spread over the low bits that pinning and hashing read
                    sport=SPORT_BASE + (i * PER_PAIR + k) * 7 % (65535 - SPORT_BASE),
                    dst_ip=description.addresses[d].fabric_ip,
                    dport=PROBE_PORT,
                )
            )
    return found


def five_tuple(probe: ProbeSpec) -> FiveTuple:
    return FiveTuple(probe.src_ip, probe.sport, probe.dst_ip, probe.dport)


def directions(path: TracedPath) -> list[str]:
    """The link directions ``A>B`` a traced path crosses (up to where it stopped)."""
    nodes = path.nodes
    return [f"{a}>{b}" for a, b in itertools.pairwise(nodes)]


def all_directions(description: FabricDescription) -> set[str]:
    """Every direction of every network link (NIC and switch-to-switch; NVLink is inside
    a server, not the network's)."""
    return set(direction_rates(description))


def toward(path: TracedPath, dst: str) -> set[str]:
    """``X~D`` for each switch X the path crosses towards its destination D: a drop rule
    for D's addresses at X is seen by the probes that pass X towards D, and by no other."""
    return {f"{node}~{dst}" for node in path.nodes[1:-1]}


def choose(
    probes: Sequence[ProbeSpec],
    paths: Mapping[int, TracedPath],
    wanted: set[str],
    cover: int = COVER,
    pair_cover: int = PAIR_COVER,
    rates: Mapping[str, float] | None = None,
) -> list[ProbeSpec]:
    """The greedy cover of the module docstring: probes (of those traced to their
    destination) until every direction of ``wanted`` that any candidate crosses has
    ``cover`` of them and every (switch, destination) any candidate passes has
    ``pair_cover``, or no candidate adds one. With ``rates`` (direction -> emulated
    bit/s), every direction also wants one probe with a clear view of it
    (:func:`clear_views`), where any candidate has one."""
    crossing = {
        p.id: set(directions(paths[p.id])) & wanted
        for p in probes
        if p.id in paths and paths[p.id].complete
    }
    passing = {i: toward(paths[i], paths[i].nodes[-1]) for i in crossing}
    clear = {
        i: {f"{d}|clear" for d in clear_views(directions(paths[i]), rates) & wanted}
        for i in crossing
    }
    count: Counter[str] = Counter()
    pairs: set[tuple[str, str]] = set()
    chosen: list[ProbeSpec] = []
    left = [p for p in probes if crossing.get(p.id)]
    while left:

        def gain(p: ProbeSpec) -> tuple[int, int, int, int]:
            added = sum(1 for d in crossing[p.id] if count[d] < cover)
            passed = sum(1 for x in passing[p.id] if count[x] < pair_cover)
            viewed = sum(1 for x in clear[p.id] if count[x] < 1)
            return (
                added + passed + viewed,
                (p.src, p.dst) not in pairs,
                added,
                -len(crossing[p.id]),
            )

        best = max(left, key=gain)
        if gain(best)[0] == 0:
            break
        chosen.append(best)
        left.remove(best)
        pairs.add((best.src, best.dst))
        count.update(crossing[best.id] | passing[best.id] | clear[best.id])
    return sorted(chosen, key=lambda p: p.id)


def clear_views(ways: Sequence[str], rates: Mapping[str, float] | None) -> set[str]:
    """The directions of a probe's path ``ways`` it has a clear view of: no other
    direction of the path is slower (emulated rates). A train's second half arrives at its
    path's slowest link's rate (orchestrator.diagnosis.trains), so a direction slowed to a
    quarter shows in a train only where nothing else on the way is slower than that: on a
    fabric whose core runs at a third of its other links, every probe of a GPU's port that
    crosses the core reads a quarter-rate NIC link at three quarters of the core's rate,
    no slower than the core itself (seed 29: two such links missed). A probe between two
    GPUs of one ToR, or of one rail through its aggregation, sees it."""
    if not rates:
        return set()
    known = [d for d in ways if d in rates]
    return {d for d in known if all(rates[x] >= rates[d] for x in known if x != d)}


def pace_of(description: FabricDescription, path: TracedPath) -> int:
    """The pace of a probe's trains, bytes a second: :data:`PACE` times the slowest link
    its path crosses (emulated), so the trains' second half runs at that link's rate (or
    a slower one's), not at the pace."""
    slowest = min(
        (
            description.emulated_rate(link)
            for a, b in itertools.pairwise(path.nodes)
            for link in description.fabric.links_of(a)
            if b in (link.a, link.b)
        ),
        default=0.0,
    )
    return round(PACE * slowest / 8)


def budget(
    rates: Mapping[str, float],
    forward: Mapping[int, Sequence[str]],
    back: Mapping[int, Sequence[str]],
    interval: float,
    train_cycle: float,
) -> dict[int, tuple[int, int]]:
    """Per probe, (``every``, ``train_every``): send a message every ``every`` ticks of
    ``interval`` and a train every ``train_every`` of its turns (one per ``train_cycle``
    seconds), so that on every link direction of ``rates`` (bit/s, emulated) the probes
    crossing it (``forward``: their directions ``A>B``; ``back``: their
    acknowledgements') take at most :data:`MESSAGE_BUDGET` of its rate with their
    messages and :data:`TRAIN_BUDGET` with their trains. Each probe takes the thinning
    of the most crowded direction of its ways; its messages still go at least every
    :data:`MAX_MESSAGE_GAP_S` (the diagnosis reads 2 s without an acknowledgement as a
    stall).

    Why: the probes' load is the same in bytes on every link. At 12 Mbit/s the three to
    twelve probes that cross a direction (and the acknowledgements of up to 18 more) take
    0.7-2.6 % of it with their messages, within the budget; on
    hpn-like's 15:1 core, 0.8 Mbit/s at the validation's scale, seven of them took 12-25 %
    of a link the collectives' connections shared, and every collective measured 18-25 %
    below its forecast (docs/monitoring.md, "The probe mesh's budget")."""
    message_bits = (MESSAGE + HEADERS) * 8 / interval
    ack_bits = ACK_FRAME * 8 / interval
    segments = TRAIN / SEGMENT
    train_bits = (TRAIN + segments * HEADERS) * 8 / train_cycle
    train_ack_bits = segments * ACK_FRAME * 8 / train_cycle
    messages: dict[str, float] = defaultdict(float)
    trains: dict[str, float] = defaultdict(float)
    for probe, ways in forward.items():
        for d in ways:
            messages[d] += message_bits
            trains[d] += train_bits
        for d in back.get(probe, ()):
            messages[d] += ack_bits
            trains[d] += train_ack_bits
    most = max(1, int(MAX_MESSAGE_GAP_S / interval))
    out: dict[int, tuple[int, int]] = {}
    for probe, ways in forward.items():
        crossed = [d for d in (*ways, *back.get(probe, ())) if rates.get(d, 0.0) > 0]
        every = max((messages[d] / (MESSAGE_BUDGET * rates[d]) for d in crossed), default=1)
        train = max((trains[d] / (TRAIN_BUDGET * rates[d]) for d in crossed), default=1)
        out[probe] = (min(most, max(1, math.ceil(every))), max(1, math.ceil(train)))
    return out


def direction_rates(description: FabricDescription) -> dict[str, float]:
    """Every network link direction ``A>B`` and its emulated rate, bit/s (NVLink is inside
    a server, not the network's)."""
    rates = {}
    for link in description.fabric.links:
        if link.kind is not LinkKind.NVLINK:
            rate = description.emulated_rate(link)
            rates[f"{link.a}>{link.b}"] = rates[f"{link.b}>{link.a}"] = rate
    return rates


def reverse(probe: ProbeSpec) -> ProbeSpec:
    """The probe's acknowledgements, as a probe from its destination back: a hole on
    their way stalls the probe as surely as one on its own."""
    return ProbeSpec(
        probe.id, probe.dst, probe.src, probe.dst_ip, probe.dport, probe.src_ip, probe.sport
    )


def trace_probes(
    executor: Emulated, description: FabricDescription, probes: Sequence[ProbeSpec]
) -> dict[int, TracedPath]:
    """Each probe's path as the kernels and switches forward it now."""
    flows = [(five_tuple(p), p.src, p.dst) for p in probes]
    requests = flow_requests(executor, description, flows)
    with closing(open_control(executor)) as control:
        traced = trace_paths(description, requests, control) if requests else []
    return {p.id: path for p, path in zip(probes, traced, strict=True)}


def path_record(path: TracedPath) -> dict[str, Any]:
    return {
        "hops": [[h.node, h.in_port, h.out_port] for h in path.hops],
        "outcome": path.outcome,
        **({"reason": path.reason} if path.reason else {}),
    }


@dataclass
class Tracing:
    """The probes' paths as traced at ``t`` (epoch s), under ``policy``: their own and
    their acknowledgements' (``back``)."""

    t: float
    policy: str
    paths: dict[int, TracedPath]
    back: dict[int, TracedPath]

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 4),
            "policy": self.policy,
            "paths": {str(i): path_record(p) for i, p in sorted(self.paths.items())},
            "back": {str(i): path_record(p) for i, p in sorted(self.back.items())},
        }


class ProbeMesh:
    """The mesh of one run: planned and started under the first policy
    (:meth:`start`), traced again after every policy switch (:meth:`retrace`), stopped
    and written into the bundle (:meth:`stop`). Its prober is a process of the emulation's
    (started in a GPU's namespace and recorded there), so a run's teardown stops it
    whatever happens to this object."""

    def __init__(
        self,
        emulation: Emulated,
        description: FabricDescription,
        bundle: Path,
        *,
        interval: float = INTERVAL_S,
        sample: float = SAMPLE_S,
        seed: int = 0,
    ) -> None:
        self.emulation = emulation
        self.description = description
        self.bundle = Path(bundle)
        self.interval = interval
        self.sample = sample
        self.seed = seed
        self.probes: list[ProbeSpec] = []
        self.tracings: list[Tracing] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.train_cycle = TRAIN_CYCLE_S  # each probe's train this often, at most
        self.plan_seconds = 0.0
        self.uncovered: list[str] = []
        self.problems: list[str] = []

    def start(self, policy: str) -> None:
        began = time.monotonic()
        namespaces = self.emulation.netns_paths()
        gpus = [g for g in self.description.fabric.gpus if g in namespaces]
        pool = candidates(self.description, gpus, self.seed)
        traced = trace_probes(self.emulation, self.description, pool)
        wanted = all_directions(self.description)
        self.probes = [
            dataclasses.replace(p, pace=pace_of(self.description, traced[p.id]))
            for p in choose(pool, traced, wanted, rates=direction_rates(self.description))
        ]
        covered = {d for p in self.probes for d in directions(traced[p.id])}
        self.uncovered = sorted(wanted - covered)
        back = trace_probes(self.emulation, self.description, [reverse(p) for p in self.probes])
        self.tracings.append(
            Tracing(time.time(), policy, {p.id: traced[p.id] for p in self.probes}, back)
        )
        self.plan_seconds = time.monotonic() - began
        if not self.probes:
            self.problems.append("no candidate probe could be traced to its destination")
            return
        self.interval = max(self.interval, len(self.probes) / MESSAGES_PER_S)
        self.train_cycle = max(TRAIN_CYCLE_S, len(self.probes) / TRAINS_PER_S)
        thinned = budget(
            direction_rates(self.description),
            {p.id: directions(traced[p.id]) for p in self.probes},
            {p.id: directions(back[p.id]) for p in self.probes},
            self.interval,
            self.train_cycle,
        )
        self.probes = [
            dataclasses.replace(p, every=thinned[p.id][0], train_every=thinned[p.id][1])
            for p in self.probes
        ]
        self.write()  # the live diagnosis reads it while the run goes
        plan = {
            "out": str(self.bundle / PROBE_SAMPLES_FILE),
            "interval": self.interval,
            "sample": self.sample,
            "train": TRAIN,
            "train_cycle": self.train_cycle,
            "namespaces": {g: namespaces[g] for g in gpus},
            "probes": [p.to_dict() for p in self.probes],
        }
        self.process = self.emulation.popen(
            self.probes[0].src,
            [sys.executable, "-m", "orchestrator.testbed.prober"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(plan).encode())
        self.process.stdin.close()
        self.process.stdin = None

    def retrace(self, policy: str) -> None:
        if not self.probes:
            return
        traced = trace_probes(self.emulation, self.description, self.probes)
        back = trace_probes(self.emulation, self.description, [reverse(p) for p in self.probes])
        self.tracings.append(Tracing(time.time(), policy, traced, back))
        self.write()

    def stop(self) -> None:
        """Stop the prober (SIGTERM: it writes a last sample) and write ``probes.json``."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                _, err = process.communicate(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                _, err = process.communicate()
                self.problems.append(f"the prober did not stop within {STOP_S:g} s")
            if process.returncode not in (0, -signal.SIGTERM):
                text = err.decode(errors="replace").strip().splitlines()
                self.problems.append(
                    f"the prober exited with {process.returncode}: {text[-1] if text else ''}"
                )
        self.write()

    def summary(self) -> dict[str, Any]:
        """What run.json keeps of the mesh."""
        return {
            "probes": len(self.probes),
            "interval": self.interval,
            "plan_seconds": round(self.plan_seconds, 3),
            "uncovered": self.uncovered,
            "problems": self.problems,
        }

    def write(self) -> None:
        document = {
            "version": 1,
            "interval": self.interval,
            "sample": self.sample,
            "message": MESSAGE,
            "train": TRAIN,
            "train_cycle": self.train_cycle,
            "probes": [p.to_dict() for p in self.probes],
            "tracings": [t.to_dict() for t in self.tracings],
            "summary": self.summary(),
        }
        (self.bundle / PROBES_FILE).write_text(json.dumps(document, indent=1) + "\n")
