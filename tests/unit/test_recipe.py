"""Emulator recipes (orchestrator/emulation/recipe.py) and what they render; no root needed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.emulation.hostconfig import render_host_config
from orchestrator.emulation.recipe import (
    DEFAULT_RECIPE_NAME,
    ENV_VAR,
    MAX_MTU,
    RECIPES,
    current_recipe,
)
from orchestrator.emulation.shaping import (
    DEFAULT_RECIPE,
    FLOW_CLASS_BASE,
    flow_hash_bytecode,
    shaping_commands,
    unshaped,
)
from orchestrator.emulation.wiring import plan_wiring
from topologies.catalog import resolve_fabric
from topologies.description import FabricDescription
from topologies.errors import ConfigError
from topologies.generators import build_fabric
from topologies.spec import load_fabric_spec
from topologies.units import TCP_PAYLOAD_SHARE, tcp_payload_share


@pytest.fixture(scope="module")
def description() -> FabricDescription:
    return FabricDescription.of(build_fabric(load_fabric_spec(resolve_fabric("astral-small"))))


def test_the_default_recipe_grows_packets_with_the_rate_from_the_measured_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    recipe = current_recipe()
    assert recipe.name == DEFAULT_RECIPE_NAME == "jumbo-packets"
    assert recipe.gso_segments == 4 and recipe.scale_mtu and recipe.reference_bps == 20e6
    assert recipe.shaping == DEFAULT_RECIPE  # below 40 Mbit/s: small-packets exactly


def test_the_environment_selects_a_recipe_and_a_wrong_name_says_what_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_VAR, "large-packets")
    assert current_recipe().gso_segments == 44
    monkeypatch.setenv(ENV_VAR, "huge")
    with pytest.raises(ConfigError) as err:
        current_recipe()
    message = str(err.value)
    assert f"${ENV_VAR}" in message and "'huge'" in message
    for name in RECIPES:
        assert name in message


def test_host_configuration_carries_the_recipes_packet_size(description: FabricDescription) -> None:
    for name, recipe in RECIPES.items():
        config = render_host_config(description, "p0s0g0", recipe)
        assert ("net.ipv4.tcp_min_tso_segs", str(recipe.gso_segments)) in config.sysctls, name
        gso = [argv for argv in config.links if "gso_max_segs" in argv]
        assert gso and all(argv[-1] == str(recipe.gso_segments) for argv in gso)
        assert len(gso) == len(config.interfaces)


def test_flow_queues_render_one_class_and_leaf_per_queue_under_the_link_class() -> None:
    recipe = RECIPES["flow-queues"].shaping
    commands = shaping_commands("p0r0t0-eth3", 20e6, recipe)
    root = commands[0]
    assert root[-2:] == ["default", f"{FLOW_CLASS_BASE:x}"]  # unclassified -> the first queue
    classes = [c for c in commands if c[:3] == ["tc", "class", "replace"]]
    assert len(classes) == 1 + recipe.flow_queues
    link, flows = classes[0], classes[1:]
    assert link[link.index("classid") + 1] == "1:1"
    for argv in flows:
        assert argv[argv.index("parent") + 1] == "1:1"
        assert argv[argv.index("rate") + 1] == f"{round(20e6 / recipe.flow_queues)}bit"
        assert argv[argv.index("ceil") + 1] == "20000000bit"  # any queue may use the link
    leaves = [c for c in commands if c[:3] == ["tc", "qdisc", "replace"] and "root" not in c]
    assert [leaf[leaf.index("parent") + 1] for leaf in leaves] == recipe.flow_classids()
    (flt,) = [c for c in commands if c[:3] == ["tc", "filter", "replace"]]
    assert flt[flt.index("bytecode") + 1] == flow_hash_bytecode(recipe.flow_queues)


def test_flow_queue_depth_is_the_links_split_but_never_below_the_floor() -> None:
    recipe = RECIPES["flow-queues"].shaping
    whole = DEFAULT_RECIPE.queue_frames(200e6)
    leaf = recipe.leaf(200e6, share=recipe.flow_queues)
    assert int(leaf[-1]) == max(recipe.min_flow_packets, -(-whole // recipe.flow_queues))
    assert int(recipe.leaf(1e6, share=16)[-1]) == recipe.min_flow_packets


def _bpf(program: str) -> list[tuple[int, int, int, int]]:
    count, *ops = program.split(",")
    decoded = [tuple(int(x) for x in op.split()) for op in ops]
    assert len(decoded) == int(count)
    return decoded  # type: ignore[return-value]


def _run(ops: list[tuple[int, int, int, int]], frame: bytes) -> int:
    """A classic-BPF interpreter for the instructions the flow hash uses."""
    a = x = 0
    mem = [0] * 16
    pc = 0
    word = lambda at: int.from_bytes(frame[at : at + 4], "big")  # noqa: E731
    while True:
        code, jt, jf, k = ops[pc]
        pc += 1
        if code == 0x28:
            a = int.from_bytes(frame[k : k + 2], "big")
        elif code == 0x30:
            a = frame[k]
        elif code == 0x20:
            a = word(k)
        elif code == 0x40:
            a = word(x + k)
        elif code == 0xB1:
            x = 4 * (frame[k] & 0xF)
        elif code == 0x02:
            mem[k] = a
        elif code == 0x61:
            x = mem[k]
        elif code == 0xAC:
            a ^= x
        elif code == 0x24:
            a = (a * k) & 0xFFFFFFFF
        elif code == 0x74:
            a >>= k
        elif code == 0x04:
            a = (a + k) & 0xFFFFFFFF
        elif code == 0x15:
            pc += jt if a == k else jf
        elif code == 0x16:
            return a
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


def _frame(src: str, dst: str, sport: int, dport: int, proto: int = 6) -> bytes:
    ip = bytes([0x45, 0, 0, 40, 0, 0, 0, 0, 64, proto, 0, 0])
    ip += bytes(int(o) for o in src.split(".")) + bytes(int(o) for o in dst.split("."))
    return bytes(12) + b"\x08\x00" + ip + sport.to_bytes(2, "big") + dport.to_bytes(2, "big")


def test_the_flow_hash_returns_a_flow_queue_class_and_spreads_flows() -> None:
    ops = _bpf(flow_hash_bytecode(16))
    base = (1 << 16) | FLOW_CLASS_BASE
    seen = set()
    for sport in range(40000, 40064):
        classid = _run(ops, _frame("10.0.0.1", "10.0.1.1", sport, 5201))
        assert base <= classid < base + 16
        seen.add(classid)
    assert len(seen) == 16  # 64 flows reach every queue
    # the same flow always lands in the same queue
    assert _run(ops, _frame("10.0.0.1", "10.0.1.1", 40001, 5201)) == _run(
        ops, _frame("10.0.0.1", "10.0.1.1", 40001, 5201)
    )
    # not TCP (here UDP) and not IPv4: the first queue
    assert _run(ops, _frame("10.0.0.1", "10.0.1.1", 1, 2, proto=17)) == base
    assert _run(ops, bytes(12) + b"\x08\x06" + bytes(28)) == base


def test_flow_queue_counts_must_be_powers_of_two() -> None:
    for bad in (0, 1, 3, 12):
        with pytest.raises(ValueError):
            flow_hash_bytecode(bad)


def test_unshaped_looks_for_the_recipes_leaf(description: FabricDescription) -> None:
    recipe = RECIPES["flow-queues"].shaping
    wiring = plan_wiring(description, recipe)
    intf = wiring.shapers[0].intf
    assert all(s.recipe == recipe for s in wiring.shapers)
    ok = [
        {"dev": intf, "kind": "htb", "handle": "1:"},
        {"dev": intf, "kind": "pfifo_head_drop", "parent": recipe.flow_classids()[0]},
    ]
    assert unshaped(ok, [intf], recipe) == []
    assert unshaped(ok, [intf]) == [intf]  # the single-leaf recipe expects its leaf at 1:1


# --- recipes whose packets grow with the link rate ------------------------------------------


def _at(description: FabricDescription, factor: float) -> FabricDescription:
    """``description``'s fabric with every emulated rate ``factor`` times as high."""
    spec = description.fabric.spec
    scaled = replace(spec, emulation=replace(spec.emulation, scale=spec.emulation.scale * factor))
    return FabricDescription.of(build_fabric(scaled))


