"""A study: one experiment file that names several fabrics or sweeps keys, validated into
its variants, each a complete :class:`~orchestrator.run.experiment.ExperimentSpec`.

The question Astral answers is comparative (same-rail dual-ToR against single-ToR, a 1:1
against a 15:1 core, ECMP against pinning), so an experiment may ask it in one file::

    name: core-oversubscription
    fabric: astral-small             # or `fabrics: [astral-small, hpn-like, my-fabric.yaml]`
    sweep:                           # any experiment or fabric key, dotted
      oversubscription.agg: [1, 15]  # (orchestrator.run.overrides says which is which)
      scale: [0.6e-4, 1.0e-4]
    sweep_mode: product              # product (default): every combination; zip: the
                                     # lists side by side, all of one length
    policies: [path-pinned]
    collectives: [all-to-all]
    sizes: {min: 256K, max: 1M, factor: 4}
    study:                           # optional: what the study asks and what to expect
      question: what does a 15:1 core cost cross-pod all-to-all?
      expected: about 1/15 of the bandwidth where the core is the bottleneck
      checks:                        # verdicts on the measured figures
        - {name: ..., of: {oversubscription.agg: 15}, to: {oversubscription.agg: 1},
           collective: all-to-all, ratio: [0.03, 0.4]}

The variants are the product (or zip) of the fabrics with the swept values, in file order,
the first varying slowest. A sweep value of ``null`` leaves the key out (its default). Every
variant is validated before anything runs, as a file would be: a bad value is the
validator's error naming its key, with the variant it belongs to. The checks are
orchestrator.study.checks'.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.run.experiment import (
    PLOT_KEYS,
    PLOT_METRICS,
    STUDY_KEYS,
    STUDY_SECTION_KEYS,
    SWEEP_MODES,
    UNSWEPT,
    WORKLOAD_KEY,
    ExperimentSpec,
    parse_experiment,
)
from orchestrator.run.overrides import changed
from orchestrator.study.checks import Check, parse_checks
from orchestrator.workload.spec import resolve_workload
from topologies.catalog import is_preset_name, resolve_fabric
from topologies.errors import ConfigError, ExperimentError, FabricSpecError, WorkloadError
from topologies.yamlfile import read_yaml

FABRIC_AXIS = "fabric"  # the key a variant's fabric goes by in labels and check selectors


@dataclass(frozen=True)
class Variant:
    """One point of the study: its settings (swept key -> value, ``fabric`` -> the fabric's
    name where the study names several) and the experiment they make."""

    index: int  # from 0, in the study's order
    settings: tuple[tuple[str, Any], ...]
    spec: ExperimentSpec
    document: Mapping[str, Any]  # the variant as an experiment file would say it

    @property
    def label(self) -> str:
        """``hpn-like, nic_ports=1``; the study's name where nothing varies."""
        parts = [
            str(value) if key == FABRIC_AXIS else f"{key}={value_text(value)}"
            for key, value in self.settings
        ]
        return ", ".join(parts) or self.spec.name

    @property
    def slug(self) -> str:
        """For its bundle's directory: ``02-nic_ports=1``."""
        text = re.sub(r"[^A-Za-z0-9._=+-]+", "-", self.label).strip("-")[:60]
        return f"{self.index + 1:02d}-{text}"

    def setting(self, key: str) -> Any:
        return dict(self.settings).get(key)


@dataclass(frozen=True)
class StudySpec:
    """A validated study: its variants and what it asks."""

    name: str
    source: str
    variants: tuple[Variant, ...]
    axes: tuple[str, ...]  # the keys that vary, ``fabric`` first where several are named
    mode: str = "product"
    description: str = ""
    question: str = ""
    expected: str = ""
    checks: tuple[Check, ...] = ()
    plot: Mapping[str, str] | None = None  # study.plot: {metric, x}; None: busbw, automatic

    def by_fabric(self) -> list[list[Variant]]:
        """The variants grouped by the fabric they emulate, in order of first appearance:
        each group is one bring-up (the runner's unit)."""
        groups: dict[object, list[Variant]] = {}
        for variant in self.variants:
            groups.setdefault(variant.spec.fabric, []).append(variant)
        return list(groups.values())


