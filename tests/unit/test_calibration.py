"""The calibration's pure parts: file round trip and validation, switch hops and offered
load, the verdict thresholds, finding the capacity from steps, and the load guard reading
a calibration. No root: nothing here measures."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.calibration import capacity as cal
from orchestrator.calibration import measure
from orchestrator.cli import main as cli_main
from orchestrator.run.experiment import load_experiment
from orchestrator.run.loadguard import load_guard
from orchestrator.testbed.traffic import Flow, FlowResult, TrafficResult
from tests.helpers import REPO, preset_fabric, preset_spec
from topologies.errors import ConfigError, ExperimentError
from topologies.generators import build_fabric
from topologies.units import TCP_PAYLOAD_SHARE

SMALL = preset_spec("astral-small")
DEFAULT_EXPERIMENT = REPO / "experiments" / "default.yaml"


def step(flows: int, factor: float, ratio: float, hops: float = 5.0) -> cal.LoadStep:
    rate = 20e6 * factor
    offered = flows * rate
    return cal.LoadStep(
        flows=flows,
        rate_bps=rate,
        hops=hops,
        offered_bps=offered,
        offered_hop_bps=offered * hops,
        achieved_bps=ratio * offered * TCP_PAYLOAD_SHARE,
        ratio=ratio,
    )


def sample(**changes: object) -> cal.Calibration:
    calibration = cal.Calibration(
        capacity_bps=9.5e8,
        bound="bracketed",
        measured_at="2026-01-01T00:00:00Z",
        conditions={"cpus": 2, "loadavg_start": [1.0, 2.0, 3.0], "datapath": "userspace"},
        fabric={"name": "astral-small", "nic_rate_bps": 2e7},
        steps=(step(1, 1, 0.98), step(8, 1, 0.85)),
    )
    return replace(calibration, **changes)


@pytest.fixture(autouse=True)
def no_machine_calibration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Never read this machine's real calibration file."""
    monkeypatch.setenv(cal.ENV_VAR, str(tmp_path / "absent.json"))


# --- file -------------------------------------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    written = cal.save_calibration(sample(), tmp_path / "sub" / "cal.json")
    loaded = cal.load_calibration(written)
    assert loaded is not None
    assert loaded.source == str(written)
    assert replace(loaded, source="") == sample()
    assert json.loads(written.read_text())["unit"] == "hop-bit/s"


def test_missing_file_is_no_calibration(tmp_path: Path) -> None:
    assert cal.load_calibration(tmp_path / "nothing.json") is None
    assert cal.load_calibration() is None  # $ASTRAL_CALIBRATION points nowhere


def test_path_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cal.calibration_path(tmp_path / "x.json") == tmp_path / "x.json"
    monkeypatch.setenv(cal.ENV_VAR, str(tmp_path / "env.json"))
    assert cal.calibration_path() == tmp_path / "env.json"
    monkeypatch.delenv(cal.ENV_VAR)
    assert cal.calibration_path() == cal.DEFAULT_PATH


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("", "", "an empty file"),
        ("{not json", "", "invalid JSON"),
        ("[1, 2]", "", "a JSON object"),
        ('{"version": 7}', "version", "7"),
    ],
)
def test_damaged_file_says_what_and_how_to_fix(
    tmp_path: Path, text: str, key: str, words: str
) -> None:
    path = tmp_path / "cal.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        cal.load_calibration(path)
    message = str(caught.value)
    assert str(path) in message and words in message and "astral calibrate" in message
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"capacity_bps": -1}, "capacity_bps"),
        ({"capacity_bps": "fast"}, "capacity_bps"),
        ({"capacity_bps": 0}, "capacity_bps"),
        ({"safe_share": 1.5}, "safe_share"),
        ({"threshold": 0}, "threshold"),
        ({"bound": "roughly"}, "bound"),
        ({"unit": "bit/s"}, "unit"),
        ({"conditions": []}, "conditions"),
        ({"steps": {}}, "steps"),
        ({"steps": [{"flows": 1}]}, "steps[0].rate_bps"),
        ({"steps": [{**vars(step(1, 1, 0.9)), "ratio": "x"}]}, "steps[0].ratio"),
    ],
)
def test_invalid_fields_are_named(tmp_path: Path, change: dict[str, object], key: str) -> None:
    document = sample().to_dict() | change
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as caught:
        cal.load_calibration(path)
    assert caught.value.key == key
    assert str(path) in str(caught.value)