@pytest.mark.parametrize(
    ("factor", "scale"), [(0.6, 1), (1, 1), (1.9, 1), (2, 2), (4, 4), (8, 8), (64, 10)]
)
def test_jumbo_frames_grow_with_the_slowest_link_in_whole_multiples_up_to_the_cap(
    description: FabricDescription, factor: float, scale: int
) -> None:
    fitted = RECIPES["jumbo-packets"].fitted(_at(description, factor))
    assert fitted.packet_scale == scale
    assert fitted.mtu == 1500 * scale <= MAX_MTU
    assert fitted.segments == 4  # segments per packet stay; the segments grow
    assert fitted.shaping.mtu == fitted.mtu
    assert fitted.payload_share == pytest.approx((1500 * scale - 40) / (1500 * scale + 14))
    assert fitted.fitted(_at(description, factor)) == fitted  # idempotent, never compounded


def test_a_slower_tier_sets_the_scale_so_no_queue_is_coarser_than_the_reference(
    description: FabricDescription,
) -> None:
    spec = _at(description, 8).fabric.spec
    slow_core = replace(spec, speeds=replace(spec.speeds, agg_core=spec.speeds.agg_core / 4))
    fitted = RECIPES["jumbo-packets"].fitted(FabricDescription.of(build_fabric(slow_core)))
    assert fitted.packet_scale == 2  # agg-core at 2 x 20 Mbit/s, the NICs at 8 x


