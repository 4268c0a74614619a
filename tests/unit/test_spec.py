"""Malformed fabric files get one sentence from the real CLI: file, key path, exit status 2.

Every case writes a fabric file to tmp_path and runs ``astral topo show FILE`` the way a
user would (``orchestrator.cli.main``), from an empty working directory that must stay
empty. A few cases also run the installed console script in a subprocess, so that the
absence of a traceback is checked on a real process's stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from topologies.errors import FabricSpecError
from topologies.spec import load_fabric_spec, parse_fabric_spec

VALID: dict[str, Any] = {
    "name": "t",
    "kind": "astral",
    "pods": 2,
    "servers_per_pod": 2,
    "gpus_per_server": 2,
    "nic_ports": 2,
    "switch": {"radix": 4, "down_ports": 2},
    "speeds": {"nic": "200G", "tor_agg": "200G", "agg_core": "200G", "nvlink": "3.6T"},
    "oversubscription": {"tor": 1, "agg": 1},
    "emulation": {"scale": 1.0e-4},
}


def _doc(**changes: object) -> str:
    """VALID with top-level keys replaced (None removes the key), as YAML."""
    doc = dict(VALID)
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return yaml.safe_dump(doc, sort_keys=False)


def _nested(section: str, **changes: object) -> str:
    inner = dict(VALID[section])
    for key, value in changes.items():
        if value is None:
            inner.pop(key, None)
        else:
            inner[key] = value
    return _doc(**{section: inner})


FAT_TREE = {"kind": "fat-tree", "nic_ports": 1, "pods": 4}

# (case id, file text, key path the message must name ("" = the file as a whole),
#  a word the message must contain)
CASES = [
    ("unknown-key", _doc(colour="red"), "colour", "known keys"),
    ("unknown-nested-key", _nested("switch", speed=400), "switch.speed", "known keys"),
    ("unknown-speed-key", _nested("speeds", spine="200G"), "speeds.spine", "known keys"),
    ("pods-wrong-type", _doc(pods="two"), "pods", "integer"),
    ("pods-bool", _doc(pods=True), "pods", "integer"),
    ("pods-float", _doc(pods=1.5), "pods", "integer"),
    ("servers-zero", _doc(servers_per_pod=0), "servers_per_pod", ">= 1"),
    ("gpus-negative", _doc(gpus_per_server=-1), "gpus_per_server", ">= 1"),
    ("radix-one", _nested("switch", radix=1), "switch.radix", ">= 2"),
    ("bad-rate", _nested("speeds", nic="200X"), "speeds.nic", "rate"),
    ("rate-zero", _nested("speeds", tor_agg=0), "speeds.tor_agg", "positive"),
    ("rate-list", _nested("speeds", nvlink=[1, 2]), "speeds.nvlink", "rate"),
    # YAML's .inf and .nan are floats; 1e999G overflows: none may reach max-flow or the report
    ("rate-inf", _nested("speeds", nic=float("inf")), "speeds.nic", "finite"),
    ("rate-nan", _nested("speeds", tor_agg=float("nan")), "speeds.tor_agg", "finite"),
    ("rate-overflow", _nested("speeds", agg_core="1e999G"), "speeds.agg_core", "finite"),
    ("down-equals-radix", _nested("switch", down_ports=4), "switch.down_ports", "uplink"),
    ("down-above-radix", _nested("switch", down_ports=9), "switch.down_ports", "radix"),
    ("missing-switch", _doc(switch=None), "switch", "present"),
    ("missing-radix", _nested("switch", radix=None), "switch.radix", "present"),
    ("switch-not-mapping", _doc(switch=4), "switch", "mapping"),
    ("latency-bad-duration", _doc(latency={"nic": "fast"}), "latency.nic", "duration"),
    ("latency-too-long", _doc(latency={"switch_hop": "2ms"}), "latency.switch_hop", "1ms"),
    ("latency-unknown-key", _doc(latency={"cable": "5ns"}), "latency.cable", "known keys"),
    ("latency-not-mapping", _doc(latency=[1]), "latency", "off, on"),
    ("speeds-list", _doc(speeds=["200G"]), "speeds", "mapping"),
    ("unknown-kind", _doc(kind="torus"), "kind", "fat-tree"),
    ("bad-name", _doc(name="Astral Small"), "name", "lower-case"),
    ("nic-ports-3", _doc(nic_ports=3), "nic_ports", "dual-ToR"),
    ("oversubscription-below-1", _nested("oversubscription", tor=0.5), "oversubscription.tor", ""),
    ("oversubscription-text", _nested("oversubscription", agg="lots"), "oversubscription.agg", ""),
    ("scale-above-1", _nested("emulation", scale=2), "emulation.scale", "between"),
    # Shape is fine, wiring is not (the generators' checks):
    ("astral-too-many-servers", _doc(servers_per_pod=5), "servers_per_pod", "at most 2"),
    (
        "astral-dual-tor-one-down",
        _doc(switch={"radix": 4, "down_ports": 1}),
        "switch.down_ports",
        "",
    ),
    ("astral-too-many-pods", _doc(pods=3), "pods", "core"),
    ("fat-tree-nic-ports-2", _doc(**{**FAT_TREE, "nic_ports": 2}), "nic_ports", "one NIC port"),
    (
        "fat-tree-port-split",
        _doc(**FAT_TREE, switch={"radix": 8, "down_ports": 2}),
        "switch.down_ports",
        "k/2 = 4",
    ),
    (
        "fat-tree-odd-radix",
        _doc(**FAT_TREE, switch={"radix": 5, "down_ports": 2}),
        "switch.radix",
        "even",
    ),
    ("fat-tree-too-many-pods", _doc(**{**FAT_TREE, "pods": 5}), "pods", "at most k = 4"),
    (
        "fat-tree-gpus-do-not-divide",
        _doc(**FAT_TREE, gpus_per_server=3, servers_per_pod=None),
        "gpus_per_server",
        "divisor",
    ),
    (
        "fat-tree-too-many-servers",
        _doc(**FAT_TREE, servers_per_pod=3),
        "servers_per_pod",
        "at most 2",
    ),
    (
        "rail-optimized-too-many-leaves",
        _doc(kind="rail-optimized", pods=1, servers_per_pod=3),
        "servers_per_pod",
        "two-tier",
    ),
    (
        "rail-optimized-agg-oversubscribed",
        _doc(kind="rail-optimized", pods=1, oversubscription={"tor": 1, "agg": 2}),
        "oversubscription.agg",
        "no tier above",
    ),
    ("rail-only-too-many-pods", _doc(kind="rail-only", pods=3), "pods", "radix"),
    (
        "rail-only-too-many-servers",
        _doc(kind="rail-only", pods=2, servers_per_pod=3),
        "servers_per_pod",
        "two-tier rails",
    ),
    # The file as a whole:
    ("bad-yaml", "name: [unclosed\nkind: astral\n", "", "valid YAML"),
    ("bad-yaml-indent", "name: t\n  kind: astral\n", "", "valid YAML"),
    ("duplicate-key", _doc() + "pods: 3\n", "pods", "each key once"),
    (
        "duplicate-nested-key",
        _doc().replace("speeds:\n", "speeds:\n  nic: 100G\n", 1),
        "speeds.nic",
        "each key once",
    ),
    ("deep-nesting", "name: t\nkind: " + "[" * 3000 + "]" * 3000 + "\n", "", "nested"),
    (
        "deep-mapping",
        "name: t\nkind:" + "".join(f"\n{' ' * i}k{i}:" for i in range(1, 60)),
        "",
        "nested",
    ),
    ("recursive-alias", "name: t\nkind: &k [*k]\n", "", "recursive alias at line 2"),
    ("recursive-alias-mapping", "name: t\nspeeds: &s {nic: *s}\n", "", "recursive alias"),
    (
        "alias-chain-deeper-than-the-limit",
        "name: t\na0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 2000)),
        "",
        "nested",
    ),
    (
        "alias-bomb",
        "name: t\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9)),
        "",
        "values once aliases are expanded",
    ),
    ("empty-file", "", "", "mapping"),
    ("only-comment", "# nothing here\n", "", "mapping"),
    ("list-not-mapping", "- name: t\n- kind: astral\n", "", "mapping"),
    ("scalar-not-mapping", "astral\n", "", "mapping"),
]


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def _check_cli_error(
    path: Path, key: str, word: str, cwd: Path, capsys: pytest.CaptureFixture[str]
) -> str:
    status = main(["topo", "show", str(path)])
    out, err = capsys.readouterr()
    assert status == 2, (status, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("astral: error: ")
    assert str(path) in err
    if key:
        assert f"key '{key}'" in err
    assert word in err
    assert "Traceback" not in err
    assert list(cwd.iterdir()) == []
    return err


def test_at_least_twenty_distinct_cases() -> None:
    assert len(CASES) >= 20
    assert len({text for _, text, _, _ in CASES}) == len(CASES)


def test_the_valid_document_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "valid.yaml"
    path.write_text(_doc())
    assert load_fabric_spec(path).name == "t"


@pytest.mark.parametrize(("text", "key", "word"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_file_is_one_sentence(
    text: str,
    key: str,
    word: str,
    tmp_path: Path,
    empty_cwd: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "fabric.yaml"
    path.write_text(text)
    _check_cli_error(path, key, word, empty_cwd, capsys)


def test_missing_file(tmp_path: Path, empty_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _check_cli_error(tmp_path / "nope.yaml", "", "no such file", empty_cwd, capsys)


def test_directory_instead_of_file(
    tmp_path: Path, empty_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    _check_cli_error(folder, "", "readable", empty_cwd, capsys)


def test_not_utf8(tmp_path: Path, empty_cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    _check_cli_error(path, "", "UTF-8", empty_cwd, capsys)


def test_png_option_does_not_hide_the_error(
    tmp_path: Path, empty_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fabric.yaml"
    path.write_text(_doc(pods="two"))
    status = main(["topo", "show", str(path), "--png", "out.png", "--json"])
    _, err = capsys.readouterr()
    assert status == 2 and "key 'pods'" in err
    assert list(empty_cwd.iterdir()) == []


def _console_script() -> list[str]:
    script = Path(sys.executable).parent / "astral"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "orchestrator.cli"]


@pytest.mark.parametrize(
    ("case_id"),
    [
        "unknown-key",
        "bad-yaml",
        "fat-tree-nic-ports-2",
        "empty-file",
        "deep-nesting",
        "duplicate-nested-key",
        "recursive-alias",
        "alias-chain-deeper-than-the-limit",
        "alias-bomb",
    ],
)
def test_console_script_prints_no_traceback(case_id: str, tmp_path: Path) -> None:
    _, text, key, word = next(c for c in CASES if c[0] == case_id)
    path = tmp_path / "fabric.yaml"
    path.write_text(text)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run(
        [*_console_script(), "topo", "show", str(path)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPLBACKEND": "Agg"},
        check=False,
    )
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert str(path) in result.stderr and word in result.stderr
    if key:
        assert f"key '{key}'" in result.stderr
    assert result.stdout == ""
    assert list(cwd.iterdir()) == []


def test_parse_errors_carry_structured_fields() -> None:
    with pytest.raises(FabricSpecError) as info:
        parse_fabric_spec({**VALID, "nic_ports": 3}, "f.yaml")
    assert info.value.file == "f.yaml"
    assert info.value.key == "nic_ports"
    assert info.value.found == 3
    assert info.value.exit_status == 2


def test_defaults() -> None:
    spec = parse_fabric_spec(
        {"name": "d", "kind": "fat-tree", "gpus_per_server": 2, "switch": {"radix": 4}}
    )
    assert spec.pods == 1 and spec.servers_per_pod is None
    assert spec.nic_ports == 1  # astral defaults to dual-ToR, the others to one port
    assert spec.switch.down_ports == 2 and spec.switch.up_ports == 2
    without = {key: value for key, value in VALID.items() if key != "nic_ports"}
    assert parse_fabric_spec(without).nic_ports == 2
