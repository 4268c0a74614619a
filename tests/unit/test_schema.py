"""The JSON Schemas ``astral schema`` generates (topologies/schema.py, docs/schemas.md).

Checked here: each is valid draft 2020-12; it accepts every shipped file and the valid
documents of the validators' tests; it refuses every malformed document its validator
refuses, except those listed below as the validator's alone, each with its reason (and
for those, that the schema really lets them through: when it learns to refuse one, the
list must shrink); its keys are the validator's key sets; the committed copies in
docs/schemas/ are what the generator writes now, and every shipped file's first line names
the right one.

The malformed documents are the validators' own tests' (``test_spec.CASES``,
``test_experiment.MALFORMED``, ``test_fault_schedule.MISTAKES``,
``test_remote.BAD_MACHINES``), so a case added there is checked here too, plus
:data:`EXTRA` for what those do not cover.

What only the validators check (a JSON Schema sees one document, key by key):

- whether the kind can wire the fabric (radix, port split, counts: the generators' checks);
- comparisons between keys: ``switch.down_ports`` below ``switch.radix``, ``sizes.max`` at
  least ``sizes.min``;
- names that must exist in the generated fabric: ``placement.gpus``, a fault's ``target``
  and ``destination``, a blackhole's switch not being an NVSwitch; a GPU count above the
  fabric's; sizes too small for one element per rank;
- that a fabric path names an existing file;
- two spellings of one collective (``all-reduce`` and ``{op: all-reduce, algorithm: ring}``);
- the range of a value written as text: a number (``scale: "0"``), a duration against its
  bound (a latency above 1ms, a flap period at most 200ms);
- a whole number written with a decimal point (``pods: 2.0``): JSON Schema counts it as an
  integer, the reader wants an ``int``;
- and, before any of these, what the YAML loader refuses: syntax errors, a key written twice
  (PyYAML keeps the last one, so the document never shows it), nesting and alias limits.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from orchestrator.cli import main
from orchestrator.collectives.sizes import MAX_SIZE, SIZE, format_size, parse_size
from orchestrator.commands.schema import SCHEMAS, render
from orchestrator.remote import inventory
from orchestrator.remote.inventory import parse_inventory
from orchestrator.run import experiment
from orchestrator.run.experiment import parse_experiment
from orchestrator.study.checks import CHECK_KEYS
from orchestrator.study.spec import STUDY_SECTION_KEYS, is_study, parse_study
from orchestrator.testbed.faultspec import COMMON_KEYS, PARAM_KEYS
from tests.helpers import REPO
from tests.unit import (
    test_experiment,
    test_fault_schedule,
    test_remote,
    test_spec,
    test_study,
)
from topologies import spec
from topologies.errors import ConfigError
from topologies.generators import build_fabric
from topologies.schema import mapping, pattern
from topologies.spec import parse_fabric_spec
from topologies.units import DURATION, NUMBER_TEXT, RATE
from topologies.yamlfile import parse_yaml, read_yaml

SCHEMA_DIR = REPO / "docs" / "schemas"
HEADER = "# yaml-language-server: $schema="

#: The files each kind's schema must accept (experiments/ at any depth).
SHIPPED: dict[str, Callable[[], list[Path]]] = {
    "fabric": lambda: sorted((REPO / "topologies" / "presets").glob("*.yaml")),
    "experiment": lambda: sorted((REPO / "experiments").rglob("*.y*ml")),
    "machines": lambda: [REPO / "machines.yaml"],
}


@functools.cache
def schema(kind: str) -> dict[str, Any]:
    """The schema as the committed file holds it (JSON: tuples become lists)."""
    document: dict[str, Any] = json.loads(render(kind))
    return document


def accepts(kind: str, document: object) -> bool:
    return Draft202012Validator(schema(kind)).is_valid(document)


def validate(kind: str, document: object, base_dir: Path = REPO) -> None:
    """The validator of ``kind`` on ``document``: raises ConfigError if it refuses it."""
    if kind == "fabric":
        build_fabric(parse_fabric_spec(document, "case.yaml"))
    elif kind == "experiment" and is_study(document):
        parse_study(document, "case.yaml", base_dir)
    elif kind == "experiment":
        parse_experiment(document, "case.yaml", base_dir)
    else:
        parse_inventory(document, Path("/somewhere/machines.yaml"))


# --- valid ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(SCHEMAS))
def test_each_schema_is_valid_draft_2020_12(kind: str) -> None:
    Draft202012Validator.check_schema(schema(kind))
    assert schema(kind)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize(
    ("kind", "path"),
    [(kind, path) for kind, files in SHIPPED.items() for path in files()],
    ids=lambda value: value if isinstance(value, str) else value.relative_to(REPO).as_posix(),
)
def test_every_shipped_file_is_valid_for_both(kind: str, path: Path) -> None:
    document = read_yaml(path, ConfigError, kind)
    errors = [e.message for e in Draft202012Validator(schema(kind)).iter_errors(document)]
    assert errors == [], path
    validate(kind, document, path.parent)


def test_every_kind_has_shipped_files() -> None:
    assert all(files() for files in SHIPPED.values())


# an experiment that replays a workload instead of collectives and sizes
WORKLOAD_EXPERIMENT = {
    **{
        k: v
        for k, v in yaml.safe_load(test_experiment.VALID).items()
        if k not in ("collectives", "sizes")
    },
    "workload": "deepseek-like",
}

VALID_DOCUMENTS = [
    ("fabric", test_spec.VALID),
    ("fabric", {**test_spec.VALID, "servers_per_pod": None, "latency": "off"}),
    ("fabric", {**test_spec.VALID, "latency": {"nic": 0.4, "library": "1.3\u00b5s"}}),
    ("fabric", {**test_spec.VALID, "speeds": {"nic": "100 Gbps", "nvlink": 3.6e12}}),
    ("fabric", {**test_spec.VALID, "oversubscription": {"tor": "1e0", "agg": 3}}),
    ("experiment", yaml.safe_load(test_experiment.VALID)),
    ("experiment", yaml.safe_load(test_experiment.INLINE_FABRIC)),
    ("experiment", {**yaml.safe_load(test_experiment.VALID), "latency": False, "scale": "1e-4"}),
    ("experiment", {**yaml.safe_load(test_experiment.VALID), "placement": {"gpus": 4}}),
    (
        "experiment",
        {**test_fault_schedule.BASE, **yaml.safe_load(test_fault_schedule.ISSUE_EXAMPLE)},
    ),
    ("experiment", WORKLOAD_EXPERIMENT),
    ("experiment", {**WORKLOAD_EXPERIMENT, "workload": "workloads/deepseek-like.yaml"}),
    ("machines", test_remote.inventory({"host": "lab1.example.org"})),
    ("machines", test_remote.inventory({"vagrant": ".", "vagrant_machine": "default"})),
    ("machines", test_remote.inventory({"host": "h", "sudo": None, "timeouts": {"idle": 1.5}})),
    ("machines", {"machines": {}}),
]


@pytest.mark.parametrize(("kind", "document"), VALID_DOCUMENTS)
def test_the_validators_valid_documents_are_valid_for_the_schema(
    kind: str, document: object
) -> None:
    validate(kind, document)
    errors = [e.message for e in Draft202012Validator(schema(kind)).iter_errors(document)]
    assert errors == []


# --- malformed -----------------------------------------------------------------------------

#: Cases of the shared tables that are no document at all: the YAML loader refuses the text.
LOADER_ONLY = {
    *("bad-yaml", "bad-yaml-indent", "duplicate-key", "duplicate-nested-key", "deep-nesting"),
    *("deep-mapping", "recursive-alias", "recursive-alias-mapping"),
    *("alias-chain-deeper-than-the-limit", "alias-bomb"),
    *("not yaml", "a key twice", "a key twice in the inline fabric", "nesting thousands deep"),
    *("a recursive alias", "an alias chain deeper than the limit"),
    "an alias bomb in the collectives",
}

#: Cases the validator refuses and a JSON Schema cannot (the module docstring says why).
VALIDATOR_ONLY = {
    # fabric (besides what a generator cannot wire, found by building the fabric)
    "down-equals-radix": "compares switch.down_ports with switch.radix",
    "down-above-radix": "compares switch.down_ports with switch.radix",
    "latency-too-long": "a duration written as text against MAX_LATENCY",
    "rate-inf": "JSON has no infinity (YAML's .inf), so no schema keyword refuses it",
    "rate-nan": "JSON has no NaN (YAML's .nan), so no schema keyword refuses it",
    "rate-overflow": "a rate written as text whose value overflows to infinity",
    "fabric: scale as text, zero": "the range of a number written as text",
    "fabric: pods 2.0": "JSON Schema counts 2.0 as an integer",
    # experiment
    "fabric file absent": "the file system",
    "inline fabric: cannot be wired": "the generator's wiring check",
    "max below min": "compares sizes.max with sizes.min",
    "sizes below one element per rank": "needs the number of ranks",
    "unknown GPU": "names of the generated fabric",
    # a study's: its variants are validated as experiments after the swept value is set,
    # and its checks name variants, collectives and policies the variants run
    "study: fabric.oversubscription.agg: variant 2": "a swept value, checked per variant",
    "study: iterations: variant 2 (iterations=many)": "a swept value, checked per variant",
    "study: placement.gpus: variant 2": "a swept value, checked per variant",
    "check: study.checks[0].of: exactly one variant": "which variants the study has",
    "check: study.checks[0].of.oversubscription.tor: swept": "which keys the study sweeps",
    "check: study.checks[0].collective: the study runs": "which collectives the study runs",
    "check: study.checks[0].collective: the study runs several": "the study's collectives",
    "check: study.checks[0].ratio: 0 <= low <= high": "compares low with high",
    "check: study.checks[0].of.policy: a policy of the variant": "the variant's policies",
    "study: study.plot.x: a key the study varies: iterations": "which keys the study varies",
    "too many GPUs": "the generated fabric's GPU count",
    "collective listed twice": "two spellings of one collective",
    "experiment: latency as text above 1ms": "a duration written as text against MAX_LATENCY",
    "experiment: scale negative text": "the range of a number written as text",
    "min_batch below the floor": "a duration written as text against MIN_BATCH_RANGE",
    "min_batch an hour": "a duration written as text against MIN_BATCH_RANGE",
    # faults (MISTAKES, by the words their error says)
    "nearest: p1s0g0-p1r0t1": "names of the generated fabric",
    "nearest: p1r1t1": "names of the generated fabric",
    "nearest: p1s0g1, p1s0g0": "names of the generated fabric",
    "nearest: p1s1g1, p1s1g0": "names of the generated fabric",
    "OpenFlow switch": "the tier of a switch of the generated fabric",
    "above 200ms": "a duration written as text against MIN_FLAP_PERIOD",
}

EXPERIMENT = yaml.safe_load(test_experiment.VALID)
MACHINE = {"host": "h"}


def _with(document: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """``document`` with the dotted ``path`` set to ``value`` (``...`` removes it)."""
    changed = copy.deepcopy(document)
    *parents, last = path.split(".")
    where = changed
    for key in parents:
        where = where[key]
    if value is ...:
        del where[last]
    else:
        where[last] = value
    return changed


def _fabric(path: str, value: object) -> dict[str, Any]:
    return _with(test_spec.VALID, path, value)


def _experiment(path: str, value: object) -> dict[str, Any]:
    return _with(EXPERIMENT, path, value)


def _fault(**entry: object) -> dict[str, Any]:
    return _experiment("faults", [entry])


def _machine(**changes: object) -> object:
    return test_remote.inventory({**MACHINE, **changes})


#: (kind, id, document): what the shared tables leave out, at every level.
EXTRA: list[tuple[str, str, object]] = [
    ("fabric", "fabric: name missing", _fabric("name", ...)),
    ("fabric", "fabric: kind missing", _fabric("kind", ...)),
    ("fabric", "fabric: gpus_per_server missing", _fabric("gpus_per_server", ...)),
    ("fabric", "fabric: name too long", _fabric("name", "a" * 33)),
    ("fabric", "fabric: name a number", _fabric("name", 7)),
    ("fabric", "fabric: nic_ports 0", _fabric("nic_ports", 0)),
    ("fabric", "fabric: pods null", _fabric("pods", None)),
    ("fabric", "fabric: radix text", _fabric("switch.radix", "4")),
    ("fabric", "fabric: down_ports 0", _fabric("switch.down_ports", 0)),
    ("fabric", "fabric: rate as text, zero", _fabric("speeds.nic", "0.0G")),
    ("fabric", "fabric: rate negative", _fabric("speeds.nic", "-5G")),
    ("fabric", "fabric: rate a boolean", _fabric("speeds.nic", True)),
    ("fabric", "fabric: oversubscription above 1000", _fabric("oversubscription.tor", 1001)),
    ("fabric", "fabric: number text float() takes", _fabric("oversubscription.tor", "1_0")),
    ("fabric", "fabric: scale as text, zero", _fabric("emulation.scale", "0")),
    ("fabric", "fabric: scale zero", _fabric("emulation.scale", 0)),
    ("fabric", "fabric: emulation unknown key", _fabric("emulation.speed", 1)),
    ("fabric", "fabric: latency a word", _fabric("latency", "sometimes")),
    ("fabric", "fabric: latency above 1ms as a number", _fabric("latency", {"nic": 1001})),
    ("fabric", "fabric: latency negative", _fabric("latency", {"nic": -1})),
    ("fabric", "fabric: pods 2.0", _fabric("pods", 2.0)),
    ("experiment", "experiment: description a number", _experiment("description", 5)),
    ("experiment", "experiment: collectives missing", _experiment("collectives", ...)),
    ("experiment", "experiment: sizes missing", _experiment("sizes", ...)),
    (
        "experiment",
        "experiment: a workload beside collectives",
        _experiment("workload", "deepseek-like"),
    ),
    ("experiment", "experiment: workload a number", _experiment("workload", 3)),
    ("experiment", "experiment: fabric empty", _experiment("fabric", "")),
    ("experiment", "experiment: fabric a list", _experiment("fabric", ["astral-small"])),
    ("experiment", "experiment: inline fabric without kind", _experiment("fabric", {"name": "x"})),
    ("experiment", "experiment: policy unknown", {**_experiment("policies", ...), "policy": "x"}),
    ("experiment", "experiment: policies a word", _experiment("policies", "ecmp")),
    ("experiment", "experiment: collectives empty", _experiment("collectives", [])),
    ("experiment", "experiment: collectives a word", _experiment("collectives", "all-reduce")),
    (
        "experiment",
        "experiment: collective unknown key",
        _experiment("collectives", [{"op": "all-reduce", "colour": "red"}]),
    ),
    (
        "experiment",
        "experiment: algorithm unknown",
        _experiment("collectives", [{"op": "all-reduce", "algorithm": "magic"}]),
    ),
    ("experiment", "experiment: sizes max missing", _experiment("sizes.max", ...)),
    ("experiment", "experiment: size zero", _experiment("sizes.min", 0)),
    ("experiment", "experiment: size as text, zero", _experiment("sizes.min", "0K")),
    ("experiment", "experiment: size a fraction", _experiment("sizes.min", "1.5M")),
    # above MAX_SIZE (8192T), as a number and in every written form
    ("experiment", "experiment: size above the most", _experiment("sizes.max", MAX_SIZE + 1)),
    ("experiment", "experiment: size above 8192T", _experiment("sizes.max", "8193T")),
    ("experiment", "experiment: size above 8192T in G", _experiment("sizes.max", "8388609 GiB")),
    ("experiment", "experiment: size above 8192T in K", _experiment("sizes.max", "8796093022209k")),
    ("experiment", "experiment: size above 8192T in bytes", _experiment("sizes.max", "9" * 16)),
    ("experiment", "experiment: sizes unknown key", _experiment("sizes.step", 2)),
    ("experiment", "experiment: iterations a fraction", _experiment("iterations", 1.5)),
    ("experiment", "experiment: warmup text", _experiment("warmup", "1")),
    ("experiment", "experiment: seed negative", _experiment("seed", -1)),
    ("experiment", "experiment: one GPU", _experiment("placement.gpus", 1)),
    ("experiment", "experiment: one GPU by name", _experiment("placement.gpus", ["p0s0g0"])),
    ("experiment", "experiment: placement unknown key", _experiment("placement.spread", 1)),
    ("experiment", "experiment: load_limit a boolean", _experiment("load_limit", True)),
    ("experiment", "experiment: monitor a list", _experiment("monitor", ["full"])),
    ("experiment", "experiment: latency unknown key", _experiment("latency", {"cable": "1ns"})),
    ("experiment", "experiment: latency as text above 1ms", _experiment("latency", {"nic": "2ms"})),
    ("experiment", "experiment: scale negative text", _experiment("scale", "-1e-4")),
    ("experiment", "experiment: faults a word", _experiment("faults", "link-down")),
    ("experiment", "fault: at without unit", _fault(kind="controller-crash", at=5)),
    ("experiment", "fault: delay zero", _fault(kind="straggler", target="p0s0g0", delay="0ms")),
    ("experiment", "fault: rate zero", _fault(kind="link-slow", target="p0r0a1-c2", rate=0)),
    (
        "experiment",
        "fault: probability a boolean",
        _fault(kind="link-loss", target="p0r0a1-c2", probability=True),
    ),
    ("experiment", "fault: link without target", _fault(kind="link-down")),
    ("experiment", "fault: blackhole without destination", _fault(kind="blackhole", target="c0")),
    ("experiment", "fault: a mapping of faults", _experiment("faults", {"kind": "link-down"})),
    ("machines", "machines: a list", []),
    ("machines", "machines: missing", {}),
    ("machines", "machines: unknown top key", {"machines": {}, "hosts": {}}),
    ("machines", "machines: a list of machines", {"machines": [MACHINE]}),
    ("machines", "machines: bad machine name", {"machines": {"bad name": MACHINE}}),
    ("machines", "machines: machine a word", {"machines": {"lab": "h"}}),
    ("machines", "machines: port a boolean", _machine(port=True)),
    ("machines", "machines: port too high", _machine(port=65536)),
    ("machines", "machines: key empty", _machine(key="")),
    ("machines", "machines: known_hosts a number", _machine(known_hosts=5)),
    ("machines", "machines: timeout text", _machine(timeouts={"connect": "15"})),
    ("machines", "machines: timeouts a number", _machine(timeouts=15)),
    ("machines", "machines: project the home", _machine(project=".")),
    ("machines", "machines: project with ..", _machine(project="a/../b")),
    (
        "machines",
        "machines: vagrant machine name",
        test_remote.inventory({"vagrant": ".", "vagrant_machine": "bad name"}),
    ),
    (
        "machines",
        "machines: vagrant with port",
        test_remote.inventory({"vagrant": ".", "port": 22}),
    ),
]


def _shared_cases() -> list[tuple[str, str, object]]:
    """(kind, id, YAML text or document) from the validators' own tests."""
    cases: list[tuple[str, str, object]] = []
    cases += [("fabric", case_id, text) for case_id, text, _, _ in test_spec.CASES]
    cases += [("experiment", what, text) for what, text, _, _ in test_experiment.MALFORMED]
    first = {"kind": "link-down", "target": "p0r0a1-c2"}
    cases += [
        ("experiment", message, {**test_fault_schedule.BASE, "faults": [first, entry]})
        for entry, _, message in test_fault_schedule.MISTAKES
    ]
    cases += [
        ("machines", f"{key}: {expected}", test_remote.inventory(machine))
        for machine, key, expected in test_remote.BAD_MACHINES
    ]
    cases += [
        ("experiment", f"study: {key}: {text}", test_study.base(**change))
        for change, key, text in test_study.BAD_STUDIES
    ]
    cases += [
        ("experiment", f"check: {key}: {text}", test_study.study_with(test_study.bad_check(change)))
        for change, key, text in test_study.BAD_CHECKS
    ]
    seen: dict[str, int] = {}
    for index, (kind, case_id, case) in enumerate(cases):  # "present" (2), ...
        seen[case_id] = seen.get(case_id, 0) + 1
        if seen[case_id] > 1:
            cases[index] = (kind, f"{case_id} ({seen[case_id]})", case)
    return cases


