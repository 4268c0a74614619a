"""The pure parts of benchmarks/diagnosis.py: the suite, the fabric usage, matching, tables."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orchestrator.run.experiment import parse_experiment
from tests.helpers import REPO, load_benchmark
from topologies.catalog import preset_path
from topologies.generators import build_fabric
from topologies.model import Fabric, LinkKind, Tier
from topologies.spec import FabricSpec, load_fabric_spec, parse_fabric_spec

POLICIES = ["ecmp", "path-pinned"]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("diagnosis")


@pytest.fixture(scope="module")
def fabrics(
    bench: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[str, FabricSpec]]:
    directory = tmp_path_factory.mktemp("fabrics")
    resolved: dict[str, tuple[str, FabricSpec]] = bench.resolve_fabrics(
        list(bench.DEFAULT_FABRICS), directory
    )
    return resolved


@pytest.fixture(scope="module")
def models(fabrics: dict[str, tuple[str, FabricSpec]]) -> dict[str, Fabric]:
    return {name: build_fabric(spec) for name, (_, spec) in fabrics.items()}


def link_named(fabric: Fabric, target: str, bench: ModuleType) -> LinkKind:
    ends = bench.link_ends(target)
    assert ends is not None, target
    (kind,) = {x.kind for x in fabric.links if {x.a, x.b} == ends}
    return kind


def test_the_default_suite_covers_every_kind_fabric_policy_and_onset(
    bench: ModuleType, models: dict[str, Fabric]
) -> None:
    scenarios = bench.suite(models, POLICIES, bench.KINDS, 4, 10, seed=1)
    faulty = [s for s in scenarios if s.kind is not None]
    assert len(faulty) >= 30 and len(scenarios) - len(faulty) >= 10
    assert Counter(s.kind for s in faulty) == {k: 4 for k in bench.KINDS}
    assert {s.fabric for s in scenarios} == set(models)
    for kind in bench.KINDS:
        mine = [s for s in faulty if s.kind == kind]
        assert {(s.fabric, s.policy) for s in mine} == {(f, p) for f in models for p in POLICIES}
        assert {s.onset for s in mine} == {"start", "mid-run"}
    assert {s.collective for s in faulty} == {"ring", "direct"}
    healthy = [s for s in scenarios if s.kind is None]
    assert {s.collective for s in healthy} == set(bench.HEALTHY_SHAPES)
    for shape in bench.HEALTHY_SHAPES:  # each shape on every fabric, not one alone
        assert {s.fabric for s in healthy if s.collective == shape} == set(models)
    assert {s.index for s in scenarios} == set(range(1, len(scenarios) + 1))
    assert len({s.name for s in scenarios}) == len(scenarios)
    # a suite cut short still has every kind: the first round holds one run of each
    assert {s.kind for s in scenarios[: len(bench.KINDS) + 3]} >= set(bench.KINDS)


def test_link_faults_reach_every_tier_and_switch_faults_both_tiers(
    bench: ModuleType, models: dict[str, Fabric]
) -> None:
    scenarios = bench.suite(models, POLICIES, bench.KINDS, 4, 0, seed=1)
    link_tiers = {s.tier for s in scenarios if s.kind.startswith("link-")}
    assert link_tiers == {"nic", "tor_agg", "agg_core"}
    for kind in ("switch-down", "blackhole"):
        assert {s.tier for s in scenarios if s.kind == kind} == {"tor", "agg"}
    stragglers = [s.target for s in scenarios if s.kind == "straggler"]
    assert len(set(stragglers)) >= 3


@pytest.mark.parametrize("seed", [1, 2, 3, 17])
def test_every_scenario_is_a_valid_experiment_on_its_fabric(
    bench: ModuleType,
    fabrics: dict[str, tuple[str, FabricSpec]],
    models: dict[str, Fabric],
    seed: int,
) -> None:
    """The experiment parser validates every fault against the fabric model (targets,
    ``A>B`` only where a kind takes one direction, a blackhole's switch, the straggler's
    GPU among the run's): what ``astral run`` checks before bring-up."""
    for scenario in bench.suite(models, POLICIES, bench.KINDS, 4, 10, seed):
        ref, spec = fabrics[scenario.fabric]
        document = bench.experiment_document(scenario, ref, spec)
        parsed = parse_experiment(document, "test", REPO)
        assert len(parsed.gpus) == bench.rank_count(models[scenario.fabric])
        assert len(parsed.faults) == (0 if scenario.kind is None else 1)
        # the timed batch lasts long enough for a mid-run fault and the time after it,
        # however short the fabric's operations are
        fabric = models[scenario.fabric]
        if scenario.kind is None:
            continue
        assert scenario.collective in bench.COLLECTIVES
        assert parsed.min_batch == bench.COLLECTIVE_SECONDS >= bench.MID_RUN + bench.FAULT_SECONDS
        if scenario.kind.startswith("link-"):
            assert link_named(fabric, scenario.target, bench).value == scenario.tier
        elif scenario.kind in ("switch-down", "blackhole"):
            assert fabric.switches[scenario.target].tier.value == scenario.tier
        elif scenario.kind == "straggler":
            assert scenario.target in parsed.gpus
        else:
            assert scenario.target == "controller"


def test_healthy_runs_take_every_shape_over_every_fabric_and_policy(
    bench: ModuleType,
    fabrics: dict[str, tuple[str, FabricSpec]],
    models: dict[str, Fabric],
) -> None:
    """A user's experiment sweeps sizes and mixes collectives: the healthy runs do too,
    and every one is an experiment ``astral run`` accepts."""
    healthy = bench.healthy_scenarios(16, list(models), POLICIES)
    combos = Counter((s.collective, s.fabric, s.policy) for s in healthy)
    assert set(combos) == {
        (c, f, p) for c in bench.HEALTHY_SHAPES for f in models for p in POLICIES
    }
    for scenario in healthy:
        ref, spec = fabrics[scenario.fabric]
        parsed = parse_experiment(bench.experiment_document(scenario, ref, spec), "t", REPO)
        ops = {(c.op, c.algorithm) for c in parsed.collectives}
        sizes = parsed.sizes.values()
        if scenario.collective == "sweep":
            assert ops == {("all-reduce", "ring"), ("all-to-all", "direct")}
            assert sizes == [64 << 10, 256 << 10, 1 << 20, 4 << 20]
        elif scenario.collective == "mixed":
            assert {op for op, _ in ops} == {
                "all-reduce",
                "all-to-all",
                "all-gather",
                "reduce-scatter",
            }
            assert ("all-reduce", "hierarchical") in ops and len(sizes) == 1
        else:
            assert len(ops) == 1 and len(sizes) == 1


def test_another_seed_draws_another_suite(bench: ModuleType, models: dict[str, Fabric]) -> None:
    one = bench.suite(models, POLICIES, bench.KINDS, 4, 10, seed=1)
    assert one == bench.suite(models, POLICIES, bench.KINDS, 4, 10, seed=1)
    two = bench.suite(models, POLICIES, bench.KINDS, 4, 10, seed=2)
    assert [s.target for s in one] != [s.target for s in two]


def test_vary_draws_each_faults_magnitude_and_keeps_the_rest_of_the_suite(
    bench: ModuleType, models: dict[str, Fabric]
) -> None:
    fixed = bench.suite(models, POLICIES, bench.KINDS, 4, 10, seed=3)
    varied = bench.suite(models, POLICIES, bench.KINDS, 4, 10, seed=3, vary=True)
    assert [(s.kind, s.target, s.at, s.policy) for s in fixed] == [
        (s.kind, s.target, s.at, s.policy) for s in varied
    ]
    drawn: dict[str, set[Any]] = {}
    for s in varied:
        for key, options in bench.VARIED.get(s.kind, {}).items():
            assert s.params[key] in options
            drawn.setdefault(f"{s.kind}.{key}", set()).add(s.params[key])
    assert set(drawn) == {f"{k}.{p}" for k, v in bench.VARIED.items() for p in v}
    assert any(len(values) > 1 for values in drawn.values())  # not one magnitude each
    assert all(s.params == bench.PARAMS.get(s.kind, s.params) or s.kind == "blackhole"
               for s in fixed if s.kind)  # fmt: skip


def test_the_ring_usage_follows_the_fabric_model(
    bench: ModuleType, models: dict[str, Fabric]
) -> None:
    fabric = models["astral-small"]
    usage = bench.ring_usage(fabric, bench.ring_gpus(fabric))
    # ranks 0-1, 2-3, ... share a server: only the odd-to-even hops cross the network
    assert usage.pairs == [("p0s0g1", "p0s1g0"), ("p0s1g1", "p1s0g0"),
                           ("p1s0g1", "p1s1g0"), ("p1s1g1", "p0s0g0")]  # fmt: skip
    senders = {src for src, _ in usage.pairs}
    assert {u for u, _ in usage.links[LinkKind.NIC]} == senders  # the sending side only
    assert len(usage.links[LinkKind.NIC]) == 2 * len(senders)  # both NIC ports of each
    for u, v in usage.links[LinkKind.TOR_AGG] + usage.links[LinkKind.AGG_CORE]:
        assert u in fabric.switches and v in fabric.switches
    tors = usage.switches[Tier.TOR]
    assert all(any(x.other(t) in senders for x in fabric.links_of(t)) for t in tors)
    for switch in usage.switches[Tier.TOR] + usage.switches[Tier.AGG]:
        assert set(usage.destinations[switch]) <= {d for _, d in usage.pairs}
    fat = models["fat-tree-2pod"]
    assert fat.name == "fat-tree-2pod" and fat.spec.nic_ports == 1
    assert set(bench.ring_usage(fat, bench.ring_gpus(fat)).links) == set(bench.LINK_TIERS)


def test_a_rail_only_ring_leaves_by_the_mate_on_the_receivers_rail(bench: ModuleType) -> None:
    """A rail-only fabric's cross-rail hop crosses NVLink to the sender's server-mate on the
    receiver's rail and leaves by that mate's NIC: the suite puts link faults there."""
    fabric = build_fabric(load_fabric_spec(preset_path("rail-only-small")))
    usage = bench.ring_usage(fabric, bench.ring_gpus(fabric))
    assert usage.pairs and set(usage.links) >= {LinkKind.NIC, LinkKind.TOR_AGG}
    wires = {fabric.wire_source(src, dst) for src, dst in usage.pairs}
    assert {u for u, _ in usage.links[LinkKind.NIC]} == wires
    assert any(fabric.gpus[src].rail != fabric.gpus[dst].rail for src, dst in usage.pairs)


def test_shortest_path_links_are_exactly_the_equal_cost_paths(
    bench: ModuleType, models: dict[str, Fabric]
) -> None:
    fabric = models["astral-small"]
    same_tor = bench.shortest_path_links(fabric, "p0s0g0", "p0s1g0")
    assert same_tor == {("p0s0g0", "p0r0t0"), ("p0r0t0", "p0s1g0"),
                        ("p0s0g0", "p0r0t1"), ("p0r0t1", "p0s1g0")}  # fmt: skip
    cross = bench.shortest_path_links(fabric, "p0s0g0", "p1s0g1")
    assert not any(u in fabric.gpus and u != "p0s0g0" for u, _ in cross)  # no GPU transit
    assert {v for _, v in cross if v.startswith("c")} == {"c0", "c1", "c2", "c3"} & {
        v for _, v in cross
    }


@pytest.mark.parametrize(
    ("component", "target", "fault", "expected", "hit"),
    [
        ("link", "p0r0a1>c2", "slow", ("link", "p0r0a1-c2", "slow"), True),
        ("link", "c2>p0r0a1", "slow", ("link", "p0r0a1-c2", "slow"), True),
        ("link", "c2-p0r0a1", "slow", ("link", "p0r0a1>c2", "slow"), True),
        ("link", "p0r0a1-c2", "lossy", ("link", "p0r0a1-c2", "slow"), False),
        ("link", "p0r0a1-c3", "slow", ("link", "p0r0a1-c2", "slow"), False),
        ("switch", "p0r0a1", "down", ("link", "p0r0a1-c2", "down"), False),
        ("switch", "p1r1t0", "down", ("switch", "p1r1t0", "down"), True),
        ("switch", "p1r1t0", "blackhole", ("switch", "p1r1t0", "down"), False),
        ("gpu", "p1s0g1", "straggler", ("gpu", "p1s0g1", "straggler"), True),
        ("gpu", "p1s0g0", "straggler", ("gpu", "p1s0g1", "straggler"), False),
        ("controller", "controller", "controller outage",
         ("controller", "controller", "controller outage"), True),
    ],
)  # fmt: skip
def test_a_suspect_matches_by_component_target_and_fault(
    bench: ModuleType,
    component: str,
    target: str,
    fault: str,
    expected: tuple[str, str, str],
    hit: bool,
) -> None:
    assert bench.matches(component, target, fault, expected) is hit


@dataclass
class FakeSuspect:
    """A stand-in for orchestrator.diagnosis.Suspect: the attributes the scoring reads."""

    component: str
    target: str
    fault: str
    score: float = 1.0
    evidence: list[str] = field(default_factory=list)
    onset: float | None = None


def test_scoring_finds_the_rank_and_the_onset_of_the_matching_suspect(bench: ModuleType) -> None:
    scenario = bench.Scenario(1, "link-down", "astral-small", "ecmp", "ring", "p0s0g1-p0r1t0",
                              tier="nic")  # fmt: skip
    outcome = bench.Outcome(scenario, "ok", applied=100.0)
    suspects = [FakeSuspect("switch", "p0r1t0", "down"),
                FakeSuspect("link", "p0r1t0>p0s0g1", "down", onset=100.4)]  # fmt: skip
    bench.score(outcome, suspects)
    assert outcome.hit_rank == 2 and outcome.delay == pytest.approx(0.4)
    healthy = bench.Outcome(bench.Scenario(2, None, "astral-small", "ecmp", "ring"), "ok")
    bench.score(healthy, suspects)
    assert healthy.hit_rank is None


def outcome_of(bench: ModuleType, kind: str | None, top: str | None, hit: int | None) -> object:
    scenario = bench.Scenario(1, kind, "astral-small", "ecmp", "ring", "x")
    suspects = [] if top is None else [
        {"component": "link", "target": "a-b", "fault": top, "score": 0.9, "evidence": []}
    ]  # fmt: skip
    diagnosis = {"healthy": top is None, "suspects": suspects, "seconds": 0.5}
    return bench.Outcome(scenario, "ok", 20.0, diagnosis, hit_rank=hit)


def test_the_tables_count_verdicts_accuracy_and_false_alarms(bench: ModuleType) -> None:
    outcomes = [
        outcome_of(bench, "link-down", "down", 1),
        outcome_of(bench, "link-down", "flapping", 2),
        outcome_of(bench, "link-slow", None, None),
        outcome_of(bench, None, None, None),
        outcome_of(bench, None, "slow", None),
        bench.Outcome(
            bench.Scenario(6, "straggler", "astral-small", "ecmp", "ring", "g"),
            "failed",
            error="no bundle (failed)",
        ),
    ]
    table = bench.confusion_table(outcomes)
    heads = table[0].split()
    rows = {line.split()[0]: line.split()[1:] for line in table[1:]}
    assert list(rows) == ["link-slow", "link-down", "straggler", "healthy"]  # KINDS order
    column = {name: i for i, name in enumerate(heads[3:])}  # after "injected \ top-1"
    assert rows["link-down"][column["down"]] == "1" and rows["link-down"][column["flap"]] == "1"
    assert rows["link-slow"][column["healthy"]] == "1"
    assert rows["healthy"][column["slow"]] == "1" and rows["healthy"][-1] == "2"
    assert rows["straggler"][column["error"]] == "1"
    lines = bench.accuracy_lines(outcomes)
    text = "\n".join(lines)
    words = [line.split() for line in lines]
    assert ["link-down", "1/2", "(50%)", "2/2", "(100%)"] in words
    assert ["all", "faults", "1/3", "(33%)", "2/3", "(67%)"] in words
    assert "false alarms on healthy runs: 1/2 (50%)" in text
    assert "fault runs called healthy: 1/3 (33%)" in text
    assert "not diagnosed: 1 (1 x no bundle (failed))" in text
    assert "time to localize (Diagnosis.seconds): median 0.50 s" in "\n".join(
        bench.timing_lines(outcomes)
    )
    lines = bench.report(outcomes)
    assert any("ALARM" in line for line in lines) and any(" #2 " in line for line in lines)


def test_a_saved_suite_is_read_back_in_order(bench: ModuleType, tmp_path: Path) -> None:
    for index, kind in ((2, None), (1, "straggler"), (3, "link-down")):
        scenario = bench.Scenario(index, kind, "astral-small", "ecmp", "ring", "p0s0g0")
        run_dir = tmp_path / "runs" / scenario.name
        run_dir.mkdir(parents=True)
        (run_dir / "scenario.json").write_text(json.dumps(scenario.to_dict()))
        if index != 3:  # the third never got its bundle (a suite cut short)
            (run_dir / "bundle").mkdir()
            (run_dir / "bundle" / "results.sqlite").write_bytes(b"")
            (run_dir / "outcome.json").write_text("{}")
    runs = bench.saved_runs(tmp_path)
    assert [s.index for _, s in runs] == [1, 2]
    outcome = bench.Outcome(runs[0][1], "ok", 12.5, hit_rank=1)
    assert bench.Outcome.from_dict(json.loads(json.dumps(outcome.to_dict()))) == outcome


def test_the_command_line_checks_kinds_and_quick_means_a_handful(bench: ModuleType) -> None:
    args = bench.parse_args(["--quick", "--kinds", "straggler,blackhole"])
    assert (args.per_kind, args.healthy, args.kinds) == (1, 1, ["straggler", "blackhole"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--kinds", "link-melt"])


def test_a_target_is_crossed_when_a_recorded_path_holds_it(bench: ModuleType) -> None:
    def scenario(kind: str, target: str, tier: str, **params: str) -> object:
        return bench.Scenario(1, kind, "astral-small", "ecmp", "ring", target, params, tier=tier)

    pinned = [["p0s0g1", "p0r1t0", "p0r1a0", "c0", "p0r0a0", "p0r0t0", "p0s1g0"]]
    first_hops = [["p0s0g1", "p0r1t1"]]
    slow = scenario("link-slow", "c0>p0r1a0", "agg_core")
    assert bench.crossed(slow, pinned) is True  # either direction names the link
    other = scenario("link-down", "p0r1a0-c1", "agg_core")
    assert bench.crossed(other, pinned) is False
    assert bench.crossed(other, pinned + first_hops) is None  # the rest of one path unknown
    assert bench.crossed(scenario("switch-down", "p0r0a0", "agg"), pinned) is True
    hole = scenario("blackhole", "p0r0a0", "agg", destination="p1s0g0")
    assert bench.crossed(hole, pinned) is False  # that path goes elsewhere
    assert bench.crossed(scenario("straggler", "p0s0g1", "gpu"), pinned) is None


def test_kinds_fabrics_and_policies_select_saved_runs(bench: ModuleType) -> None:
    args = bench.parse_args(["--kinds", "straggler", "--policies", "ecmp"])
    assert bench.selected(bench.Scenario(1, "straggler", "astral-small", "ecmp", "ring"), args)
    assert bench.selected(bench.Scenario(2, None, "fat-tree-2pod", "ecmp", "ring"), args)
    assert not bench.selected(bench.Scenario(3, "blackhole", "astral-small", "ecmp", "ring"), args)
    assert not bench.selected(
        bench.Scenario(4, "straggler", "astral-small", "path-pinned", "ring"), args
    )
    # a fabric file names its runs by its stem, as the suite keyed them when it ran
    files = bench.parse_args(["--fabrics", "/x/fat-tree-3pod-r8.yaml,astral-small"])
    assert bench.selected(bench.Scenario(5, None, "fat-tree-3pod-r8", "ecmp", "ring"), files)
    assert bench.selected(bench.Scenario(6, None, "astral-small", "ecmp", "ring"), files)


def test_a_slower_core_shrinks_the_operation_so_a_fault_spans_several(bench: ModuleType) -> None:
    """An operation whose ring crosses a core at a third of the NIC rate takes three times
    as long; the size shrinks by as much (whole 64 KiB, at least 256 KiB) so that a 7 s
    fault still covers several operations. A fabric without a slower tier keeps 1 MiB."""
    from topologies.spec import parse_fabric_spec

    base = {
        "name": "x", "kind": "astral", "pods": 2, "servers_per_pod": 2, "gpus_per_server": 2,
        "nic_ports": 1, "switch": {"radix": 4, "down_ports": 2},
    }  # fmt: skip
    assert bench.size_for(parse_fabric_spec(base, "x")) == 1 << 20
    over = parse_fabric_spec(base | {"oversubscription": {"tor": 1, "agg": 2}}, "x")
    assert bench.size_for(over) == 512 << 10
    far = parse_fabric_spec(base | {"oversubscription": {"tor": 1, "agg": 15}}, "x")
    assert bench.size_for(far) == 256 << 10


def test_a_fabric_with_fewer_gpus_than_the_ranks_runs_them_all(
    bench: ModuleType, tmp_path: Path
) -> None:
    """A fabric not in the repository with 6 GPUs: every scenario is a valid experiment
    placing all 6 (the suite's runs asked for 8 and failed before bring-up)."""
    small = tmp_path / "astral-1pod-3x2.yaml"
    small.write_text(
        "name: astral-1pod-3x2\nkind: astral\npods: 1\nservers_per_pod: 3\n"
        "gpus_per_server: 2\nnic_ports: 1\nswitch: {radix: 4, down_ports: 2}\n"
        "oversubscription: {tor: 2, agg: 1}\nemulation: {scale: 1.0e-4}\n"
    )
    resolved = bench.resolve_fabrics([str(small)], tmp_path / "out")
    built = {name: build_fabric(spec) for name, (_, spec) in resolved.items()}
    for scenario in bench.suite(built, POLICIES, bench.KINDS, 2, 2, 5):
        ref, spec = resolved[scenario.fabric]
        parsed = parse_experiment(bench.experiment_document(scenario, ref, spec), "test", REPO)
        assert len(parsed.gpus) == 6


def test_a_run_takes_whole_servers_so_that_every_shape_runs(
    bench: ModuleType, tmp_path: Path
) -> None:
    # a fabric of 3-GPU servers: 8 GPUs would leave the third server two, and the mixed
    # healthy shape's hierarchical all-reduce cannot run on that (seed 49's run 24 failed)
    document = {
        "name": "three-per-server", "kind": "astral", "pods": 1, "servers_per_pod": 3,
        "gpus_per_server": 3, "nic_ports": 1, "switch": {"radix": 6, "down_ports": 3},
        "oversubscription": {"tor": 1, "agg": 2},
    }  # fmt: skip
    spec = parse_fabric_spec(document)
    fabric = build_fabric(spec)
    assert bench.rank_count(fabric) == 6
    scenario = bench.Scenario(1, None, "three-per-server", "ecmp", "mixed")
    path = tmp_path / "three-per-server.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML
    parsed = parse_experiment(bench.experiment_document(scenario, str(path), spec), "test", REPO)
    assert len(parsed.gpus) == 6


def test_a_resume_refuses_a_suite_drawn_otherwise(bench: ModuleType, tmp_path: Path) -> None:
    """--resume counts a suite's finished runs: with another seed, --vary or other runs
    drawn, they would sit beside runs of another suite."""
    saved = tmp_path / "suite.json"
    document = {"seed": 3, "vary": False, "fabrics": {}, "scenarios": [{"index": 1}]}
    assert bench.resumed_mismatch(saved, document) is None  # nothing saved yet
    saved.write_text(json.dumps({k: v for k, v in document.items() if k != "vary"}))
    assert bench.resumed_mismatch(saved, document) is None  # saved before --vary: not varied
    assert "vary False, not True" in bench.resumed_mismatch(saved, {**document, "vary": True})
    assert "seed 3, not 4" in bench.resumed_mismatch(saved, {**document, "seed": 4})
    other = {**document, "scenarios": [{"index": 2}]}
    assert "its runs differ" in bench.resumed_mismatch(saved, other)