def test_summary_lines_name_capacity_safe_load_and_conditions() -> None:
    text = "\n".join(sample().lines())
    assert "950 hop-Mbit/s" in text and "665 hop-Mbit/s" in text and "70%" in text
    assert "2 CPUs" in text and "userspace" in text


# --- hops and offered load --------------------------------------------------------------------


def test_switch_hops_on_astral_small() -> None:
    fabric = build_fabric(SMALL)
    hops = cal.switch_hops(fabric, "p0s0g0")
    assert hops["p0s1g0"] == 1  # same dual-ToR pair
    assert hops["p0s1g1"] == 5  # another rail: up through a core and down
    assert hops["p1s1g0"] == 5  # another pod
    assert "p0s0g0" not in hops


def test_mean_hops_skips_server_mates_and_handles_subsets() -> None:
    fabric = build_fabric(SMALL)
    # per GPU: 1 peer at 1 hop, 5 at 5 hops (its server-mate talks over NVLink)
    assert cal.mean_hops(fabric) == pytest.approx(26 / 6)
    assert cal.mean_hops(fabric, ["p0s0g0", "p0s1g0"]) == 1
    assert cal.mean_hops(fabric, ["p0s0g0", "p0s0g1"]) == 0.0  # one server: no fabric


def test_rail_only_reaches_other_rails_through_a_server_mate() -> None:
    fabric = preset_fabric("rail-only-small")
    assert fabric.gpu_forwarding
    hops = cal.switch_hops(fabric, "p0s0g0")
    others = [g for g in fabric.gpus if fabric.gpus[g].server != "p0s0"]
    assert all(hops[g] >= 1 for g in others)


def test_offered_load() -> None:
    load = cal.offered_load(SMALL)
    assert (load.gpus, load.nic_ports, load.nic_rate_bps) == (8, 2, 20e6)
    assert load.gpu_bps == 320e6
    assert load.hop_bps == pytest.approx(320e6 * 26 / 6)
    pair = cal.offered_load(SMALL, ["p0s0g0", "p0s1g0"])
    assert pair.hop_bps == pytest.approx(2 * 2 * 20e6 * 1)


# --- verdict ----------------------------------------------------------------------------------


def test_verdict_thresholds() -> None:
    calibration = sample(capacity_bps=1000.0)
    assert cal.verdict(700.0, calibration) is cal.Verdict.OK  # exactly the safe share
    assert cal.verdict(700.1, calibration) is cal.Verdict.OVER
    assert cal.verdict(900.0, calibration, safe_share=0.95) is cal.Verdict.OK
    assert cal.verdict(1.0, None) is cal.Verdict.UNCALIBRATED


def test_assess_reports_share_and_says_when_uncalibrated() -> None:
    offered = cal.offered_load(SMALL).hop_bps
    assessment = cal.assess(SMALL, calibration=sample(capacity_bps=offered * 2))
    assert assessment.verdict is cal.Verdict.OK and assessment.share == pytest.approx(0.5)
    assert "within" in assessment.line()
    over = cal.assess(SMALL, calibration=sample(capacity_bps=offered))
    assert over.verdict is cal.Verdict.OVER and "EXCEEDS" in over.line()
    none = cal.assess(SMALL)
    assert none.verdict is cal.Verdict.UNCALIBRATED and "no calibration" in none.line()


# --- capacity from steps ----------------------------------------------------------------------


def test_capacity_is_interpolated_where_the_ratio_crosses_the_threshold() -> None:
    steps = [step(1, 1, 0.98), step(2, 1, 0.95), step(4, 1, 0.85)]
    capacity, bound = cal.find_capacity(steps)
    assert bound == "bracketed"
    assert 200e6 < capacity < 400e6  # between the 2- and the 4-flow step (x 5 hops)
    # half-way in ratio -> geometric mean of the loads
    assert capacity == pytest.approx((200e6 * 400e6) ** 0.5)


def test_capacity_bounds() -> None:
    assert cal.find_capacity([step(1, 1, 0.97), step(8, 2, 0.93)]) == (1600e6, "lower")
    capacity, bound = cal.find_capacity([step(2, 1, 0.5)])
    assert bound == "upper" and capacity == pytest.approx(0.5 * TCP_PAYLOAD_SHARE * 200e6)
    with pytest.raises(ValueError):
        cal.find_capacity([])