def test_at_the_reference_rate_the_scaled_recipes_are_the_default_one(
    description: FabricDescription,
) -> None:
    reference = render_host_config(description, "p0s0g0", RECIPES["small-packets"])
    for name in ("jumbo-packets", "scaled-packets"):
        assert render_host_config(description, "p0s0g0", RECIPES[name]) == reference, name
        wiring = plan_wiring(description, RECIPES[name].fitted(description).shaping)
        default = plan_wiring(description, RECIPES["small-packets"].shaping)
        assert [s.commands() for s in wiring.shapers] == [s.commands() for s in default.shapers]


def test_jumbo_frames_keep_every_queue_as_deep_in_packets_as_the_reference(
    description: FabricDescription,
) -> None:
    """Time-equivalence: at F x R with F x the frames, every shaper holds the packets (and
    milliseconds) it holds at R, and every GPU port carries the larger MTU."""
    reference = {s.intf: s.commands() for s in plan_wiring(description).shapers}
    fast = _at(description, 4)
    fitted = RECIPES["jumbo-packets"].fitted(fast)
    for shaper in plan_wiring(fast, fitted.shaping).shapers:
        leaf, before = shaper.commands()[-1], reference[shaper.intf][-1]
        assert leaf[-3:-1] == before[-3:-1] == ["pfifo_head_drop", "limit"]
        # the same packets, to the rounding of a 14-byte Ethernet header that does not grow
        assert abs(int(leaf[-1]) - int(before[-1])) <= max(1, 0.01 * int(before[-1]))
    config = render_host_config(fast, "p0s0g0", RECIPES["jumbo-packets"])
    mtus = [argv[-1] for argv in config.links if "mtu" in argv]
    assert mtus and set(mtus) == {"6000"} and len(mtus) == len(config.interfaces)


def test_scaled_segments_keep_the_queue_in_packets_and_multiply_the_segments(
    description: FabricDescription,
) -> None:
    fast = _at(description, 4)
    fitted = RECIPES["scaled-packets"].fitted(fast)
    assert (fitted.segments, fitted.mtu, fitted.packet_scale) == (16, 1500, 4)
    config = render_host_config(fast, "p0s0g0", RECIPES["scaled-packets"])
    assert ("net.ipv4.tcp_min_tso_segs", "16") in config.sysctls
    assert fitted.shaping.queue_frames(80e6) == DEFAULT_RECIPE.queue_frames(20e6)
    assert RECIPES["scaled-packets"].fitted(_at(description, 64)).segments == 44


def test_the_ceiling_and_the_calibration_count_tcps_payload_of_the_frames_in_use() -> None:
    assert tcp_payload_share(1500) == TCP_PAYLOAD_SHARE
    assert tcp_payload_share(6000) == pytest.approx(5960 / 6014)


def test_a_calibration_step_resizes_the_packets_with_the_rates(
    description: FabricDescription,
) -> None:
    """The calibration re-shapes a running fabric step by step (measure.reshape); under a
    scaling recipe each GPU's frames and segments must follow, not only its shapers."""
    from orchestrator.calibration.measure import packet_commands

    config = render_host_config(_at(description, 4), "p0s0g0", RECIPES["jumbo-packets"])
    commands = packet_commands(config)
    assert {argv[-1] for argv in commands if "mtu" in argv} == {"6000"}
    assert ["sysctl", "-q", "-w", "net.ipv4.tcp_min_tso_segs=4"] in commands
    assert len([a for a in commands if "gso_max_segs" in a]) == len(config.interfaces)


def test_a_recorded_runs_payload_share_is_the_one_its_forecast_uses(
    description: FabricDescription, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.emulation.recipe import payload_share_of

    monkeypatch.setenv(ENV_VAR, "small-packets")
    fast = _at(description, 4)
    assert payload_share_of(fast) == TCP_PAYLOAD_SHARE  # this process: small-packets
    recorded = FabricDescription(fast.fabric, fast.addresses, {"tcp_payload_share": 0.991})
    assert payload_share_of(recorded) == 0.991  # the run's, whatever this process uses
    monkeypatch.setenv(ENV_VAR, "jumbo-packets")
    assert payload_share_of(fast) == pytest.approx(5960 / 6014)