def value_text(value: object) -> str:
    """A swept value as a label shows it: ``15``, ``400G``, ``none``; a mapping by its
    values (``[switch-down p0r0t0 0s]`` for a list of one fault)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(value_text(item) for item in value) + "]"
    if isinstance(value, dict):  # a fault, a latency mapping: its values, in order
        return " ".join(value_text(item) for item in value.values())
    return str(value)


def is_study(document: object) -> bool:
    """Whether a parsed experiment document is a study (has any of a study's keys)."""
    return isinstance(document, Mapping) and bool(STUDY_KEYS & set(document))


def parse_study(
    document: object, source: str = "<inline>", base_dir: str | Path = "."
) -> StudySpec:
    """Validate a study document into its variants (see the module docstring)."""
    if not isinstance(document, Mapping):
        raise ExperimentError(source, "", "a mapping of experiment keys", type(document).__name__)
    base = {key: value for key, value in document.items() if key not in STUDY_KEYS}
    base_dir = Path(base_dir)
    fabrics = _fabrics(document, source)
    if fabrics and "fabric" in base:
        raise ExperimentError(source, "fabrics", "either 'fabric' or 'fabrics', not both", "both")
    sweep = _sweep(document.get("sweep"), source)
    mode = document.get("sweep_mode", "product")
    if mode not in SWEEP_MODES:
        raise ExperimentError(source, "sweep_mode", "one of " + ", ".join(SWEEP_MODES), mode)
    if mode == "zip" and len({len(values) for _, values in sweep}) > 1:
        lengths = ", ".join(f"{key}: {len(values)}" for key, values in sweep)
        raise ExperimentError(source, "sweep", "lists of one length with sweep_mode zip", lengths)
    section = _section(document.get("study", {}), source)

    axes: list[tuple[str, list[Any]]] = []
    if len(fabrics) > 1:
        axes.append((FABRIC_AXIS, fabrics))
    keys = [key for key, _ in sweep]
    rows: list[list[tuple[str, Any]]]
    if mode == "zip" and sweep:
        columns = zip(*(values for _, values in sweep), strict=True)
        rows = [list(zip(keys, values, strict=True)) for values in columns]
    else:
        pairs = ([(key, value) for value in values] for key, values in sweep)
        rows = [list(combo) for combo in itertools.product(*pairs)]
    fabric_values = fabrics or [base.get("fabric")]
    variants: list[Variant] = []
    for fabric in fabric_values:
        for row in rows:
            variants.append(_variant(len(variants), base, fabric, row, fabrics, source, base_dir))
    study_name = variants[0].spec.name
    labels = [variant.label for variant in variants]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise ExperimentError(source, "fabrics", "fabrics of distinct names", label)
    checks = parse_checks(section.get("checks"), variants, source)
    plot = _plot(section.get("plot"), [key for key, _ in axes] + [key for key, _ in sweep], source)
    description = base.get("description", "")
    return StudySpec(
        name=study_name,
        source=source,
        variants=tuple(variants),
        axes=tuple(key for key, _ in axes) + tuple(key for key, _ in sweep),
        mode=mode,
        description=description if isinstance(description, str) else "",
        question=section.get("question", ""),
        expected=section.get("expected", ""),
        checks=checks,
        plot=plot,
    )


def load_study(path: str | Path) -> StudySpec:
    """Read and validate a study file (every problem one ConfigError naming the file)."""
    path = Path(path)
    document = read_yaml(path, ExperimentError, "experiment")
    return parse_study(document, str(path), path.parent)


def _fabrics(document: Mapping[str, Any], source: str) -> list[Any]:
    if "fabrics" not in document:
        return []
    value = document["fabrics"]
    if not isinstance(value, list) or not value:
        raise ExperimentError(
            source, "fabrics", "a non-empty list of fabrics (preset names, files or mappings)",
            value,
        )  # fmt: skip
    return value


def _sweep(value: object, source: str) -> list[tuple[str, list[Any]]]:
    if value is None:
        return []
    if not isinstance(value, Mapping) or not value:
        raise ExperimentError(source, "sweep", "a mapping of dotted keys to lists of values", value)
    sweep = []
    for key, values in value.items():
        where = f"sweep.{key}"
        if not isinstance(key, str) or key.split(".", 1)[0] in STUDY_KEYS or key in UNSWEPT:
            raise ExperimentError(
                source, where, "an experiment or fabric key (fabrics: names several fabrics)", key
            )
        if not isinstance(values, list) or not values:
            raise ExperimentError(source, where, "a non-empty list of values", values)
        for i, item in enumerate(values):
            if item in values[:i]:
                raise ExperimentError(source, f"{where}[{i}]", "each value once", item)
        sweep.append((key, values))
    return sweep


def _section(value: object, source: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ExperimentError(source, "study", "a mapping of question, expected, checks", value)
    for key in value:
        if key not in STUDY_SECTION_KEYS:
            raise ExperimentError(
                source,
                f"study.{key}",
                "one of the known keys " + ", ".join(sorted(STUDY_SECTION_KEYS)),
                "unknown key",
            )
    for key in ("question", "expected"):
        if key in value and not isinstance(value[key], str):
            raise ExperimentError(source, f"study.{key}", "a text", value[key])
    return dict(value)


def _plot(value: object, axes: Sequence[str], source: str) -> dict[str, str] | None:
    """``study.plot``: ``metric`` (busbw or algbw) and ``x`` (a swept key)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ExperimentError(source, "study.plot", "a mapping of metric and x", value)
    for key in value:
        if key not in PLOT_KEYS:
            known = "one of the known keys " + ", ".join(sorted(PLOT_KEYS))
            raise ExperimentError(source, f"study.plot.{key}", known, "unknown key")
    metric = value.get("metric", PLOT_METRICS[0])
    if metric not in PLOT_METRICS:
        raise ExperimentError(
            source, "study.plot.metric", "one of " + ", ".join(PLOT_METRICS), metric
        )
    plot = {"metric": metric}
    if "x" in value:
        if value["x"] not in axes:
            raise ExperimentError(
                source, "study.plot.x", "a key the study varies: " + ", ".join(axes), value["x"]
            )
        plot["x"] = value["x"]
    return plot


def _variant(
    index: int,
    base: Mapping[str, Any],
    fabric: object,
    row: Sequence[tuple[str, Any]],
    fabrics: Sequence[Any],
    source: str,
    base_dir: Path,
) -> Variant:
    """One variant, validated as an experiment; an error names the variant."""
    document = dict(base)
    if fabric is not None:
        document["fabric"] = fabric
    settings: list[tuple[str, Any]] = []
    label_parts = []
    if len(fabrics) > 1:
        name = _fabric_name(fabric)
        settings.append((FABRIC_AXIS, name))
        label_parts.append(name)
    label_parts += [f"{key}={value_text(value)}" for key, value in row]
    where = ", ".join(label_parts) or "the only variant"
    try:
        document = changed(document, list(row), source=source, base_dir=base_dir)
        spec = parse_experiment(document, source, base_dir)
        document = _self_contained(document, base_dir)
    except ConfigError as err:
        detail = "; ".join(filter(None, [f"in variant {index + 1} ({where})", err.detail]))
        raise type(err)(err.file, err.key, err.expected, err.found, detail=detail) from None
    settings += [(key, value) for key, value in row]
    return Variant(index, tuple(settings), spec, document)


def _self_contained(document: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The variant's document with its fabric and workload files inlined (presets stay
    named): its bundle's experiment.yaml is re-runnable alone, and a path relative to the
    study file would resolve from the variant's directory instead, or break once the
    bundle moves. Called once the variant validated, so the files are there and read."""
    out = dict(document)
    fabric = out.get("fabric")
    if isinstance(fabric, str) and not is_preset_name(fabric):
        out["fabric"] = read_yaml(resolve_fabric(fabric, base_dir), FabricSpecError, "fabric")
    workload = out.get(WORKLOAD_KEY)
    if isinstance(workload, str) and not is_preset_name(workload):
        path = resolve_workload(workload, base_dir)
        out[WORKLOAD_KEY] = read_yaml(path, WorkloadError, "workload")
    return out


def _fabric_name(fabric: object) -> str:
    """How a variant's fabric is named: a preset's name, a file's stem, a mapping's name."""
    if isinstance(fabric, Mapping):
        return str(fabric.get("name", "inline"))
    return Path(str(fabric)).stem if str(fabric).endswith((".yaml", ".yml")) else str(fabric)


__all__ = [
    "FABRIC_AXIS",
    "StudySpec",
    "Variant",
    "is_study",
    "load_study",
    "parse_study",
]