MALFORMED = _shared_cases() + EXTRA


def test_the_tables_are_large_and_distinct() -> None:
    assert len(EXTRA) >= 30
    ids = [case_id for _, case_id, _ in MALFORMED]
    assert len(ids) == len(set(ids))
    assert set(ids) >= set(VALIDATOR_ONLY) | LOADER_ONLY


@pytest.mark.parametrize(
    ("kind", "case_id", "case"),
    MALFORMED,
    ids=[f"{kind}-{case_id}" for kind, case_id, _ in MALFORMED],
)
def test_what_a_validator_refuses_the_schema_refuses(
    kind: str, case_id: str, case: object, tmp_path: Path
) -> None:
    if case_id in LOADER_ONLY:
        assert isinstance(case, str)
        with pytest.raises(ConfigError):
            parse_yaml(case, "case.yaml", ConfigError)
        return
    document = parse_yaml(case, "case.yaml", ConfigError) if isinstance(case, str) else case
    with pytest.raises(ConfigError):
        validate(kind, document, tmp_path)
    if case_id in VALIDATOR_ONLY or _unwirable(kind, document):
        # the validator's alone: the schema lets it through (or it would not be listed)
        assert accepts(kind, document), f"the schema refuses {case_id!r} now: unlist it"
    else:
        assert not accepts(kind, document), f"the schema accepts {case_id!r}"


