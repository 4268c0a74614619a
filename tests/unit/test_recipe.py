"""Emulator recipes (orchestrator/emulation/recipe.py) and what they render; no root needed."""

from __future__ import annotations

import pytest

from orchestrator.emulation.hostconfig import render_host_config
from orchestrator.emulation.recipe import (
    DEFAULT_RECIPE_NAME,
    ENV_VAR,
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


@pytest.fixture(scope="module")
def description() -> FabricDescription:
    return FabricDescription.of(build_fabric(load_fabric_spec(resolve_fabric("astral-small"))))


def test_the_default_recipe_is_the_one_the_fidelity_targets_were_met_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    recipe = current_recipe()
    assert recipe.name == DEFAULT_RECIPE_NAME == "small-packets"
    assert recipe.gso_segments == 4
    assert recipe.shaping == DEFAULT_RECIPE


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
