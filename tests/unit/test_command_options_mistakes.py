"""Options and inputs of ``astral forecast``, ``top``, ``clean``, ``run --out``, ``compare``
and a fabric's ``speeds`` said as mistakes, with the file, key and what was expected, and
nothing ignored, created or half-done:

- ``forecast --calibrate-from`` a bundle with too few usable cells names the bundle;
  ``--calibration`` of a missing file, ``--pods``/``--size`` without ``--full-size``, an
  unbounded ``--salts`` and a ``--set`` key given twice are errors
  (orchestrator/commands/forecast.py).
- ``top``: ``--refresh`` above 0, a directory that is not a run's is refused naming it,
  a malformed live.json is named in the view (orchestrator/commands/top.py,
  orchestrator/monitor/live.py).
- ``clean``: a missing state dir is nothing to clean and is not created; unreadable records
  are reported and the exit status says so (orchestrator/commands/clean.py,
  orchestrator/emulation/state.py).
- ``run --out`` a non-empty directory is refused before the fabric is brought up.
- ``compare`` of bundles of different kinds is exit 2 in either order; the policy hint only
  where it applies (orchestrator/commands/compare.py).
- a link speed whose emulated rate is below what the shaper and TCP can run (topologies/spec.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from tests.helpers import REPO
from tests.unit.test_results import write_synthetic_bundle
from topologies.errors import ConfigError

DEFAULT = REPO / "experiments" / "default.yaml"


# --- astral forecast ----------------------------------------------------------------------------


def test_calibrate_from_a_bundle_with_too_few_cells_names_the_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ecmp only: a hash decides every path, so no cell has a single model time to fit
    bundle = write_synthetic_bundle(tmp_path / "bundle", policies=("ecmp",))
    stored = tmp_path / "calibration.json"
    status = main(["forecast", "--calibrate-from", str(bundle), "--calibration", str(stored)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith(f"astral: error: {bundle}: key '--calibrate-from': expected a bundle")
    assert "at least 3" in err and "0 usable of" in err and "on hashed paths" in err
    assert "Traceback" not in err and not stored.exists()


def forecast_args(*argv: str) -> argparse.Namespace:
    """``astral forecast ARGV`` as parsed."""
    from orchestrator.cli import build_parser

    return build_parser().parse_args(["forecast", *argv])


@pytest.mark.parametrize(
    ("argv", "key", "found"),
    [
        (["--pods", "2"], "--pods", "found 2"),
        (["--size", "1M"], "--size", "found '1M'"),
        (["--salts", "100000"], "--salts", "found 100000"),
        (["--salts", "0"], "--salts", "found 0"),
        (["--set", "scale=1e-3", "--set", "scale=2e-3"], "scale", "scale=1e-3 and scale=2e-3"),
    ],
)
def test_forecast_refuses_an_option_it_would_ignore_or_run_unbounded(
    argv: list[str], key: str, found: str
) -> None:
    from orchestrator.commands.forecast import check_options

    with pytest.raises(ConfigError) as caught:
        check_options(forecast_args(*argv))
    assert caught.value.key == key and found in str(caught.value)


def test_forecast_takes_the_options_with_what_they_need(tmp_path: Path) -> None:
    from orchestrator.commands.forecast import MAX_SALTS, check_options

    check_options(forecast_args("--full-size", "--pods", "2", "--size", "1M"))
    check_options(forecast_args("--salts", str(MAX_SALTS), "--set", "scale=1e-3"))
    # --calibrate-from writes the file --calibration names: it need not exist yet
    check_options(forecast_args("--calibrate-from", "b", "--calibration", str(tmp_path / "n")))


def test_forecast_with_a_calibration_file_that_does_not_exist_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.json"
    assert main(["forecast", str(DEFAULT), "--calibration", str(missing)]) == 2
    captured = capsys.readouterr()
    assert f"astral: error: {missing}: key '--calibration'" in captured.err
    assert "no such file" in captured.err and "forecast calibration: none" not in captured.out


def test_forecast_calibration_none_asks_for_the_bare_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["forecast", str(DEFAULT), "--calibration", "none"]) == 0
    assert capsys.readouterr().out.startswith("# forecast calibration: none")
    # ... and is no file to store a calibration in
    assert main(["forecast", "--calibrate-from", "b", "--calibration", "none"]) == 2
    assert "expected a file to store the calibration in" in capsys.readouterr().err


def test_forecast_refuses_a_set_key_given_twice_before_forecasting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["forecast", str(DEFAULT), "--set", "scale=1e-3", "--set", "scale=2e-3"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "--set: key 'scale': expected each key set once" in captured.err
    assert captured.out == ""


# --- astral top ---------------------------------------------------------------------------------


@pytest.mark.parametrize("refresh", ["-1", "0", "nan"])
def test_top_refuses_a_refresh_period_not_above_zero(
    tmp_path: Path, refresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "live.json").write_text("{}")
    assert main(["top", str(tmp_path), "--refresh", refresh, "--once"]) == 2
    assert "key '--refresh': expected a redraw period" in capsys.readouterr().err


def test_top_refuses_a_directory_that_is_not_a_run_and_names_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = write_synthetic_bundle(tmp_path / "bundle", policies=("ecmp",))
    assert main(["top", str(bundle), "--once"]) == 2
    captured = capsys.readouterr()
    assert f"astral: error: {bundle}: key 'RUN_DIR'" in captured.err
    assert "neither state.json nor live.json" in captured.err
    assert "no launch yet" not in captured.out
    missing = tmp_path / "nope"
    assert main(["top", str(missing), "--once"]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: key 'RUN_DIR'" in err and "<inline>" not in err
    # a fabric's run directory before its launch: waiting for live.json is the design
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "state.json").write_text("{}")
    assert main(["top", str(tmp_path / "run"), "--once"]) == 0
    assert "waiting for live.json" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"ranks": "x"}, "key 'ranks': expected an object of ranks, found 'x'"),
        ({"t": 1.0, "ranks": {"0": {"done": "abc"}}}, "key 'ranks.0.done': expected a number"),
        ({"ranks": {"r": {}}}, "key 'ranks': expected rank numbers as keys"),
        ({"operation": {"size": "big"}}, "key 'operation.size': expected a number"),
        ([1, 2], "expected a JSON object, found list"),
    ],
)
def test_a_malformed_live_file_is_named_in_the_view_not_a_traceback(
    tmp_path: Path, document: Any, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from rich.console import Console

    from orchestrator.monitor import live

    (tmp_path / live.LIVE_NAME).write_text(json.dumps(document))
    state = live.snapshot(live.LiveSource(tmp_path))
    assert state.progress is None and state.problem is not None
    assert state.problem.startswith(f"{tmp_path / live.LIVE_NAME}: {problem}")
    console = Console(record=True, width=300)
    console.print(live.render(state))
    assert problem in console.export_text()
    assert main(["top", str(tmp_path), "--once"]) == 2  # one look: said as an error too
    assert problem in capsys.readouterr().err


# --- astral clean -------------------------------------------------------------------------------


def test_clean_of_a_missing_state_dir_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo" / "state"
    assert main(["clean", "--state-dir", str(missing)]) == 0
    assert f"nothing to clean: no state dir {missing}" in capsys.readouterr().out
    assert not (tmp_path / "typo").exists()


def test_clean_reports_unreadable_records_and_says_it_is_not_clean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = {
        "r1": "garbage",
        "r2": "{}",
        "r3": json.dumps(
            {"version": 1, "run_id": "r3", "owner_pid": 1, "bridges": "x", "interfaces": None}
        ),
    }
    for name, text in records.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "state.json").write_text(text)
    assert main(["clean", "--state-dir", str(tmp_path)]) == 4
    captured = capsys.readouterr()
    assert "nothing to clean" not in captured.out
    runs = tmp_path / "runs"
    assert f"unreadable run record {runs / 'r1' / 'state.json'}: not JSON" in captured.out
    assert f"{runs / 'r2' / 'state.json'}: key 'version': expected 1" in captured.out
    assert f"{runs / 'r3' / 'state.json'}: key 'bridges': expected array" in captured.out
    assert "a record could not be read" in captured.err


def test_a_record_the_run_wrote_still_loads(tmp_path: Path) -> None:
    from orchestrator.emulation.state import RunState, record_problem, unreadable_runs

    state = RunState.create(tmp_path, command=["astral", "up"])
    state.add_bridges([("s1", "ovs")])
    state.add_interfaces(["s1-eth1"])
    assert record_problem(state.to_dict()) is None
    assert RunState.load(state.run_dir).bridges == [{"name": "s1", "kind": "ovs"}]
    assert unreadable_runs(tmp_path) == []


# --- astral run --out ---------------------------------------------------------------------------


def test_run_refuses_a_non_empty_out_before_bring_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import orchestrator.run.runner as runner

    class NoBringUp:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("the runner (lock, bring-up) was reached")

    monkeypatch.setattr(runner, "Runner", NoBringUp)
    out = tmp_path / "out"
    out.mkdir()
    (out / "something").write_text("x")
    assert main(["run", str(DEFAULT), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "key '--out': expected a new or empty directory" in err and "not empty" in err
    assert sorted(p.name for p in out.iterdir()) == ["something"]
    (tmp_path / "file").write_text("x")
    assert main(["run", str(DEFAULT), "--out", str(tmp_path / "file"), "--quiet"]) == 2
    assert "(a file)" in capsys.readouterr().err


# --- astral compare -----------------------------------------------------------------------------


def test_compare_of_a_run_and_a_replay_is_a_mistake_in_either_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    collectives = str(write_synthetic_bundle(tmp_path / "collectives", policies=("ecmp",)))
    replay = tmp_path / "replay"
    replay.mkdir()
    (replay / "workload.json").write_text(
        json.dumps({"workload": "gpt3-like", "scale": 1e-4, "policies": {}})
    )
    assert main(["compare", collectives, str(replay)]) == 2
    err = capsys.readouterr().err
    assert "key 'B': expected a bundle of collectives, as A is (B replayed a workload)" in err
    assert "--a-policy" not in err
    assert main(["compare", str(replay), collectives]) == 2
    assert "a bundle that replayed a workload, as A did" in capsys.readouterr().err


def test_the_policy_hint_only_where_it_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.commands.compare import policy_hint

    a = str(write_synthetic_bundle(tmp_path / "a", policies=("ecmp",)))
    b = str(write_synthetic_bundle(tmp_path / "b", policies=("path-pinned",)))
    assert main(["compare", a, b]) == 1
    err = capsys.readouterr().err
    assert "A ran ecmp, B path-pinned: --a-policy/--b-policy compare different policies" in err
    given = argparse.Namespace(a_policy="ecmp", b_policy=None)
    none = argparse.Namespace(a_policy=None, b_policy=None)
    assert policy_hint(given, {"ecmp"}, {"path-pinned"}) == ""
    assert policy_hint(none, {"ecmp"}, {"ecmp", "path-pinned"}) == ""  # a policy in common
    assert policy_hint(none, set(), {"ecmp"}) == ""  # nothing ran on one side


# --- a fabric's speeds --------------------------------------------------------------------------


def fabric_document(**speeds: object) -> dict[str, Any]:
    return {
        "name": "tiny", "kind": "astral", "pods": 1, "servers_per_pod": 2,
        "gpus_per_server": 2, "nic_ports": 2, "switch": {"radix": 4, "down_ports": 2},
        "speeds": dict(speeds), "emulation": {"scale": 1e-4},
    }  # fmt: skip


@pytest.mark.parametrize(("key", "value"), [("nic", 1e-9), ("nic", 1), ("tor_agg", "9.9G")])
def test_a_link_speed_too_slow_to_emulate_is_refused_naming_the_key(
    key: str, value: object
) -> None:
    from topologies.errors import FabricSpecError
    from topologies.spec import parse_fabric_spec

    with pytest.raises(FabricSpecError) as caught:
        parse_fabric_spec(fabric_document(**{key: value}), "fabric.yaml")
    text = str(caught.value)
    assert text.startswith(f"fabric.yaml: key 'speeds.{key}': expected a rate of at least 10G")
    assert "1 Mbit/s emulated at emulation.scale 0.0001" in text


def test_the_slowest_emulable_speed_and_every_preset_pass() -> None:
    from topologies.catalog import preset_path
    from topologies.spec import load_fabric_spec, parse_fabric_spec

    assert parse_fabric_spec(fabric_document(nic="10G"), "fabric.yaml").speeds.nic == 1e10
    for name in ("astral-small", "astral-64", "hpn-like", "fat-tree-small", "rail-only-small",
                 "rail-optimized-small"):  # fmt: skip
        load_fabric_spec(preset_path(name))


def test_a_scale_too_small_for_the_default_speeds_is_refused_naming_the_scale() -> None:
    from topologies.errors import FabricSpecError
    from topologies.spec import parse_fabric_spec

    document = fabric_document()
    document["emulation"] = {"scale": 1e-9}  # 200G by default: 200 bit/s emulated
    with pytest.raises(FabricSpecError) as caught:
        parse_fabric_spec(document, "fabric.yaml")
    assert caught.value.key == "emulation.scale" and "at least 5e-06 here" in str(caught.value)


@pytest.mark.parametrize(("tier", "over", "most"), [("agg", 100, "40"), ("tor", 50, "40")])
def test_an_oversubscription_that_slows_links_below_the_floor_is_refused_naming_it(
    tier: str, over: float, most: str
) -> None:
    """Speeds pass as read, but an oversubscription divides its tier's links: 200G / 100 at
    scale 1e-4 is 0.2 Mbit/s, as stalling as a mistyped speed (the floor as built is
    0.5 Mbit/s: 40:1 at most here)."""
    from topologies.errors import FabricSpecError
    from topologies.generators import build_fabric
    from topologies.spec import parse_fabric_spec

    document = {**fabric_document(), "pods": 2, "oversubscription": {tier: over}}
    document["nic_ports"] = 1
    with pytest.raises(FabricSpecError) as caught:
        build_fabric(parse_fabric_spec(document, "fabric.yaml"))
    text = str(caught.value)
    assert caught.value.key == f"oversubscription.{tier}", text
    assert f"at most {most} here" in text, text
    document["oversubscription"] = {tier: 15}  # hpn-like's agg: 1.33 Mbit/s, fine
    build_fabric(parse_fabric_spec(document, "fabric.yaml"))


def scaled_experiment(fabric: str, scale: float) -> dict[str, Any]:
    """A one-size all-reduce on preset ``fabric`` at the experiment's own ``scale``, latencies
    off (their check would refuse a small scale first)."""
    return {
        "name": "slow",
        "fabric": fabric,
        "policy": "path-pinned",
        "collectives": ["all-reduce"],
        "sizes": {"min": "64K", "max": "64K"},
        "scale": scale,
        "latency": "off",
    }


def test_an_experiments_scale_is_held_to_the_oversubscribed_links_too(tmp_path: Path) -> None:
    """hpn-like's 15:1 core links run at 1.33 Mbit/s at its scale: at a third of it the
    experiment's scale is refused, naming the scale, though every speed would pass."""
    from orchestrator.run.experiment import parse_experiment
    from topologies.errors import ExperimentError

    doc = scaled_experiment("hpn-like", 0.3e-4)  # speeds 6 Mbit/s, its core links 0.4 Mbit/s
    with pytest.raises(ExperimentError, match=r"every link as built of the fabric runs at 0\.5"):
        parse_experiment(doc, "slow.yaml", tmp_path)
    parse_experiment({**doc, "scale": 0.6e-4}, "ok.yaml", tmp_path)  # 0.8 Mbit/s: a study's


def test_an_experiments_scale_is_held_to_the_link_floor_too(tmp_path: Path) -> None:
    """The experiment's ``scale:`` replaces the fabric's: the fabric file's floor on the
    emulated rate applies at the scale the run will use."""
    from orchestrator.run.experiment import parse_experiment
    from topologies.errors import ExperimentError

    # latency off: the latencies' own check would refuse this scale first
    doc = scaled_experiment("astral-small", 1e-6)  # 200G -> 0.2 Mbit/s
    with pytest.raises(ExperimentError, match="key 'scale': expected a scale at which every"):
        parse_experiment(doc, "slow.yaml", tmp_path)
    parse_experiment({**doc, "scale": 1e-5}, "ok.yaml", tmp_path)  # 2 Mbit/s: fine