def _unwirable(kind: str, document: object) -> bool:
    """Whether ``document`` is a well-shaped fabric that its kind cannot wire."""
    if kind != "fabric":
        return False
    try:
        spec = parse_fabric_spec(document, "case.yaml")
    except ConfigError:
        return False
    try:
        build_fabric(spec)
    except ConfigError:
        return True
    return False


# --- one source ------------------------------------------------------------------------------


def _keys(document: dict[str, Any], *path: str) -> set[str]:
    for key in path:
        document = document["properties"][key]
    if "anyOf" in document:  # latency: off/on, or the mapping
        document = next(d for d in document["anyOf"] if d.get("type") == "object")
    return set(document["properties"])


def test_the_keys_are_the_validators_keys() -> None:
    fabric, exp, machines = schema("fabric"), schema("experiment"), schema("machines")
    assert _keys(fabric) == spec._TOP_KEYS
    assert set(fabric["required"]) == set(spec.REQUIRED_KEYS)
    assert _keys(fabric, "switch") == spec.SWITCH_KEYS
    assert _keys(fabric, "oversubscription") == spec.OVERSUBSCRIPTION_KEYS
    assert _keys(fabric, "emulation") == spec.EMULATION_KEYS
    assert _keys(exp) == experiment._TOP_KEYS
    # fabric, or a study's fabrics: one of the two (cross_key_rules); collectives and sizes,
    # or a workload instead
    replaced = set(experiment.WORKLOAD_REPLACES)
    assert set(exp["required"]) == set(experiment.REQUIRED_KEYS) - {"fabric"} - replaced
    assert {"oneOf": [{"required": ["fabric"]}, {"required": ["fabrics"]}]} in exp["allOf"]
    assert _keys(exp, "study") == STUDY_SECTION_KEYS
    assert set(exp["properties"]["study"]["properties"]["checks"]["items"]["properties"]) == (
        CHECK_KEYS
    )
    assert _keys(exp, "sizes") == experiment.SIZES_KEYS
    assert _keys(exp, "placement") == experiment.PLACEMENT_KEYS
    assert _keys(exp, "load_limit") == experiment.LOAD_LIMIT_KEYS
    assert _keys(exp["$defs"]["fabric"]) == spec._TOP_KEYS
    assert _keys(exp, "latency") == _keys(fabric, "latency")
    fault = exp["properties"]["faults"]["anyOf"][1]["items"]
    assert set(fault["properties"]) == {*COMMON_KEYS, *PARAM_KEYS}
    assert _keys(machines) == inventory.TOP_KEYS
    machine = machines["properties"]["machines"]["additionalProperties"]
    assert set(machine["properties"]) == inventory.MACHINE_KEYS
    assert set(machine["properties"]["timeouts"]["properties"]) == inventory.TIMEOUT_KEYS


