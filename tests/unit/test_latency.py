"""Scaled latency: the spec's figures, the one-way latency of every path, what a step waits.

The pure parts (durations, the spec's ``latency`` section, path latencies from the fabric
model, the per-step wait, the experiment's override and estimate) are checked on the
shipped presets; two real worker processes on loopback check that an operation really
takes at least the latency the launch configured (not how much longer: that is
benchmarks/latency.py's measurement).
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.collectives.latency import (
    LatencyTable,
    StepLatency,
    operation_latency,
)
from orchestrator.collectives.plans import Layout, PlanStep, Region, Transfer, default_registry
from orchestrator.run.experiment import load_experiment
from orchestrator.worker.launcher import Launcher
from orchestrator.worker.spec import CollectiveTest, LaunchOptions, loopback_workers
from tests.helpers import REPO, preset_fabric, preset_spec
from topologies.description import FabricDescription
from topologies.errors import ExperimentError, FabricSpecError
from topologies.fabricspec import DEFAULT_LATENCY, EmulationSpec, LatencySpec
from topologies.generators import build_fabric
from topologies.latency import (
    applied_latency,
    latency_record,
    latency_title,
    pair_latencies,
)
from topologies.model import Fabric
from topologies.spec import parse_fabric_spec
from topologies.units import format_duration, parse_duration

US = 1e-6


def at_scale(fabric: Fabric, scale: float) -> Fabric:
    return build_fabric(replace(fabric.spec, emulation=EmulationSpec(scale)))


# --- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("600ns", 6e-7), ("0.6us", 6e-7), ("0.6\u00b5s", 6e-7), ("2ms", 2e-3), ("1s", 1.0),
     (1.3, 1.3e-6), (0, 0.0), ("5", 5e-6), ("1e-1us", 1e-7)],
)  # fmt: skip
def test_durations_as_people_write_them(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["fast", "1 h", "-1us", -1, True, None, [1], "1usx"])
def test_a_malformed_duration_names_the_forms(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_durations_print_in_the_unit_that_reads_best() -> None:
    assert format_duration(6e-7) == "0.6us"
    assert format_duration(0.0167) == "16.7ms"
    assert format_duration(0.085) == "85ms"
    assert format_duration(2.5) == "2.5s"


# --- the spec's latency section ---------------------------------------------------------------


def fabric_doc(**latency: object) -> dict[str, object]:
    doc = dict(preset_spec().to_dict())
    doc.pop("latency")
    doc.update(latency)
    return doc


def test_latency_is_on_with_the_published_defaults_unless_said_otherwise() -> None:
    spec = parse_fabric_spec(fabric_doc())
    assert spec.latency == LatencySpec()
    assert spec.latency.enabled
    assert spec.latency.components() == DEFAULT_LATENCY
    assert parse_fabric_spec(fabric_doc(latency="on")).latency == LatencySpec()


@pytest.mark.parametrize("off", ["off", False])  # YAML 1.1 reads a bare `off` as false
def test_latency_off_turns_it_off(off: object) -> None:
    spec = parse_fabric_spec(fabric_doc(latency=off))
    assert not spec.latency.enabled
    assert spec.to_dict()["latency"] == "off"


def test_a_latency_mapping_overrides_the_keys_it_names() -> None:
    spec = parse_fabric_spec(fabric_doc(latency={"nic": "1us", "switch_hop": 250e-3}))
    assert spec.latency.nic == pytest.approx(1e-6)
    assert spec.latency.switch_hop == pytest.approx(250e-9)  # a bare number is microseconds
    assert spec.latency.library == DEFAULT_LATENCY["library"]


def test_the_canonical_form_reads_back_the_same() -> None:
    for latency in ({"nic": "1.25us", "operation": "0"}, "off", "on"):
        spec = parse_fabric_spec(fabric_doc(latency=latency))
        assert parse_fabric_spec(spec.to_dict()).latency == spec.latency


@pytest.mark.parametrize(
    ("latency", "key", "words"),
    [
        ({"nic": "fast"}, "latency.nic", "a duration such as 600ns"),
        ({"nic": "5ms"}, "latency.nic", "at most 1ms"),
        ({"nic": -1}, "latency.nic", ">= 0"),
        ({"wire": "1us"}, "latency.wire", "known keys library, nic, nvlink, operation"),
        (3, "latency", "off, on, or a mapping of switch_hop, nic, library, nvlink, operation"),
        ("sometimes", "latency", "off, on, or a mapping"),
    ],
)
def test_a_malformed_latency_is_one_sentence_naming_the_key(
    latency: object, key: str, words: str
) -> None:
    with pytest.raises(FabricSpecError) as info:
        parse_fabric_spec(fabric_doc(latency=latency), "f.yaml")
    assert info.value.key == key
    assert words in str(info.value)
    assert str(info.value).startswith("f.yaml: key ")


# --- one-way latency per path -----------------------------------------------------------------


def test_paths_of_astral_small_add_up_nics_switches_and_the_library() -> None:
    fabric = preset_fabric("astral-small")
    lat = fabric.spec.latency
    pairs = pair_latencies(fabric)
    assert len(pairs) == 8 * 7
    nvlink = pairs[("p0s0g0", "p0s0g1")]  # one server
    assert (nvlink.medium, nvlink.label, nvlink.seconds) == ("nvlink", "NVLink", lat.nvlink)
    same_tor = pairs[("p0s0g0", "p0s1g0")]  # same rail, one dual-ToR pair
    assert same_tor.switches == 1 and same_tor.label == "1 switch"
    assert same_tor.seconds == pytest.approx(lat.library + 2 * lat.nic + lat.switch_hop)
    assert same_tor.seconds == pytest.approx(2.7 * US)  # NCCL's per-step network latency
    cross_pod = pairs[("p0s0g0", "p1s1g0")]  # ToR, aggregation, core, aggregation, ToR
    assert cross_pod.switches == 5 and cross_pod.label == "5 switches"
    assert cross_pod.seconds == pytest.approx(lat.library + 2 * lat.nic + 5 * lat.switch_hop)
    assert pairs[("p1s1g0", "p0s0g0")] == cross_pod  # both ways alike


def test_a_rail_only_cross_rail_message_also_crosses_nvlink() -> None:
    fabric = preset_fabric("rail-only-small")
    lat = fabric.spec.latency
    labels = {p.label for p in pair_latencies(fabric).values()}
    assert "NVLink" in labels and any(label.endswith("+ NVLink") for label in labels)
    forwarded = next(p for p in pair_latencies(fabric).values() if p.nvlink_hops and p.switches)
    assert forwarded.seconds == pytest.approx(
        lat.library + 2 * lat.nic + forwarded.switches * lat.switch_hop + lat.nvlink
    )


def test_applied_latency_is_the_real_one_divided_by_the_scale() -> None:
    fabric = at_scale(preset_fabric("astral-small"), 0.6e-4)
    gpus = ["p0s0g0", "p1s1g0", "p0s0g1"]
    applied = applied_latency(fabric, gpus)
    assert applied.enabled
    assert applied.one_way[0][0] == 0.0
    assert applied.one_way[0][1] == pytest.approx(5.1 * US / 0.6e-4)  # 85 ms
    assert applied.one_way[0][2] == pytest.approx(0.6 * US / 0.6e-4)  # 10 ms
    assert applied.operation == pytest.approx(6.6 * US / 0.6e-4)  # 110 ms
    off = build_fabric(replace(fabric.spec, latency=replace(fabric.spec.latency, enabled=False)))
    none = applied_latency(off, gpus)
    assert not none.enabled and none.operation == 0.0
    assert all(x == 0.0 for row in none.one_way for x in row)


def test_the_record_groups_pairs_by_path_real_and_emulated() -> None:
    fabric = at_scale(preset_fabric("astral-small"), 0.6e-4)
    record = latency_record(fabric)
    assert record["enabled"] and record["scale"] == 0.6e-4
    assert [(p["path"], p["pairs"]) for p in record["paths"]] == [
        ("NVLink", 8),
        ("1 switch", 8),
        ("5 switches", 40),
    ]
    assert record["paths"][2]["one_way_real_us"] == pytest.approx(5.1)
    assert record["paths"][2]["one_way_emulated_ms"] == pytest.approx(85.0)
    assert record["operation"] == {"real_us": 6.6, "emulated_ms": 110.0}
    two = latency_record(fabric, ["p0s0g0", "p1s1g0"])
    assert [(p["path"], p["pairs"]) for p in two["paths"]] == [("5 switches", 2)]
    title = latency_title(record)
    assert title is not None
    assert "NVLink 0.6us -> 10ms" in title and "5 switches 5.1us -> 85ms" in title
    assert "per operation 6.6us -> 110ms" in title
    assert latency_title(None) is None  # a bundle from before latencies were modelled
    off = build_fabric(replace(fabric.spec, latency=replace(fabric.spec.latency, enabled=False)))
    assert (latency_title(latency_record(off)) or "").startswith("latency: off")


def test_fabric_json_keeps_the_spec_and_the_applied_latencies() -> None:
    description = FabricDescription.of(preset_fabric("astral-small"))
    document = description.to_dict()
    assert document["latency"] == latency_record(description.fabric)
    assert document["spec"]["latency"]["nic"] == "0.4us"
    again = FabricDescription.from_dict(document)
    assert again.fabric.spec.latency == description.fabric.spec.latency


# --- what a step waits ------------------------------------------------------------------------


def send(peer: int) -> Transfer:
    return Transfer(peer, Region("data", 0, 1))


def test_a_step_waits_its_slowest_send_peer_once_and_the_operation_before_step_0() -> None:
    row = StepLatency({1: 0.010, 2: 0.085, 3: 0.045}, operation=0.110)
    both = PlanStep("p", sends=(send(1), send(2), send(1)), recvs=(send(3),))
    assert row.before(0, both) == pytest.approx(0.085 + 0.110)
    assert row.before(1, both) == pytest.approx(0.085)
    assert row.before(1, PlanStep("p", sends=(send(3),))) == pytest.approx(0.045)
    assert row.before(1, PlanStep("p", recvs=(send(2),))) == 0.0  # receives wait for the sender
    assert StepLatency().before(0, both) == 0.0


def test_a_latency_table_travels_as_a_message_and_gives_each_rank_its_row() -> None:
    table = LatencyTable(((0.0, 0.01, 0.02), (0.01, 0.0, 0.03), (0.02, 0.03, 0.0)), 0.1)
    assert LatencyTable.from_message(table.to_message()) == table
    row = table.row(1)
    assert dict(row.peers) == {0: 0.01, 2: 0.03} and row.operation == 0.1
    assert LatencyTable.from_message(None) == LatencyTable()
    assert LatencyTable().row(5) == StepLatency()
    with pytest.raises(ValueError, match="one row"):
        LatencyTable(((0.0, 1.0), (0.0,)))
    with pytest.raises(ValueError, match=">= 0"):
        LatencyTable(((0.0, -1.0), (0.0, 0.0)))


def test_a_ring_costs_every_step_its_slowest_hop_plus_the_operation() -> None:
    fabric = at_scale(preset_fabric("astral-small"), 0.6e-4)
    gpus = [g.name for g in fabric.gpus_by_rank()]
    applied = applied_latency(fabric, gpus)
    table = LatencyTable(applied.one_way, applied.operation)
    layout = Layout(
        tuple(fabric.gpus[g].server for g in gpus), tuple(fabric.gpus[g].local_rank for g in gpus)
    )
    ring = default_registry().get("all-reduce", "ring")
    plans = [ring.plan(layout, r, 8 * 1024) for r in range(8)]
    # 2 (n - 1) = 14 steps; rank order alternates NVLink and cross-pod hops around the ring
    assert operation_latency(plans, table) == pytest.approx(0.110 + 14 * 0.085)
    direct = default_registry().get("all-to-all", "direct")
    plans = [direct.plan(layout, r, 8 * 1024) for r in range(8)]
    assert operation_latency(plans, table) == pytest.approx(0.110 + 0.085)  # one step
    assert operation_latency(plans, LatencyTable()) == 0.0


# --- the experiment -----------------------------------------------------------------------------


EXPERIMENT = """\
name: probe
fabric: astral-small
policy: ecmp
collectives: [all-reduce]
sizes: {min: 64K, max: 256K, factor: 4}
iterations: 2
warmup: 1
scale: 1.0e-4
"""


def experiment(tmp_path: Path, extra: str = ""):  # type: ignore[no-untyped-def]
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(EXPERIMENT) + extra, encoding="utf-8")
    return load_experiment(path)


def test_an_experiment_can_turn_latency_off_or_change_figures(tmp_path: Path) -> None:
    assert experiment(tmp_path).fabric.latency == LatencySpec()
    assert not experiment(tmp_path, "latency: off\n").fabric.latency.enabled
    changed = experiment(tmp_path, "latency: {nic: 1us}\n").fabric.latency
    assert changed.nic == pytest.approx(1e-6) and changed.library == DEFAULT_LATENCY["library"]
    with pytest.raises(ExperimentError) as info:
        experiment(tmp_path, "latency: {nic: slow}\n")
    assert info.value.key == "latency.nic" and "exp.yaml" in str(info.value)


def test_the_experiment_estimates_what_latency_adds(tmp_path: Path) -> None:
    spec = experiment(tmp_path)  # 8 ranks, ring all-reduce, 2 sizes, 3 operations each
    per_operation = (6.6 + 14 * 5.1) * US / 1e-4
    assert spec.step_latencies() == {
        0: pytest.approx(per_operation),
        1: pytest.approx(per_operation),
    }
    assert spec.latency_seconds() == pytest.approx(2 * 3 * per_operation)
    assert experiment(tmp_path, "latency: off\n").latency_seconds() == 0.0


# --- real workers -------------------------------------------------------------------------------


def test_two_loopback_workers_take_at_least_the_configured_round_trip() -> None:
    """A 2-rank ring all-reduce is a ping-pong: two steps, a message each way in each, the
    second step's after the first arrived; the operation takes >= operation + 2 x one way."""
    one_way, per_operation = 0.040, 0.030
    table = LatencyTable(((0.0, one_way), (one_way, 0.0)), per_operation)
    options = LaunchOptions(warmup=1, iterations=2, latency=table, heartbeat_interval=0.1)
    with Launcher(loopback_workers(2), options=options) as launcher:
        result = launcher.run([CollectiveTest("all-reduce", "ring", 1024)])
    result.raise_for_failure()
    (row,) = result.rows()
    assert row.wrong == 0
    assert row.time_us >= (per_operation + 2 * one_way) * 1e6
    for iteration in result.tests[0].timed():
        for rank in iteration.ranks.values():
            assert rank.time_us >= (per_operation + 2 * one_way) * 1e6


def test_the_default_experiment_file_says_what_it_runs() -> None:
    assert load_experiment(REPO / "experiments" / "default.yaml").fabric.latency.enabled


def test_a_scale_whose_latency_outlasts_the_step_deadline_is_refused(tmp_path: Path) -> None:
    # at 1e-7 a cross-pod message would wait 51 s and an operation 66 s: the launcher
    # would take the waiting ranks for hung ones
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT.replace("scale: 1.0e-4", "scale: 1.0e-7"), encoding="utf-8")
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    assert info.value.key == "scale"
    assert "step deadline" in str(info.value) and "latency: off" in str(info.value)
    path.write_text(EXPERIMENT.replace("scale: 1.0e-4", "scale: 1.0e-7\nlatency: off"))
    with pytest.raises(ExperimentError) as info:  # without latency: the links' rate floor
        load_experiment(path)
    assert info.value.key == "scale" and "Mbit/s emulated" in str(info.value)
    path.write_text(EXPERIMENT.replace("scale: 1.0e-4", "scale: 1.0e-5\nlatency: off"))
    assert load_experiment(path).fabric.emulation.scale == 1e-5
