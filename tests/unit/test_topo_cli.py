"""``astral topo show`` and ``astral topo plan`` through the real CLI, and the PNG drawing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.commands.topo import rate, table
from topologies.catalog import DEFAULT_FABRIC, preset_names, preset_path
from topologies.drawing import MAX_NODES, draw_fabric, drawable
from topologies.generators import build_fabric
from topologies.spec import load_fabric_spec, parse_fabric_spec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PRESET_NAMES = preset_names()


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_presets_are_all_there() -> None:
    assert DEFAULT_FABRIC.exists()
    assert set(PRESET_NAMES) >= {
        "astral-small",
        "fat-tree-small",
        "rail-optimized-small",
        "rail-only-small",
        "hpn-like",
    }


def test_show_default(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "show"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("astral-small: astral fabric from ")
    for text in (
        "8 GPUs",
        "Bisection",
        "bisection bandwidth: 1.6T = 400G per GPU = 1.00",
        "same rail, same ToR",
        "p0s0g0 -> p0s1g0",
        "absent",
        "maximum hops between any two GPUs: 5",
        "latency one way, real -> emulated (/ scale): NVLink 0.6us -> 6ms, 1 switch 2.7us -> 27ms",
        "Drawing: not written",
    ):
        assert text in out, text
    assert list(cwd.iterdir()) == []  # no PNG unless asked


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_show_every_preset_by_name_with_png(
    name: str, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topo", "show", name, "--png", "out.png"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{name}: ")
    png = cwd / "out.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert f"written to {png.resolve()}" in out


def test_show_json(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "show", str(preset_path("hpn-like")), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "astral" and data["png"] is None
    assert data["bisection"]["ratio"] == pytest.approx(1 / 15)
    assert [t["tier"] for t in data["tiers"]] == ["tor", "agg", "core"]


def test_show_big_fabric_skips_the_drawing(
    tmp_path: Path, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("name: big\nkind: fat-tree\npods: 8\ngpus_per_server: 4\nswitch: {radix: 8}\n")
    assert main(["topo", "show", str(path), "--png", "big.png"]) == 0
    out = capsys.readouterr().out
    assert "Drawing: skipped" in out and "128 GPUs" in out
    assert not (cwd / "big.png").exists()


def test_show_png_into_a_missing_directory(cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "show", "--png", "no/such/dir/x.png"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("astral: error: cannot write no/such/dir/x.png")


def test_plan_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "plan"]) == 0
    out = capsys.readouterr().out
    for text in (
        "GPUs per ToR             128",
        "GPUs per rail plane    8,192",
        "GPUs per pod          65,536",
        "GPUs                 524,288",
        "per server 3.2T",
        "network total       20,480",
        "6,291,456",
        "Kinds compared at 524,288 GPUs",
        "rail-optimized: out of reach",
        "Kinds compared at 16,384 GPUs (the most every kind reaches)",
    ):
        assert text in out, text


def test_plan_json_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["topo", "plan", "--radix", "64", "--pods", "2", "--oversubscription-agg", "4"]
    assert main([*argv, "--compare-gpus", "512", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["gpus"] == 2 * 32 * 16 * 8
    assert data["plan"]["tier_ratios"]["agg"] == pytest.approx(4)
    assert data["comparisons"][0]["gpus"] == 512
    assert all(k["reachable"] for k in data["comparisons"][0]["kinds"])


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--down-ports", "256"], "--down-ports"),
        (["--nic-ports", "3"], "--nic-ports"),
        (["--port-speed", "fast"], "--port-speed"),
        (["--pods", "100"], "--pods"),
        (["--rails", "0"], "--rails"),
        (["--compare-gpus", "1"], "--compare-gpus"),
    ],
)
def test_plan_bad_options(argv: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("astral: error: astral topo plan: ")
    assert f"key '{option}'" in err and "Traceback" not in err


def test_rate_and_table_helpers() -> None:
    assert [rate(x) for x in (2e11, 1.6e12, 1.048576e17, 13.3333e9, None)] == [
        "200G",
        "1.6T",
        "104.9P",
        "13.33G",
        "-",
    ]
    assert table([["a", "bb"], ["ccc", "d"]]) == ["  a    bb", "  ccc   d"]


# --- drawing --------------------------------------------------------------------------------


def test_drawing_refuses_large_fabrics(tmp_path: Path) -> None:
    spec = parse_fabric_spec(
        {"name": "big", "kind": "fat-tree", "pods": 8, "gpus_per_server": 4, "switch": {"radix": 8}}
    )
    fabric = build_fabric(spec)
    ok, why = drawable(fabric)
    assert not ok and str(MAX_NODES) in why
    with pytest.raises(ValueError):
        draw_fabric(fabric, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_drawing_marks_parallel_and_oversubscribed_links(tmp_path: Path) -> None:
    """Smoke test on a fabric with parallel links (1 core for 2 uplinks) and a 15:1 core."""
    spec = load_fabric_spec(preset_path("hpn-like"))
    spec = parse_fabric_spec({**spec.to_dict(), "pods": 1})
    path = draw_fabric(build_fabric(spec), tmp_path / "x.png")
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000
