"""Experiment files: validation (file, key path, expected, found), fabric resolution,
placement, and the expansion into steps."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from controllers.policies import default_registry as policy_registry
from orchestrator.collectives.nccl import bus_factor
from orchestrator.collectives.plans import COLLECTIVES
from orchestrator.collectives.sizes import format_size, parse_size
from orchestrator.run.experiment import (
    Collective,
    SizeSweep,
    load_experiment,
    parse_experiment,
)
from tests.helpers import REPO
from topologies.catalog import preset_path
from topologies.errors import ConfigError, ExperimentError, FabricSpecError
from topologies.units import tcp_payload_share

DEFAULT = REPO / "experiments" / "default.yaml"

VALID = """\
name: probe
fabric: astral-small
policies: [ecmp, path-pinned]
collectives:
  - all-reduce
  - {op: all-to-all, algorithm: pxn}
sizes: {min: 64K, max: 1M, factor: 4}
iterations: 3
warmup: 1
placement: {gpus: all, order: rank}
seed: 7
load_limit: {force: false}
"""

INLINE_FABRIC = """\
name: inline
fabric:
  name: tiny
  kind: astral
  pods: 1
  servers_per_pod: 2
  gpus_per_server: 2
  switch: {radix: 4, down_ports: 2}
policy: ecmp
collectives: [all-reduce]
sizes: {min: 1K, max: 4K}
"""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def replace(text: str, key: str, line: str | None) -> str:
    """VALID with the top-level ``key`` line replaced by ``line`` (None: removed)."""
    lines = [x for x in text.splitlines() if not x.startswith(f"{key}:")]
    if line is not None:
        lines.append(line)
    return "\n".join(lines) + "\n"


# (what the file does wrong, its text, the key path the error must name, words it must say)
MALFORMED = [
    ("not yaml", "name: [unclosed\n", "", "valid YAML"),
    ("a key twice", VALID + "iterations: 5\n", "iterations", "lines 8 and 13"),
    (
        "a key twice in the inline fabric",
        INLINE_FABRIC.replace("  pods: 1\n", "  pods: 1\n  pods: 2\n"),
        "fabric.pods",
        "lines 5 and 6",
    ),
    ("nesting thousands deep", "name: x\nseed: " + "[" * 3000 + "]" * 3000 + "\n", "", "nested"),
    ("a recursive alias", VALID + "x: &x {y: [*x]}\n", "", "recursive alias at line 13"),
    (
        "an alias chain deeper than the limit",
        VALID + "".join(f"a{i}: &a{i} [{'1' if i == 0 else f'*a{i - 1}'}]\n" for i in range(40)),
        "",
        "nested",
    ),
    (
        "an alias bomb in the collectives",
        VALID.replace("collectives:\n  - all-reduce\n  - {op: all-to-all, algorithm: pxn}\n", "")
        + "l0: &l0 [all-reduce, all-reduce, all-reduce, all-reduce, all-reduce]\n"
        + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 5)}]\n" for i in range(1, 9))
        + "collectives: *l8\n",
        "",
        "values once aliases are expanded",
    ),
    ("a list, not a mapping", "- name: x\n", "", "a mapping"),
    ("empty file", "", "", "a mapping"),
    ("unknown top-level key", VALID + "colour: blue\n", "colour", "known keys"),
    ("name missing", replace(VALID, "name", None), "name", "present"),
    ("name with capitals", replace(VALID, "name", "name: Probe"), "name", "lower-case"),
    ("fabric missing", replace(VALID, "fabric", None), "fabric", "present"),
    ("unknown preset", replace(VALID, "fabric", "fabric: astral-huge"), "fabric", "preset"),
    ("fabric file absent", replace(VALID, "fabric", "fabric: nope.yaml"), "fabric", "existing"),
    ("fabric a number", replace(VALID, "fabric", "fabric: 3"), "fabric", "preset name"),
    (
        "inline fabric: bad kind",
        INLINE_FABRIC.replace("kind: astral", "kind: torus"),
        "fabric.kind",
        "one of",
    ),
    (
        "inline fabric: unknown key",
        INLINE_FABRIC.replace("  pods: 1\n", "  pods: 1\n  colour: red\n"),
        "fabric.colour",
        "known keys",
    ),
    (
        "inline fabric: cannot be wired",
        INLINE_FABRIC.replace("servers_per_pod: 2", "servers_per_pod: 9"),
        "fabric.servers_per_pod",
        "at most",
    ),
    (
        "inline fabric: bad speed",
        INLINE_FABRIC.replace("  pods: 1\n", "  pods: 1\n  speeds: {nic: fast}\n"),
        "fabric.speeds.nic",
        "rate",
    ),
    ("scale not a number", VALID + "scale: fast\n", "scale", "a number"),
    ("scale zero", VALID + "scale: 0\n", "scale", "between"),
    ("scale above 1", VALID + "scale: 2\n", "scale", "between"),
    ("policy and policies", VALID + "policy: ecmp\n", "policies", "not both"),
    ("host_ports unknown", VALID + "host_ports: random\n", "host_ports", "one of balanced, hash"),
    ("host_ports a number", VALID + "host_ports: 2\n", "host_ports", "how hosts pick NIC ports"),
    ("host_ports a list", VALID + "host_ports: [hash, balanced]\n", "host_ports", "one per run"),
    ("monitor unknown", VALID + "monitor: heavy\n", "monitor", "one of full, light"),
    ("no policy at all", replace(VALID, "policies", None), "policies", "neither"),
    (
        "unknown policy",
        replace(VALID, "policies", "policies: [ecmp, magic]"),
        "policies[1]",
        "load-balancing policy",
    ),
    (
        "policy listed twice",
        replace(VALID, "policies", "policies: [ecmp, ecmp]"),
        "policies[1]",
        "once",
    ),
    ("policies empty", replace(VALID, "policies", "policies: []"), "policies", "non-empty"),
    (
        "unknown collective",
        VALID.replace("  - all-reduce\n", "  - all-shuffle\n"),
        "collectives[0]",
        "a collective",
    ),
    (
        "algorithm of another op",
        VALID.replace("algorithm: pxn", "algorithm: ring"),
        "collectives[1].algorithm",
        "direct, shifted, pxn",
    ),
    (
        "collective entry without op",
        VALID.replace("{op: all-to-all, algorithm: pxn}", "{algorithm: pxn}"),
        "collectives[1].op",
        "present",
    ),
    (
        "collective listed twice",
        VALID.replace("{op: all-to-all, algorithm: pxn}", "{op: all-reduce, algorithm: ring}"),
        "collectives[1]",
        "once",
    ),
    ("sizes not a mapping", replace(VALID, "sizes", "sizes: 1M"), "sizes", "a mapping"),
    (
        "size unit unknown",
        replace(VALID, "sizes", "sizes: {min: 64Q, max: 1M}"),
        "sizes.min",
        "64K",
    ),
    (
        "max below min",
        replace(VALID, "sizes", "sizes: {min: 1M, max: 64K}"),
        "sizes.max",
        ">= sizes.min",
    ),
    (
        "factor 1",
        replace(VALID, "sizes", "sizes: {min: 1K, max: 1M, factor: 1}"),
        "sizes.factor",
        ">= 2",
    ),
    (
        "factor not an integer",
        replace(VALID, "sizes", "sizes: {min: 1K, max: 1M, factor: 1.5}"),
        "sizes.factor",
        "an integer",
    ),
    (
        "sizes below one element per rank",
        replace(VALID, "sizes", "sizes: {min: 4, max: 16}"),
        "sizes.max",
        "one uint32 element",
    ),
    ("iterations zero", replace(VALID, "iterations", "iterations: 0"), "iterations", ">= 1"),
    ("warmup negative", replace(VALID, "warmup", "warmup: -1"), "warmup", ">= 0"),
    ("min_batch without a unit", VALID + "min_batch: 10\n", "min_batch", "with its unit"),
    ("min_batch below the floor", VALID + "min_batch: 500ms\n", "min_batch", "between 2s"),
    ("min_batch an hour", VALID + "min_batch: 3600s\n", "min_batch", "and 600s"),
    ("min_batch a word", VALID + "min_batch: long\n", "min_batch", "such as 10s"),
    (
        "iterations a string",
        replace(VALID, "iterations", "iterations: many"),
        "iterations",
        "an integer",
    ),
    ("seed a boolean", replace(VALID, "seed", "seed: true"), "seed", "an integer"),
    (
        "unknown GPU",
        replace(VALID, "placement", "placement: {gpus: [p0s0g0, p9s9g9]}"),
        "placement.gpus[1]",
        "a GPU of fabric astral-small",
    ),
    (
        "GPU listed twice",
        replace(VALID, "placement", "placement: {gpus: [p0s0g0, p0s0g0]}"),
        "placement.gpus[1]",
        "once",
    ),
    (
        "too many GPUs",
        replace(VALID, "placement", "placement: {gpus: 9}"),
        "placement.gpus",
        "between 2 and 8",
    ),
    (
        "gpus a word",
        replace(VALID, "placement", "placement: {gpus: most}"),
        "placement.gpus",
        "'all'",
    ),
    (
        "unknown order",
        replace(VALID, "placement", "placement: {order: alphabetical}"),
        "placement.order",
        "topology-aware",
    ),
    (
        "force not a boolean",
        replace(VALID, "load_limit", "load_limit: {force: yes please}"),
        "load_limit.force",
        "true or false",
    ),
    (
        "load_limit unknown key",
        replace(VALID, "load_limit", "load_limit: {max: 3}"),
        "load_limit.max",
        "known keys",
    ),
]


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
def test_malformed_experiment_is_rejected_naming_file_and_key(
    tmp_path: Path, text: str, key: str, words: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    error = caught.value
    assert error.exit_status == 2  # what the CLI exits with (ConfigError)
    assert error.file == str(path)
    assert error.key == key
    message = str(error)
    assert message.startswith(f"{path}: ")
    if key:
        assert f"key '{key}'" in message
    assert words in message, message


def test_there_are_at_least_twenty_malformed_cases() -> None:
    assert len(MALFORMED) >= 20


def test_missing_experiment_file(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="an existing experiment file, found 'no such"):
        load_experiment(tmp_path / "absent.yaml")


def test_error_in_a_referenced_fabric_file_names_that_file(tmp_path: Path) -> None:
    fabric = write(
        tmp_path, "name: f\nkind: astral\ngpus_per_server: 2\nswitch: {radix: 1}\n", "fabric.yaml"
    )
    path = write(tmp_path, replace(VALID, "fabric", "fabric: fabric.yaml"))
    with pytest.raises(FabricSpecError) as caught:
        load_experiment(path)
    assert caught.value.file == str(fabric)
    assert caught.value.key == "switch.radix"
    assert f"the fabric of experiment {path}" in str(caught.value)
    assert isinstance(caught.value, ConfigError) and caught.value.exit_status == 2


# --- what a valid experiment turns into ------------------------------------------------------


def test_valid_experiment_loads_into_typed_objects(tmp_path: Path) -> None:
    spec = load_experiment(write(tmp_path, VALID))
    assert spec.name == "probe"
    assert spec.fabric.name == "astral-small"
    assert spec.fabric_source.endswith("topologies/presets/astral-small.yaml")
    assert spec.policies == ("ecmp", "path-pinned")
    assert spec.collectives == (Collective("all-reduce", "ring"), Collective("all-to-all", "pxn"))
    assert spec.sizes == SizeSweep(64 * 1024, 1024 * 1024, 4)
    assert (spec.iterations, spec.warmup, spec.seed) == (3, 1, 7)
    assert spec.ranks == 8
    assert spec.load_limit.force is False
    assert spec.host_ports == "balanced"  # the default: the switch policies compared alone
    assert load_experiment(write(tmp_path, VALID + "host_ports: hash\n")).host_ports == "hash"
    assert spec.monitor == "full"  # the monitor at full detail unless asked otherwise
    assert load_experiment(write(tmp_path, VALID + "monitor: light\n")).monitor == "light"


def test_anchors_aliases_and_merge_keys_within_the_bounds_load(tmp_path: Path) -> None:
    text = VALID.replace("collectives:\n  - all-reduce\n  - {op: all-to-all, algorithm: pxn}\n", "")
    text += (
        "x-ring: &ring {op: all-reduce, algorithm: ring}\n"
        "collectives: [*ring, {<<: *ring, op: all-gather}]\n"
    )
    with pytest.raises(ExperimentError, match="x-ring"):  # the anchor's own key is unknown
        load_experiment(write(tmp_path, text))
    text = VALID.replace("  - all-reduce\n", "  - &ar all-reduce\n") + "description: *ar\n"
    spec = load_experiment(write(tmp_path, text))
    assert spec.collectives[0] == Collective("all-reduce", "ring")


def test_scale_overrides_the_fabric_emulation_scale(tmp_path: Path) -> None:
    assert load_experiment(write(tmp_path, VALID)).fabric.emulation.scale == 1e-4  # preset's
    spec = load_experiment(write(tmp_path, VALID + "scale: 0.5e-4\n"))
    assert spec.fabric.emulation.scale == 0.5e-4
    assert spec.fabric.emulation.emulated(200e9) == pytest.approx(10e6)
    assert spec.fabric.name == "astral-small"  # the same fabric otherwise


def test_defaults_follow_nccl_tests(tmp_path: Path) -> None:
    spec = load_experiment(write(tmp_path, INLINE_FABRIC))
    assert (spec.iterations, spec.warmup) == (20, 5)  # nccl-tests -n 20 -w 5
    assert spec.min_batch is None  # the launcher's own floor
    assert spec.sizes.factor == 2
    assert spec.fabric_source == "inline"
    assert spec.policies == ("ecmp",)
    assert spec.gpus == ("p0s0g0", "p0s0g1", "p0s1g0", "p0s1g1")


def test_min_batch_is_read_in_seconds(tmp_path: Path) -> None:
    assert load_experiment(write(tmp_path, VALID + "min_batch: 10s\n")).min_batch == 10.0
    assert load_experiment(write(tmp_path, VALID + "min_batch: 2500ms\n")).min_batch == 2.5


def test_relative_fabric_path_starts_at_the_experiment_directory(tmp_path: Path) -> None:
    (tmp_path / "fabrics").mkdir()
    preset = preset_path("astral-small")
    (tmp_path / "fabrics" / "mine.yaml").write_text(
        preset.read_text().replace("name: astral-small", "name: mine")
    )
    (tmp_path / "exps").mkdir()
    path = write(tmp_path / "exps", replace(VALID, "fabric", "fabric: ../fabrics/mine.yaml"))
    spec = load_experiment(path)
    assert spec.fabric.name == "mine"


def test_policies_come_from_the_caller_when_a_registry_exists(tmp_path: Path) -> None:
    path = write(tmp_path, replace(VALID, "policies", "policies: [shortest, spray]"))
    with pytest.raises(ExperimentError, match="spray"):
        load_experiment(path)
    spec = load_experiment(path, policies=[*policy_registry().names(), "spray"])
    assert spec.policies == ("shortest", "spray")


def test_policies_default_to_the_controllers_registry(tmp_path: Path) -> None:
    path = write(tmp_path, replace(VALID, "policies", "policies: [ecmp, spray]"))
    known = ", ".join(policy_registry().names())
    with pytest.raises(ExperimentError, match=f"load-balancing policy: one of {known}, found"):
        load_experiment(path)


def test_default_experiment_is_valid_and_fits_the_time_budget() -> None:
    spec = load_experiment(DEFAULT)
    assert spec.fabric.name == "astral-small"
    assert spec.policies == ("ecmp", "path-pinned")
    assert spec.host_ports == "balanced"
    assert {c.op for c in spec.collectives} == {"all-reduce", "all-to-all"}
    assert spec.ranks == 8
    # 2 ports x 40 Mbit/s x 0.982 (TCP's payload share of the 3000-byte frames the default
    # recipe uses at 40 Mbit/s) = 9.82 MB/s of busbw per GPU at best: the traffic alone
    # (3 iterations + 1 warm-up) needs about 12 s; at half of it for ECMP and 0.9 for
    # path-pinned, plus set-up and plots, well inside 3 minutes.
    assert spec.fabric.emulation.emulated(200e9) == pytest.approx(40e6)
    busbw = 2 * 40e6 * tcp_payload_share(3000) / 8
    assert spec.ideal_seconds(busbw) == pytest.approx(11.9, abs=0.1)
    assert spec.ideal_seconds(busbw) / 2 * (1 / 0.5 + 1 / 0.9) + len(spec.steps()) + 40 < 180
    # The fabric's latencies (docs/latency.md) add 0.4 s to every ring all-reduce (14 steps
    # x 25.5 ms + 33 ms at 2e-4) and 0.06 s to every direct all-to-all: 14 s if they added
    # up. They overlap the bytes instead (a send completes once TCP has it, so a step's
    # wait runs while the previous step's bytes are still on the wire), so an operation
    # takes about the larger of the two, which still fits.
    assert spec.latency_seconds() == pytest.approx(14.35, abs=0.1)
    latency = spec.step_latencies()
    efficiency = {"ecmp": 0.5, "path-pinned": 0.9}
    runs = spec.iterations + spec.warmup
    seconds = sum(
        runs * max(latency[s.index], s.size * bus_factor(s.collective.op, s.ranks) / busbw
                   / efficiency[s.policy])
        for s in spec.steps()
    )  # fmt: skip
    assert seconds + len(spec.steps()) + 40 < 180


# --- placement ---------------------------------------------------------------------------------


def placement(tmp_path: Path, line: str) -> tuple[str, ...]:
    # without PXN's all-to-all, which needs whole servers (the next test)
    ring_only = VALID.replace("  - {op: all-to-all, algorithm: pxn}\n", "")
    return load_experiment(write(tmp_path, replace(ring_only, "placement", line))).gpus


def test_placement_count_takes_the_first_gpus_by_rank(tmp_path: Path) -> None:
    assert placement(tmp_path, "placement: {gpus: 3}") == ("p0s0g0", "p0s0g1", "p0s1g0")


def test_a_placement_an_algorithm_cannot_run_on_is_refused_before_bring_up(
    tmp_path: Path,
) -> None:
    # 3 GPUs of 2-GPU servers: the second server has one, and a hierarchical all-reduce
    # needs the same local ranks on every server
    text = VALID.replace(
        "  - all-reduce\n  - {op: all-to-all, algorithm: pxn}",
        "  - {op: all-reduce, algorithm: hierarchical}",
    )
    text = replace(text, "placement", "placement: {gpus: 3}")
    with pytest.raises(ExperimentError) as caught:
        load_experiment(write(tmp_path, text))
    message = str(caught.value)
    assert "key 'collectives[0]'" in message and "found 'all-reduce/hierarchical'" in message
    assert "the same rails (local ranks) on every server" in message
    text = replace(text, "placement", "placement: {gpus: 4}")
    assert len(load_experiment(write(tmp_path, text)).gpus) == 4


def test_placement_list_is_put_in_rank_order(tmp_path: Path) -> None:
    gpus = placement(tmp_path, "placement: {gpus: [p1s0g1, p0s0g0, p0s1g1]}")
    assert gpus == ("p0s0g0", "p0s1g1", "p1s0g1")


def test_topology_aware_order_keeps_server_hops_on_one_rail(tmp_path: Path) -> None:
    gpus = placement(tmp_path, "placement: {order: topology-aware}")
    assert gpus == (
        "p0s0g0",
        "p0s0g1",
        "p0s1g1",
        "p0s1g0",
        "p1s0g0",
        "p1s0g1",
        "p1s1g1",
        "p1s1g0",
    )
    # every hop of the ring (wrap-around included) is inside a server or on one rail
    for a, b in zip(gpus, gpus[1:] + gpus[:1], strict=True):
        assert a[:4] == b[:4] or a[-1] == b[-1], (a, b)


def test_random_order_is_a_seeded_permutation(tmp_path: Path) -> None:
    first = placement(tmp_path, "placement: {order: random}")
    again = placement(tmp_path, "placement: {order: random}")
    assert first == again
    assert sorted(first) == sorted(placement(tmp_path, "placement: {order: rank}"))
    other = load_experiment(
        write(
            tmp_path,
            replace(replace(VALID, "placement", "placement: {order: random}"), "seed", "seed: 8"),
        )
    ).gpus
    assert other != first


# --- step expansion ------------------------------------------------------------------------


def test_steps_are_policy_by_collective_by_size_policies_slowest(tmp_path: Path) -> None:
    spec = load_experiment(write(tmp_path, VALID))
    steps = spec.steps()
    assert len(steps) == 2 * 2 * 3
    assert [s.index for s in steps] == list(range(12))
    assert [(s.policy, s.collective.op, s.size) for s in steps[:4]] == [
        ("ecmp", "all-reduce", 65536),
        ("ecmp", "all-reduce", 262144),
        ("ecmp", "all-reduce", 1048576),
        ("ecmp", "all-to-all", 65536),
    ]
    assert {s.policy for s in steps[6:]} == {"path-pinned"}
    assert all(s.dtype == "uint32" and s.ranks == 8 for s in steps)
    # nccl-tests' count column: all elements for all-reduce, elements per rank for all-to-all
    assert [s.count for s in steps[:6]] == [16384, 65536, 262144, 2048, 8192, 32768]


def test_step_sizes_round_down_as_nccl_tests_does() -> None:
    document = yaml.safe_load(replace(VALID, "placement", "placement: {gpus: 6}"))
    document["sizes"] = {"min": 102, "max": 1000, "factor": 3}
    spec = parse_experiment(document, "mem.yaml")
    # 102, 306, 918: whole 4-byte elements for all-reduce ...
    assert spec.step_sizes("all-reduce") == [100, 304, 916]
    # ... whole elements for each of 6 ranks (multiples of 24) for all-to-all
    assert spec.step_sizes("all-to-all") == [96, 288, 912]
    steps = spec.steps()
    assert [(s.collective.op, s.size, s.count) for s in steps[:6]] == [
        ("all-reduce", 100, 25),
        ("all-reduce", 304, 76),
        ("all-reduce", 916, 229),
        ("all-to-all", 96, 4),
        ("all-to-all", 288, 12),
        ("all-to-all", 912, 38),
    ]


def test_sizes_that_round_to_the_same_value_are_run_once() -> None:
    document = yaml.safe_load(VALID)
    document["sizes"] = {"min": 16, "max": 64, "factor": 2}  # 16, 32, 64
    spec = parse_experiment(document, "mem.yaml")
    assert spec.step_sizes("all-reduce") == [16, 32, 64]
    assert spec.step_sizes("all-to-all") == [32, 64]  # 16 bytes is not one element per rank


def test_size_sweep_is_nccl_tests_b_e_f() -> None:
    assert SizeSweep(8, 128, 2).values() == [8, 16, 32, 64, 128]
    assert SizeSweep(1024, 5000, 4).values() == [1024, 4096]
    assert SizeSweep(7, 7, 2).values() == [7]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1M", 1 << 20),
        ("64K", 65536),
        ("512", 512),
        (4096, 4096),
        ("2GiB", 2 << 30),
        ("1 kb", 1024),
        ("3MB", 3 << 20),
    ],
)
def test_parse_size(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["1.5M", "-1", 0, True, "M", "1X", None, 2.0])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size_is_exact() -> None:
    assert [format_size(s) for s in (1 << 20, 65536, 1000, 1536)] == ["1M", "64K", "1000", "1536"]


def test_every_collective_has_a_default_algorithm_and_a_bus_factor() -> None:
    from orchestrator.collectives.nccl import bus_factor

    for op, algorithms in COLLECTIVES.items():
        assert algorithms
        assert 0 < bus_factor(op, 8) <= 2
