"""Every fabric connection's path as the switches forward it, on a real astral-small.

One short run through the runner (the code ``astral run`` runs, on the ``astral_fabric``
fixture's testbed): a ring all-reduce of 512 KiB between two GPUs in different pods
(p0s0g0 and p1s1g1), one connection each way, under ``ecmp`` then ``path-pinned``; a
ring all-gather after each, because the counters are read once the run is over and the
last poll may come before the last configuration's end (its hops then have no figure). With
one connection per direction, every link direction a connection's data crosses carries it
alone (besides the other connection's ACKs), so the switches' counters tell its path from
the others: each hop the trace recorded must have counted at least the connection's bytes,
and each equal-cost alternative the switch did not take far fewer. Under ``ecmp`` every
path must be ``traced`` GPU to GPU (the first hop was all the monitor knew before); under
``path-pinned``, ``pinned``, the trace agreeing with the published path (no warning).

Needs root and Open vSwitch (tests/conftest.py skips or, under CI, fails without them).
"""

from __future__ import annotations

import itertools
import json
from contextlib import closing
from pathlib import Path

import pytest

from controllers.ovshash import pick
from controllers.pinning import PORT_BASE
from controllers.plan import Bucket, GroupEntry, Packet
from controllers.routing import RoutingGraph
from controllers.tracer import follow
from orchestrator.emulation.pathtrace import TRACED, TraceRequest, open_control, trace_paths
from orchestrator.forecast.paths import PolicyRouter
from orchestrator.monitor import record
from orchestrator.pytest_plugin import FabricFactory, FabricHandle
from orchestrator.results import ResultsBundle
from orchestrator.run.experiment import parse_experiment
from orchestrator.run.runner import RunOptions, RunOutcome
from orchestrator.worker.spec import WORKER_PORT
from tests.helpers import REPO, preset_fabric
from topologies.fivetuple import FiveTuple

pytestmark = pytest.mark.integration

GPUS = ["p0s0g0", "p1s1g1"]
EXPERIMENT = {
    "name": "it-path-trace",
    "fabric": "astral-small",
    "policies": ["ecmp", "path-pinned"],
    "collectives": [
        {"op": "all-reduce", "algorithm": "ring"},
        {"op": "all-gather", "algorithm": "ring"},
    ],
    "sizes": {"min": "512K", "max": "512K"},
    "iterations": 2,
    "warmup": 1,
    "placement": {"gpus": GPUS},
}
CARRIED = 0.95  # a hop counted at least this share of the connection's bytes (frames > payload)
ALTERNATIVE = 0.1  # an uplink not taken counted less than this share (the other one's ACKs)


@pytest.fixture(scope="module")
def fabric(astral_fabric: FabricFactory) -> FabricHandle:
    return astral_fabric("astral-small", policy="ecmp")


@pytest.fixture(scope="module")
def run(
    fabric: FabricHandle, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RunOutcome, list[str]]:
    said: list[str] = []
    spec = parse_experiment(EXPERIMENT, "test_path_trace.py", REPO)
    out = tmp_path_factory.mktemp("trace") / "bundle"
    options = RunOptions(out=out, plots=False, channels=1, force=True)
    outcome = fabric.run_experiment(spec, options, say=said.append)
    assert outcome.status == "ok", outcome.error
    return outcome, said


def senders(bundle: ResultsBundle, policy: str) -> list[tuple[int, int, float, float]]:
    """(connection id, bytes it moved, first and last sample) of every fabric sender end
    of the all-reduce under ``policy``."""
    configs = {
        c.id for c in bundle.configurations() if c.policy == policy and c.collective == "all-reduce"
    }
    out = []
    for c in bundle.connections():
        if c.config_id in configs and c.link == "fabric" and c.rank == c.src_rank:
            ((moved, first, last),) = bundle.sql(
                "SELECT SUM(bytes), MIN(t), MAX(t) FROM connection_samples WHERE connection_id = ?",
                (c.id,),
            )
            out.append((c.id, int(moved), float(first), float(last)))
    return out