def test_a_key_set_that_differs_from_its_schema_stops_the_generation() -> None:
    with pytest.raises(ValueError, match="differ"):
        mapping({"a", "b"}, {"a": {}})
    with pytest.raises(ValueError, match="differ"):
        mapping({"a"}, {"a": {}}, required=["b"])


def test_the_experiment_schema_is_one_table_with_a_reusable_fabric() -> None:
    from orchestrator.run.schema import top_level

    assert set(top_level()) == experiment._TOP_KEYS
    exp = schema("experiment")
    assert exp["properties"]["fabric"] == {"$ref": "#/$defs/fabric_reference"}
    reference = exp["$defs"]["fabric_reference"]["anyOf"]
    assert {"$ref": "#/$defs/fabric"} in reference
    checker = Draft202012Validator({"$defs": exp["$defs"], "$ref": "#/$defs/fabric_reference"})
    assert checker.is_valid("astral-small") and checker.is_valid("../fabrics/mine.yaml")
    assert checker.is_valid(test_spec.VALID) and not checker.is_valid("astral-huge")


@pytest.mark.parametrize(
    ("regex", "samples"),
    [
        (RATE, ["200G", "3.6t", "100 Mbps", "25mBIT/S", "1e3K", "200X", "G", "2 b/s", "1.5"]),
        (SIZE, ["64K", "2GiB", "1 kb", "3mB", "512", "1.5M", "1X", "KiB", "4 ib"]),
        (DURATION, ["600ns", "0.6us", "0.6\u00b5s", "2ms", "1s", "5", "2 m", "1e-3ms"]),
        (NUMBER_TEXT, ["1e-4", "0.5", ".5", "+1", "-2E3", "1_0", "nan", "1e", " 3 "]),
    ],
)
def test_a_pattern_reads_the_same_in_the_schema(regex: re.Pattern[str], samples: list[str]) -> None:
    translated = re.compile(pattern(regex))
    assert translated.flags & re.IGNORECASE == 0
    for sample in samples:
        assert bool(regex.match(sample)) == bool(translated.search(sample)), sample


