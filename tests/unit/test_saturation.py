"""The live saturation flag's pure parts: CPU figures from samples, the verdict, the bundle's
record of it (table, summary.json, table headers, ``astral report``), and the decision to
calibrate once per machine (orchestrator/testbed/cpuload.py,
orchestrator/calibration/saturation.py, orchestrator/results/emulator.py,
orchestrator/run/loadguard.py). The runner's own use of them is in test_runner.py, a real
run on a fabric in tests/integration/test_run.py."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.calibration import capacity as cal
from orchestrator.calibration.saturation import (
    DEFAULT_THRESHOLDS,
    Thresholds,
    judge,
    judge_test,
    measured_window,
)
from orchestrator.cli import build_parser
from orchestrator.cli import main as cli_main
from orchestrator.results import IterationRecord, ResultsBundle, ResultsWriter, Versions
from orchestrator.results.emulator import EmulatorLoad, saturation_lines
from orchestrator.results.report import render_bundle
from orchestrator.results.store import DATABASE
from orchestrator.run.experiment import parse_experiment
from orchestrator.run.loadguard import ensure_calibration, load_guard
from orchestrator.testbed.cpuload import CpuLoad, CpuSample, CpuSampler, load_between
from orchestrator.worker.outcome import CollectiveResult, IterationResult, RankIteration
from orchestrator.worker.spec import CollectiveTest
from tests.helpers import REPO, preset_description
from topologies.errors import ConfigError

HZ = 100.0  # clock ticks per second in the synthetic samples
GBPS = 1e9


def sample(t: float, *, busy: int, total: int, ticks: int, vwait: float = 0, swait: float = 0):
    return CpuSample(t, busy, total, ticks, int(vwait * 1e9), int(swait * 1e9))


# --- figures from samples ---------------------------------------------------------------


def test_load_between_spans_the_window_with_the_samples_around_it() -> None:
    # 2 CPUs = 200 jiffies a second; 5 Hz samples; ovs-vswitchd uses 0.5 core (50 ticks/s)
    samples = [
        sample(10 + 0.2 * i, busy=30 * i, total=40 * i, ticks=10 * i, vwait=0.1 * i)
        for i in range(11)
    ]
    load = load_between(samples, 10.5, 11.1, ticks_per_second=HZ)
    assert load is not None
    assert (load.start, load.end) == (10.4, 11.2)  # the samples just before and just after
    assert load.samples == 5 and load.span_s == pytest.approx(0.8)
    assert load.idle_share == pytest.approx(0.25)  # 30 of every 40 jiffies busy
    assert load.vswitchd_cores == pytest.approx(0.5)
    assert load.vswitchd_wait == pytest.approx(0.5) and load.softirqd_wait == 0
    # a window between two samples is judged over the interval around it
    short = load_between(samples, 10.45, 10.5, ticks_per_second=HZ)
    assert short is not None and (short.start, short.end) == (10.4, 10.6)
    # a window reaching past the last sample: up to the last; one wholly after it: no figure
    tail = load_between(samples, 11.5, 14.0, ticks_per_second=HZ)
    assert tail is not None and (tail.start, tail.end) == (11.4, 12.0)
    assert load_between(samples, 13.0, 14.0, ticks_per_second=HZ) is None


def test_load_between_needs_two_samples_and_time_between_them() -> None:
    one = [sample(1.0, busy=1, total=2, ticks=0)]
    assert load_between(one, 0.5, 1.5) is None
    same = [sample(1.0, busy=1, total=2, ticks=0), sample(1.0, busy=1, total=2, ticks=0)]
    assert load_between(same, 0.5, 1.5) is None
    assert load_between([*one, sample(2.0, busy=2, total=4, ticks=0)], 2.0, 1.0) is None


def test_the_sampler_reads_this_machine_while_in_its_block() -> None:
    with CpuSampler(interval=0.01) as sampler:
        while len(sampler.snapshot()) < 4:
            pass
    samples = sampler.samples
    assert [s.t for s in samples] == sorted(s.t for s in samples)
    assert all(0 <= s.busy <= s.total for s in samples)
    load = load_between(samples, samples[0].t, samples[-1].t)
    assert load is not None and 0 <= load.idle_share <= 1 and load.vswitchd_cores >= 0
    count = len(samples)
    sampler.stop()  # stopped already: nothing more is taken
    assert len(sampler.samples) == count


# --- the verdict ------------------------------------------------------------------------


def cpu(idle: float, cores: float, vwait: float, swait: float = 0.0) -> CpuLoad:
    return CpuLoad(0.0, 1.0, 6, idle, cores, vwait, swait)


def test_no_verdict_of_saturation_while_cpu_was_left_idle() -> None:
    # ovs-vswitchd starved by every other measure, but the machine had 10 % idle
    assert DEFAULT_THRESHOLDS.reasons(cpu(0.10, 0.05, 0.9, 0.9), 1 * GBPS) == []


def test_a_starved_vswitchd_is_saturated_when_short_of_what_the_load_needs() -> None:
    t = Thresholds(idle_share=0.05, cores_per_hop_gbps=0.35, vswitchd_wait=0.2)
    assert t.needed_cores(0.8 * GBPS) == pytest.approx(0.28)
    (reason,) = t.reasons(cpu(0.0, 0.2, 0.6), 0.8 * GBPS)
    assert reason.startswith("ovs-vswitchd starved (0.20 cores of 0.28 needed")
    assert t.reasons(cpu(0.0, 0.3, 0.6), 0.8 * GBPS) == []  # enough for 0.8 hop-Gbit/s
    assert t.reasons(cpu(0.0, 0.3, 0.6), 1.6 * GBPS) != []  # not for twice that
    # little CPU but hardly waiting: it had little to forward (a latency-bound size)
    assert t.reasons(cpu(0.0, 0.1, 0.1), 0.8 * GBPS) == []


def test_starved_softirq_threads_are_saturation_whatever_ovs_vswitchd_got() -> None:
    t = Thresholds(softirqd_wait=0.15)
    (reason,) = t.reasons(cpu(0.01, 0.9, 0.1, swait=0.4), 0.8 * GBPS)
    assert reason == "softirq starved (ksoftirqd waited 40%)"
    assert t.reasons(cpu(0.01, 0.9, 0.1, swait=0.1), 0.8 * GBPS) == []
    both = t.reasons(cpu(0.0, 0.1, 0.8, swait=0.5), 0.8 * GBPS)
    assert len(both) == 2


def test_judge_records_the_figures_the_verdict_and_its_thresholds() -> None:
    load = judge(cpu(0.0, 0.2, 0.6, 0.05), (100.0, 100.5), 0.8 * GBPS)
    assert load.saturated and load.reasons.startswith("ovs-vswitchd starved")
    assert (load.window_s, load.sampled_s, load.samples) == (0.5, 1.0, 6)
    assert load.offered_hop_bps == 0.8 * GBPS
    t = DEFAULT_THRESHOLDS
    assert (load.idle_share_min, load.cores_per_hop_gbps) == (t.idle_share, t.cores_per_hop_gbps)
    assert (load.vswitchd_wait_min, load.softirqd_wait_max) == (t.vswitchd_wait, t.softirqd_wait)
    kept_up = judge(cpu(0.3, 0.95, 0.05), (100.0, 100.5), 0.8 * GBPS)
    assert not kept_up.saturated and kept_up.reasons == ""


def collective(starts: list[tuple[bool, float, float]]) -> CollectiveResult:
    """A result with one rank per (warmup, start, time_us) iteration, two ranks each."""
    result = CollectiveResult(CollectiveTest("all-reduce", "ring", 4096), 2, 1024, {})
    for i, (warmup, start, time_us) in enumerate(starts):
        ranks = {r: RankIteration(r, start + 0.01 * r, time_us, 0, 0, 0, (), ()) for r in (0, 1)}
        result.iterations.append(IterationResult(i, warmup, ranks))
    return result


def test_the_measured_window_runs_from_the_first_timed_iteration_to_the_last_end() -> None:
    test = collective([(True, 10.0, 5e5), (False, 11.0, 2e5), (False, 11.2, 3e5)])
    assert measured_window(test) == pytest.approx((11.0, 11.51))  # rank 1 ends last
    assert measured_window(collective([(True, 10.0, 1e5)])) is None
    samples = [sample(10 + 0.2 * i, busy=40 * i, total=40 * i, ticks=2 * i) for i in range(10)]
    load = judge_test(test, samples, 0.8 * GBPS)
    assert load is not None and load.idle_share == 0  # every jiffy busy
    assert load.sampled_s == pytest.approx(0.6)  # samples 11.0 .. 11.6 span 11.0 .. 11.51
    assert judge_test(test, samples[:1], 0.8 * GBPS) is None


# --- in the bundle --------------------------------------------------------------------------


def emulator_load(saturated: bool) -> EmulatorLoad:
    figures = cpu(0.0, 0.15 if saturated else 0.9, 0.7 if saturated else 0.1)
    load = judge(figures, (1.0, 2.0), 0.8 * GBPS)
    assert load.saturated is saturated
    return load


def write_bundle(path: Path, loads: dict[int, EmulatorLoad]) -> Path:
    """Two sizes of one all-reduce; ``loads`` by size index (absent: not sampled)."""
    versions = Versions("3.11", "2.3.0", "4.2.2", "3.1.0")
    with ResultsWriter(path, preset_description("astral-small")) as writer:
        writer.add_run(experiment="unit", host="h", versions=versions)
        for index, size in enumerate((65536, 262144)):
            config = writer.add_configuration(
                policy="ecmp",
                collective="all-reduce",
                algorithm="ring",
                size=size,
                count=size // 4,
                dtype="uint32",
                ranks=8,
                host_ports="balanced",
                iterations=1,
                warmup=0,
            )
            writer.add_iterations(config, [IterationRecord(0, r, 1e5, size, 0) for r in range(8)])
            if index in loads:
                writer.add_emulator_load(config, loads[index])
        writer.finish()
    return path


def test_the_bundle_keeps_the_verdict_and_every_rendering_shows_it(tmp_path: Path) -> None:
    flagged, fine = emulator_load(True), emulator_load(False)
    path = write_bundle(tmp_path / "b", {0: fine, 1: flagged})
    with ResultsBundle.open(path) as bundle:
        assert list(bundle.emulator_loads().values()) == [fine, flagged]
    report = render_bundle(path, plots=False)
    (table,) = report.tables
    assert "# EMULATOR SATURATED while measuring 1 of 2 sizes" in table
    assert "#   size 262144: ovs-vswitchd starved" in table and "size 65536:" not in table
    summary = json.loads((path / "summary.json").read_text())
    flags = [c["emulator_saturated"] for c in summary["configurations"]]
    assert flags == [False, True]
    assert summary["configurations"][1]["emulator_load"]["vswitchd_cores"] == 0.15
    assert summary["emulator"] == {"sampled": 2, "saturated_configurations": [2]}
    # `astral report` re-renders the same verdict from the database alone
    (path / "summary.json").unlink()
    assert cli_main(["report", str(path)]) == 0
    again = json.loads((path / "summary.json").read_text())
    assert [c["emulator_saturated"] for c in again["configurations"]] == [False, True]


def test_bundles_without_samples_say_not_sampled(tmp_path: Path) -> None:
    path = write_bundle(tmp_path / "b", {0: emulator_load(False)})
    summary = render_bundle(path, plots=False)
    assert "SATURATED" not in summary.tables[0]
    document = json.loads((path / "summary.json").read_text())
    assert [c["emulator_saturated"] for c in document["configurations"]] == [False, None]
    # a bundle from before the table existed reads as "nothing sampled"
    with sqlite3.connect(path / DATABASE) as db:
        db.execute("DROP TABLE emulator_load")
    with ResultsBundle.open(path) as bundle:
        assert bundle.emulator_loads() == {}
    render_bundle(path, plots=False)


def test_saturation_lines_name_the_flagged_sizes_and_the_rule() -> None:
    assert saturation_lines([(1, emulator_load(False)), (2, None)]) == []
    lines = saturation_lines([(4096, emulator_load(True)), (8192, emulator_load(False))])
    assert lines[0].startswith("EMULATOR SATURATED while measuring 1 of 2 sizes")
    assert lines[1].startswith("  size 4096: ovs-vswitchd starved")
    assert lines[-1].startswith("(rule: idle below 5%")


# --- calibrating once per machine -----------------------------------------------------------


def test_the_quick_calibration_runs_once_and_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "lib" / "calibration.json"
    made = cal.Calibration(capacity_bps=1e9, bound="bracketed", fabric={"plan": "quick"})
    calls: list[int] = []
    said: list[str] = []

    def measure() -> cal.Calibration:
        calls.append(1)
        return made

    first = ensure_calibration(measure, path=path, say=said.append)
    assert calls == [1] and path.exists() and first.capacity_bps == 1e9
    assert first.source == str(path)  # as later runs read it
    assert "no calibration at" in said[0] and "--no-calibrate" in said[0]
    assert said[1].startswith(f"calibration stored in {path}")
    second = ensure_calibration(measure, path=path, say=said.append)
    assert calls == [1] and second == first  # cached: not measured again
    assert len(said) == 2


def test_a_quick_calibration_of_smaller_packets_is_measured_again_for_larger(
    tmp_path: Path,
) -> None:
    """A quick calibration stored by a first run at packets x1 says only that the emulator
    carried its load there (a lower bound): a run at packets x2 measures it again for its
    own packets and stores that, once; a run at x1 and a full calibration are kept."""
    path = tmp_path / "calibration.json"
    step = cal.LoadStep(8, 39e6, 5.0, 312e6, 1.56e9, 307e6, 0.986, packet_scale=1)
    small = cal.Calibration(1.56e9, "lower", fabric={"plan": "quick"}, steps=(step,))
    larger = replace(small, capacity_bps=4.7e9, steps=(step, replace(step, packet_scale=2)))
    cal.save_calibration(small, path)
    calls: list[int] = []
    said: list[str] = []

    def measure() -> cal.Calibration:
        calls.append(1)
        return larger

    assert ensure_calibration(measure, path=path, packet_scale=1).capacity_bps == 1.56e9
    assert calls == []
    again = ensure_calibration(measure, path=path, say=said.append, packet_scale=2)
    assert calls == [1] and again.capacity_bps == 4.7e9 and again.source == str(path)
    assert "measured for smaller packets than this run's (x2)" in said[0]
    assert ensure_calibration(measure, path=path, packet_scale=2).capacity_bps == 4.7e9
    assert calls == [1]  # stored: not measured a third time
    full = replace(small, fabric={"plan": "default"})
    cal.save_calibration(full, path)
    assert ensure_calibration(measure, path=path, packet_scale=2).capacity_bps == 1.56e9
    assert calls == [1]  # a user's own calibration is never replaced


def test_a_damaged_calibration_is_an_error_not_a_recalibration(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text("{not json")

    def measure() -> cal.Calibration:
        raise AssertionError("must not measure over a damaged file")

    with pytest.raises(ConfigError):
        ensure_calibration(measure, path=path)
    assert path.read_text() == "{not json"


def test_astral_run_calibrates_unless_told_not_to() -> None:
    parser = build_parser()
    assert parser.parse_args(["run"]).no_calibrate is False
    assert parser.parse_args(["run", "--no-calibrate"]).no_calibrate is True


def test_an_uncalibrated_run_is_warned_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.emulation.recipe import DEFAULT_RECIPE_NAME, ENV_VAR

    monkeypatch.delenv(ENV_VAR, raising=False)
    spec = parse_experiment(
        {
            "name": "u",
            "fabric": "astral-small",
            "collectives": ["all-reduce"],
            "sizes": {"min": "1M", "max": "1M"},
            "policy": "ecmp",
        },
        "u.yaml",
        REPO,
    )
    (line,) = load_guard(spec, uncalibrated=True).lines()
    assert line.startswith("warning: offered") and "unknown" in line
    conditions = {"recipe": DEFAULT_RECIPE_NAME}
    calibrated = cal.Calibration(capacity_bps=1e12, bound="bracketed", conditions=conditions)
    assert load_guard(spec, calibration=calibrated).lines() == []