def test_ecmp_paths_are_traced_gpu_to_gpu_and_the_counters_confirm_every_hop(
    run: tuple[RunOutcome, list[str]],
) -> None:
    outcome, _ = run
    assert outcome.bundle is not None
    with ResultsBundle.open(outcome.bundle) as bundle:
        graph = RoutingGraph(preset_fabric("astral-small"))
        paths = bundle.paths()
        moving = senders(bundle, "ecmp")
        assert len(moving) == 2  # one connection each way
        for connection_id, moved, first, last in moving:
            assert moved >= 512 << 10
            hops = paths[connection_id]
            assert {h.source for h in hops} == {record.TRACED}
            assert {hops[0].node, hops[-1].node} == set(GPUS) and len(hops) == 7
            dist = graph.distances_to(hops[-1].node)
            alternatives = 0
            for hop, after in itertools.pairwise(hops):
                assert hop.counter_bytes is not None and hop.counter_bytes >= CARRIED * moved, (
                    f"{hop.node} port {hop.out_port} counted {hop.counter_bytes} of {moved}"
                )
                if hop.node not in graph.switches:
                    continue
                others = [a for a in graph.next_hops(hop.node, hops[-1].node, dist)]
                assert after.node in {a.neighbor for a in others}  # a shortest path
                for other in others:
                    if other.port == hop.out_port:
                        continue
                    alternatives += 1
                    counted = bundle.counter_delta(hop.node, other.port, "tx_bytes", first, last)
                    assert counted is not None and counted < ALTERNATIVE * moved, (
                        f"{hop.node} sent {counted} bytes out of port {other.port}, which the "
                        f"trace says the connection did not take (it took {hop.out_port})"
                    )
            assert alternatives >= 3  # both ToRs' and the aggregation's uplinks, at least


def test_path_pinned_paths_are_the_published_ones_and_confirmed(
    run: tuple[RunOutcome, list[str]],
) -> None:
    outcome, said = run
    assert outcome.bundle is not None
    assert not [line for line in said if "published path" in line or "traced to" in line]
    with ResultsBundle.open(outcome.bundle) as bundle:
        paths = bundle.paths()
        for connection_id, moved, _, _ in senders(bundle, "path-pinned"):
            hops = paths[connection_id]
            assert {h.source for h in hops} == {record.PINNED} and len(hops) == 7
            assert all(h.counter_bytes is not None and h.counter_bytes >= CARRIED * moved
                       for h in hops[:-1])  # fmt: skip


def test_each_configuration_was_traced_and_what_it_cost_is_kept(
    run: tuple[RunOutcome, list[str]],
) -> None:
    outcome, _ = run
    assert outcome.bundle is not None
    traces = json.loads((Path(outcome.bundle) / "run.json").read_text())["path_traces"]
    assert [(t["policy"], t["collective"]) for t in traces] == [
        (p, c) for p in ("ecmp", "path-pinned") for c in ("all-reduce (ring)", "all-gather (ring)")
    ]
    for t in traces:
        assert t["connections"] == 2 and t["outcomes"] == {"traced": 2}
        assert t["traces"] == 10 and t["via"] == "control socket"  # 5 switches each
        assert 0 < t["switch_seconds"] <= t["seconds"] < 5.0


def test_the_bucket_every_ecmp_switch_picks_is_computed_as_the_switch_picks_it(
    fabric: FabricHandle,
) -> None:
    """Open vSwitch's choice in each select group (selection method ``hash``), computed
    outside the switch (controllers.ovshash, what the forecast routes ECMP by), against
    ``ofproto/trace`` hop by hop: 96 five-tuples between GPUs of different servers, by each
    of their NIC ports, all the same path both ways, and spread over several paths."""
    fabric.use_policy("ecmp")
    description = fabric.testbed.description
    plan = PolicyRouter(description, "ecmp").plan
    gpus = [g.name for g in description.fabric.gpus_by_rank()]
    servers = {g: description.fabric.gpus[g].server for g in gpus}
    pairs = [(a, b) for a in gpus for b in gpus if servers[a] != servers[b]][::5][:24]
    requests, computed = [], []
    for k, (src, dst) in enumerate(p for p in pairs for _ in range(4)):
        nic = description.addresses[src].nics[k % len(description.addresses[src].nics)]
        five = FiveTuple(
            description.addresses[src].fabric_ip,
            PORT_BASE + 7 * k,
            description.addresses[dst].fabric_ip,
            WORKER_PORT,
        )
        packet = Packet.tcp(five.src_ip, five.dst_ip, five.src_port, five.dst_port)

        def choose(
            switch: str, group: GroupEntry, live: list[Bucket], p: Packet = packet
        ) -> Bucket:
            picked = pick(group, live, p)
            assert picked is not None, f"{switch}: its select group's choice is not computed"
            return picked

        computed.append((src, *follow(description, plan, nic.peer, packet, choose=choose)))
        requests.append(TraceRequest(five, src, dst, nic.port))
    with closing(open_control(fabric.testbed.emulation)) as control:
        traced = trace_paths(description, requests, control)
    assert [t.outcome for t in traced] == [TRACED] * len(requests)
    assert [t.nodes for t in traced] == computed
    assert len(set(computed)) > len(pairs)  # the hash spreads a pair's connections
