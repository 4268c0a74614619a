"""An experiment or a workload given where a fabric description is expected (``astral topo
show EXPERIMENT.yaml``) is named for what it is, with where its fabric is, not by the first
key a fabric does not know."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main as cli_main
from tests.helpers import REPO
from topologies.errors import FabricSpecError
from topologies.spec import parse_fabric_spec


def test_an_experiment_is_named_with_its_fabric() -> None:
    document = yaml.safe_load((REPO / "experiments" / "default.yaml").read_text())
    with pytest.raises(FabricSpecError) as error:
        parse_fabric_spec(document, "default.yaml")
    text = str(error.value)
    assert "an experiment" in text and "`fabric: astral-small`" in text, text
    assert "unknown key" not in text


def test_a_workload_is_named() -> None:
    with pytest.raises(FabricSpecError, match="a training workload"):
        parse_fabric_spec({"name": "w", "model": {"layers": 2}}, "w.yaml")


def test_a_fabric_without_its_kind_is_still_told_what_is_missing() -> None:
    with pytest.raises(FabricSpecError, match="kind") as error:
        parse_fabric_spec({"name": "f", "gpus_per_server": 2}, "f.yaml")
    assert "an experiment" not in str(error.value)


def test_topo_show_of_an_experiment_exits_2_without_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("name: e\nfabric: fat-tree-small\ncollectives: [all-reduce]\n")
    assert cli_main(["topo", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{path}: expected a fabric description" in err and "fat-tree-small" in err