def test_step_ratios_come_from_the_measured_goodputs() -> None:
    flows = [Flow("a", "b"), Flow("b", "a")]
    result = TrafficResult(
        window_s=4.0, flows=[FlowResult(flows[0], 18e6, 3), FlowResult(flows[1], 16e6, 1)]
    )
    made = measure.step_of(result, flows, 20e6, {flows[0]: 5, flows[1]: 3})
    assert made.achieved_bps == 34e6
    assert made.ratio == pytest.approx(34e6 / (40e6 * TCP_PAYLOAD_SHARE))
    assert made.offered_hop_bps == 20e6 * 5 + 20e6 * 3 and made.hops == 4
    assert made.retransmits == 4 and made.jain == pytest.approx(34**2 / (2 * (18**2 + 16**2)))
    merged = measure.merge_steps(made, replace(made, ratio=0.5, achieved_bps=10e6))
    assert merged.runs == 2 and merged.ratio == pytest.approx((made.ratio + 0.5) / 2)


def test_calibration_fabric_and_flows() -> None:
    spec = measure.calibration_fabric(SMALL)
    assert spec.speeds.tor_agg == spec.speeds.agg_core == 4 * SMALL.speeds.nic
    fabric = build_fabric(spec)
    flows = measure.calibration_flows(fabric)
    assert len(flows) == 16  # one per NIC port: 8 GPUs with 2 each
    first = flows[:8]
    assert sorted(f.src for f in first) == sorted(fabric.gpus)  # one sending flow per GPU
    assert sorted(f.dst for f in first) == sorted(fabric.gpus)  # one receiving flow per GPU
    assert flows[8:] == first  # then each pair again, for the GPUs' other NIC port
    assert all(fabric.gpus[f.src].pod != fabric.gpus[f.dst].pod for f in flows)
    assert {cal.switch_hops(fabric, f.src)[f.dst] for f in flows} == {5}


# --- the load guard reads it ------------------------------------------------------------------


def test_load_guard_uses_the_calibration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = load_experiment(DEFAULT_EXPERIMENT)
    offered = cal.offered_load(spec.fabric, spec.gpus).hop_bps
    path = tmp_path / "cal.json"
    monkeypatch.setenv(cal.ENV_VAR, str(path))
    uncalibrated = load_guard(spec)
    assert not uncalibrated.calibrated and not uncalibrated.refused
    assert "no calibration" in uncalibrated.summary()[0]

    cal.save_calibration(sample(capacity_bps=offered * 2), path)
    verdict = load_guard(spec)
    assert verdict.calibrated and verdict.assessment.calibration is not None
    assert verdict.assessment.calibration.source == str(path)
    assert verdict.assessment.offered.hop_bps == pytest.approx(offered)
    assert not verdict.over and not verdict.refused

    cal.save_calibration(sample(capacity_bps=offered), path)
    refused = load_guard(spec)
    assert refused.refused and isinstance(refused.error(), ExperimentError)
    forced = load_guard(spec, force=True)
    assert forced.emulator_bound and forced.to_dict()["emulator_bound"] is True


def test_load_guard_stops_on_a_damaged_calibration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "cal.json"
    path.write_text("{")
    monkeypatch.setenv(cal.ENV_VAR, str(path))
    with pytest.raises(ConfigError):
        load_guard(load_experiment(DEFAULT_EXPERIMENT))


# --- the command's --show ---------------------------------------------------------------------