def test_the_schema_bounds_a_size_where_the_reader_does() -> None:
    """The schema's size is the reader's, up to its MAX_SIZE (8192T) in every form: the
    bound comes from the constant, so the two cannot drift apart."""
    checker = Draft202012Validator(schema("experiment")["properties"]["sizes"]["properties"]["max"])
    limit = format_size(MAX_SIZE)
    assert limit == "8192T"
    for unit, per in (("", 1), ("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        for count in (1, MAX_SIZE // per - 1, MAX_SIZE // per, MAX_SIZE // per + 1, 10**17):
            for written in (f"{count}{unit}", f" 00{count} {unit.lower()}iB"):
                try:
                    read = parse_size(written) > 0
                except ValueError:
                    read = False
                assert checker.is_valid(written) == read, written
    assert checker.is_valid(MAX_SIZE) and not checker.is_valid(MAX_SIZE + 1)


def test_a_pattern_that_cannot_be_translated_is_refused() -> None:
    with pytest.raises(ValueError):
        pattern(re.compile(r"[a-z]+", re.IGNORECASE))
    with pytest.raises(ValueError):
        pattern(re.compile(r"a.b", re.IGNORECASE | re.DOTALL))


# --- the committed copies and the editor header ---------------------------------------------


@pytest.mark.parametrize("kind", list(SCHEMAS))
def test_the_committed_schema_is_what_the_generator_writes(kind: str) -> None:
    committed = SCHEMA_DIR / f"{kind}.schema.json"
    assert committed.is_file(), f"run: astral schema {kind} --out {committed.relative_to(REPO)}"
    assert committed.read_text(encoding="utf-8") == render(kind), (
        f"stale: run astral schema {kind} --out {committed.relative_to(REPO)}"
    )


def test_the_generated_schema_does_not_depend_on_the_hash_seed() -> None:
    script = "from orchestrator.commands.schema import render; print(render('experiment'), end='')"
    for seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", script],
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert result.stdout == render("experiment")


@pytest.mark.parametrize(
    ("kind", "path"),
    [(kind, path) for kind, files in SHIPPED.items() for path in files()],
    ids=lambda value: value if isinstance(value, str) else value.relative_to(REPO).as_posix(),
)
def test_a_shipped_file_names_its_schema_on_its_first_line(kind: str, path: Path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith(HEADER), f"{path}: the first line is not the schema header"
    target = (path.parent / first[len(HEADER) :]).resolve()
    assert target == (SCHEMA_DIR / f"{kind}.schema.json").resolve()
    assert not Path(first[len(HEADER) :]).is_absolute()  # works in any checkout


# --- the command ----------------------------------------------------------------------------


def test_the_command_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "machines"]) == 0
    out, err = capsys.readouterr()
    assert out == render("machines") and err == ""


def test_the_command_writes_the_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "fabric.schema.json"
    assert main(["schema", "fabric", "--out", str(out_file)]) == 0
    assert out_file.read_text(encoding="utf-8") == render("fabric")
    assert capsys.readouterr().out == ""


def test_an_unknown_kind_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["schema", "topology"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'topology'" in err and "fabric" in err and "Traceback" not in err


def test_an_unwritable_out_file_is_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["schema", "experiment", "--out", str(tmp_path / "absent" / "x.json")])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("astral: error: command line: key '--out'") and len(err.splitlines()) == 1