def test_show(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cal.json"
    assert cli_main(["calibrate", "--show", "--out", str(path)]) == 1
    assert "no calibration" in capsys.readouterr().out
    cal.save_calibration(sample(), path)
    assert cli_main(["calibrate", "--show", "--out", str(path)]) == 0
    out = capsys.readouterr().out
    assert "950 hop-Mbit/s" in out and "astral-small" in out and "offered" in out
    path.write_text("[]")
    assert cli_main(["calibrate", "--show", "--out", str(path)]) == 2
    assert "a JSON object" in capsys.readouterr().err


def test_rate_commands_keep_the_htb_root() -> None:
    """Re-shaping changes class and leaf in place: this kernel refuses to change an htb root."""
    from orchestrator.emulation.shaping import shaping_commands

    commands = shaping_commands("p0r0t0-eth3", 40e6)
    kept = measure.rate_commands(commands)
    assert kept == commands[1:]
    assert [argv[1] for argv in kept] == ["class", "qdisc"]
    assert all("root" not in argv for argv in kept)


def test_load_guard_warns_when_the_calibration_was_made_under_another_recipe(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orchestrator.emulation import recipe

    spec = load_experiment(DEFAULT_EXPERIMENT)
    offered = cal.offered_load(spec.fabric, spec.gpus).hop_bps
    path = tmp_path / "cal.json"
    monkeypatch.setenv(cal.ENV_VAR, str(path))
    monkeypatch.setenv(recipe.ENV_VAR, "small-packets")
    # made before recipes had names: small-packets, the default then
    cal.save_calibration(sample(capacity_bps=offered * 2), path)
    same = load_guard(spec)
    assert same.recipe_mismatch is None and same.lines() == []
    assert same.to_dict()["calibration_recipe"] == "small-packets"

    monkeypatch.setenv(recipe.ENV_VAR, "large-packets")
    other = load_guard(spec)
    assert other.recipe_mismatch is not None
    assert "small-packets" in other.lines()[0] and "large-packets" in other.lines()[0]
    assert "--recipe large-packets" in other.summary()[-1]

    conditions = {**sample().conditions, "recipe": "large-packets"}
    cal.save_calibration(sample(capacity_bps=offered * 2, conditions=conditions), path)
    assert load_guard(spec).recipe_mismatch is None


# --- recipes whose packets grow with the rate (jumbo-packets) ---------------------------------


def scaled(step_: cal.LoadStep, packet_scale: int) -> cal.LoadStep:
    return replace(step_, packet_scale=packet_scale)


def test_the_capacity_is_recorded_with_the_packet_scale_that_bounds_it(tmp_path: Path) -> None:
    steps = (scaled(step(8, 1, 0.98), 1), scaled(step(8, 4, 0.97), 4), scaled(step(8, 8, 0.6), 8))
    calibration = sample(capacity_bps=5e9, steps=steps)
    assert calibration.packet_scale == 8  # the first step below the threshold
    assert sample(steps=steps[:2]).packet_scale == 4  # never below: the last step
    assert sample().packet_scale == 1  # recipes whose packets never grow
    path = tmp_path / "cal.json"
    cal.save_calibration(calibration, path)
    loaded = cal.load_calibration(path)
    assert loaded is not None and [s.packet_scale for s in loaded.steps] == [1, 4, 8]
    assert any("packets at scale 8" in line for line in loaded.lines())


def test_a_run_with_smaller_packets_gets_its_share_of_the_capacity_never_more() -> None:
    steps = (scaled(step(8, 1, 0.98), 1), scaled(step(8, 8, 0.6), 8))
    calibration = sample(capacity_bps=8e9, steps=steps)
    assert calibration.at_packet_scale(8) is calibration
    assert calibration.at_packet_scale(10) is calibration  # larger packets: no more claimed
    assert calibration.at_packet_scale(2).capacity_bps == pytest.approx(2e9)
    assert calibration.at_packet_scale(1).safe_bps == pytest.approx(1e9 * calibration.safe_share)
    # ... but at least what a step at that packet scale (or below) carried faithfully
    edge = scaled(step(8, 1.95, 0.97), 1)  # 1560 hop-Mbit/s with packets at scale 1
    richer = sample(capacity_bps=8e9, steps=(steps[0], edge, steps[1]))
    assert richer.at_packet_scale(1).capacity_bps == pytest.approx(edge.offered_hop_bps)
    assert richer.at_packet_scale(4).capacity_bps == pytest.approx(4e9)


def test_each_packet_scale_is_judged_by_its_own_steps_where_it_has_them() -> None:
    steps = (
        scaled(step(16, 1, 0.97), 1),  # 1600 hop-Mbit/s at scale 1: faithful
        scaled(step(16, 1.95, 0.80), 1),  # 3120: not (the headline is bracketed here)
        scaled(step(16, 2, 0.98), 2),  # 3200 at scale 2: faithful
        scaled(step(16, 2.925, 0.95), 2),  # 4680: faithful, the most scale 2 offered
        scaled(step(16, 4, 0.95), 4),  # 6400 at scale 4: faithful
        scaled(step(16, 4.875, 0.85), 4),  # 7800: not
    )
    capacity, bound = cal.find_capacity(steps)
    calibration = sample(capacity_bps=capacity, bound=bound, steps=steps)
    assert calibration.packet_scale == 1 and 1600e6 < capacity < 3120e6
    two = calibration.at_packet_scale(2)
    assert two.capacity_bps == pytest.approx(4680e6) and two.bound == "lower"
    four = calibration.at_packet_scale(4)
    low, high = math.log(6400e6), math.log(7800e6)
    assert four.capacity_bps == pytest.approx(math.exp(low + (0.95 - 0.9) / 0.1 * (high - low)))
    assert four.bound == "bracketed"
    # scale 3 has no steps: its share of scale 4's faithful steps, or scale 2's, whichever
    # is more, never more than a step showed
    assert calibration.at_packet_scale(3).capacity_bps == pytest.approx(6400e6 * 3 / 4)
    # scale 1 keeps its own bracket: larger packets' steps do not raise a measured failure
    assert calibration.at_packet_scale(1).capacity_bps == pytest.approx(capacity)
    lines = calibration.lines()
    assert any(line.strip().startswith("packets x2") and "4680" in line for line in lines)
    assert sample().scale_lines() == []  # one scale: nothing to add


def test_the_quick_plan_measures_the_packet_scale_of_the_run_it_is_for() -> None:
    from orchestrator.emulation.recipe import RECIPES

    quick = measure.QUICK_PLAN
    assert measure.plan_for(quick, RECIPES["small-packets"], 20e6, 2) == quick
    jumbo = RECIPES["jumbo-packets"]
    assert measure.plan_for(quick, jumbo, 20e6, 1).steps == ((2, 1.0), (8, 1.95))
    for_two = measure.plan_for(quick, jumbo, 20e6, 2)
    assert for_two.steps == ((2, 1.0), (8, 1.95), (measure.ALL_FLOWS, 2.925))
    assert for_two.name == "quick" and for_two.duration == quick.duration
    assert measure.edge_factor(jumbo, 10e6, 2) == pytest.approx(5.85)


def test_under_a_scaling_recipe_the_plan_measures_the_edge_of_every_packet_scale() -> None:
    from orchestrator.emulation.recipe import RECIPES

    small = measure.plan_for(measure.DEFAULT_PLAN, RECIPES["small-packets"], 20e6)
    assert small == measure.DEFAULT_PLAN
    jumbo = measure.plan_for(measure.DEFAULT_PLAN, RECIPES["jumbo-packets"], 20e6)
    added = [s for s in jumbo.steps if s not in measure.DEFAULT_PLAN.steps]
    every = measure.ALL_FLOWS  # every NIC port's flow, just below F = 2, 3 and 5
    assert added == [(every, 1.95), (every, 2.925), (every, 4.875)]
    recipe = RECIPES["jumbo-packets"]
    for _flows, factor in added:
        below = recipe.scale_for(20e6 * factor)
        assert recipe.scale_for(20e6 * factor / measure.EDGE) == below + 1
    assert list(jumbo.steps) == sorted(jumbo.steps, key=lambda s: (s[1], s[0]))


def test_the_load_guard_judges_a_run_at_its_own_packet_scale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orchestrator.emulation import recipe

    default = load_experiment(DEFAULT_EXPERIMENT)
    slow = replace(default.fabric.emulation, scale=0.6e-4)  # 12 Mbit/s: packets at scale 1
    spec = replace(default, fabric=replace(default.fabric, emulation=slow))
    assert recipe.packet_scale_of(spec.fabric, recipe.RECIPES["jumbo-packets"]) == 1
    offered = cal.offered_load(spec.fabric, spec.gpus).hop_bps
    path = tmp_path / "cal.json"
    monkeypatch.setenv(cal.ENV_VAR, str(path))
    monkeypatch.setenv(recipe.ENV_VAR, "jumbo-packets")
    conditions = {**sample().conditions, "recipe": "jumbo-packets"}
    steps = (scaled(step(1, 1, 0.98), 1), scaled(step(8, 8, 0.6), 8))
    # 4x the offered load measured with packets 8x larger: 0.5x at this run's packets
    cal.save_calibration(sample(capacity_bps=offered * 4, conditions=conditions, steps=steps), path)
    verdict = load_guard(spec)
    assert verdict.refused
    assert verdict.to_dict()["capacity_hop_bps"] == pytest.approx(offered / 2)
