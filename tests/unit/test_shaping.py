"""Rendering of the link-shaping recipe (orchestrator/emulation/shaping.py); no root needed."""

from __future__ import annotations

import pytest

from orchestrator.emulation.shaping import (
    DEFAULT_RECIPE,
    ShapingRecipe,
    check_command,
    check_shaping,
    qdisc_list_command,
    shaping_commands,
    unshaped,
    unshaping_commands,
)


def _arg(argv: list[str], key: str) -> str:
    """The value after ``key`` in an argv list."""
    return argv[argv.index(key) + 1]


def _class_cmd(cmds: list[list[str]]) -> list[str]:
    (cls,) = [c for c in cmds if c[:3] == ["tc", "class", "replace"]]
    return cls


def _leaf_cmd(cmds: list[list[str]]) -> list[str]:
    (leaf,) = [c for c in cmds if "parent" in c and _arg(c, "parent") == "1:1"]
    return leaf


def test_commands_are_argv_lists_of_strings_for_the_interface() -> None:
    cmds = shaping_commands("p0r0t0-eth3", 20e6)
    assert len(cmds) == 3
    for argv in cmds:
        assert argv[0] == "tc"
        assert all(isinstance(a, str) for a in argv)
        assert _arg(argv, "dev") == "p0r0t0-eth3"


def test_root_is_htb_defaulting_to_the_single_class() -> None:
    root = shaping_commands("x", 20e6)[0]
    assert root[:3] == ["tc", "qdisc", "replace"]
    assert _arg(root, "root") == "handle"
    assert root[root.index("htb") :] == ["htb", "default", "1"]


def test_rate_and_ceil_are_exact_bits_per_second() -> None:
    cls = _class_cmd(shaping_commands("x", 25e6))
    assert _arg(cls, "rate") == "25000000bit"
    assert _arg(cls, "ceil") == "25000000bit"
    cls = _class_cmd(shaping_commands("x", 360e6))
    assert _arg(cls, "rate") == _arg(cls, "ceil") == "360000000bit"


def test_burst_equals_cburst_and_scales_with_rate() -> None:
    # 10 ms of the rate: 20 Mbit/s -> 25 000 bytes, 360 Mbit/s -> 450 000 bytes
    for rate, expected in ((20e6, 25_000), (100e6, 125_000), (360e6, 450_000)):
        cls = _class_cmd(shaping_commands("x", rate))
        assert _arg(cls, "burst") == _arg(cls, "cburst") == str(expected)


def test_burst_has_a_floor_of_full_frames_for_slow_links() -> None:
    # 5 Mbit/s * 10 ms = 6 250 bytes < 8 frames of 1514 = 12 112 bytes
    cls = _class_cmd(shaping_commands("x", 5e6))
    assert _arg(cls, "burst") == str(8 * 1514)
    assert _arg(shaping_commands("x", 1e6)[1], "burst") == str(8 * 1514)


def test_burst_floor_follows_the_mtu() -> None:
    cls = _class_cmd(shaping_commands("x", 20e6, mtu=9000))
    assert _arg(cls, "burst") == str(8 * 9014)  # 72 112 > 25 000 bytes of 10 ms
    assert _arg(cls, "quantum") == "9014"


def test_cburst_is_never_left_to_tc() -> None:
    # tc's own cburst is ceil/HZ + MTU = 1600 bytes here: the TCLink problem
    for rate in (1e6, 20e6, 100e6, 1e9):
        cls = _class_cmd(shaping_commands("x", rate))
        assert int(_arg(cls, "cburst")) >= 8 * 1514


def test_quantum_is_one_frame_so_tc_does_not_warn() -> None:
    cls = _class_cmd(shaping_commands("x", 100e6))
    assert _arg(cls, "quantum") == "1514"


def test_switch_side_leaf_is_a_head_drop_fifo_of_queue_time_in_frames() -> None:
    leaf = _leaf_cmd(shaping_commands("x", 100e6))
    assert "pfifo_head_drop" in leaf
    assert _arg(leaf, "limit") == str(round(125_000 / 1514))  # 100 Mbit/s * 10 ms = 83 frames
    leaf = _leaf_cmd(shaping_commands("x", 40e6))
    assert _arg(leaf, "limit") == str(round(50_000 / 1514))


def test_switch_side_drop_tail_byte_fifo_is_still_available() -> None:
    recipe = ShapingRecipe(switch_queue="bfifo")
    leaf = _leaf_cmd(shaping_commands("x", 100e6, recipe))
    assert "bfifo" in leaf
    assert _arg(leaf, "limit") == str(125_000)


def test_switch_side_queue_has_a_floor_of_full_frames() -> None:
    leaf = _leaf_cmd(shaping_commands("x", 10e6))  # 12 500 bytes < 16 frames
    assert _arg(leaf, "limit") == "16"
    leaf = _leaf_cmd(shaping_commands("x", 10e6, ShapingRecipe(switch_queue="bfifo")))
    assert _arg(leaf, "limit") == str(16 * 1514)


def test_host_side_leaf_is_a_deep_packet_fifo() -> None:
    leaf = _leaf_cmd(shaping_commands("x", 20e6, host_side=True))
    assert "pfifo" in leaf
    assert "pfifo_head_drop" not in leaf
    assert _arg(leaf, "limit") == "1000"
    # the HTB class is the same on both sides
    assert _class_cmd(shaping_commands("x", 20e6, host_side=True)) == _class_cmd(
        shaping_commands("x", 20e6)
    )


def test_unknown_leaf_queues_are_refused() -> None:
    with pytest.raises(ValueError, match="switch-side"):
        shaping_commands("x", 20e6, ShapingRecipe(switch_queue="red"))
    with pytest.raises(ValueError, match="host-side"):
        shaping_commands("x", 20e6, ShapingRecipe(host_queue="fq"), host_side=True)


def test_overhead_is_added_only_when_asked() -> None:
    assert "overhead" not in _class_cmd(shaping_commands("x", 20e6))
    recipe = ShapingRecipe(overhead_bytes=24)
    assert _arg(_class_cmd(shaping_commands("x", 20e6, recipe)), "overhead") == "24"


def test_recipe_parameters_drive_the_rendering() -> None:
    recipe = ShapingRecipe(burst_s=0.004, queue_s=0.020, host_queue_packets=500)
    cls = _class_cmd(shaping_commands("x", 100e6, recipe))
    assert _arg(cls, "burst") == "50000"
    assert _arg(_leaf_cmd(shaping_commands("x", 100e6, recipe)), "limit") == "165"  # frames
    host_leaf = _leaf_cmd(shaping_commands("x", 100e6, recipe, host_side=True))
    assert _arg(host_leaf, "limit") == "500"


def test_recipe_byte_helpers_match_the_commands() -> None:
    for rate in (5e6, 20e6, 100e6, 360e6):
        cls = _class_cmd(shaping_commands("x", rate))
        assert int(_arg(cls, "burst")) == DEFAULT_RECIPE.burst_bytes(rate)
        leaf = _leaf_cmd(shaping_commands("x", rate))
        assert int(_arg(leaf, "limit")) == DEFAULT_RECIPE.queue_frames(rate)
        # a full bucket sent back to back fits the next hop's queue
        assert DEFAULT_RECIPE.burst_bytes(rate) <= DEFAULT_RECIPE.queue_bytes(rate)


def test_positional_interface_is_unchanged() -> None:
    # the emulation calls shaping_commands(intf, rate_bps, recipe)
    assert shaping_commands("x", 20e6, DEFAULT_RECIPE) == shaping_commands("x", 20e6)


@pytest.mark.parametrize("rate", [0, -1.0])
def test_non_positive_rate_is_refused(rate: float) -> None:
    with pytest.raises(ValueError):
        shaping_commands("x", rate)


def test_applying_twice_is_harmless_because_every_command_replaces() -> None:
    for argv in shaping_commands("x", 20e6) + shaping_commands("x", 20e6, host_side=True):
        assert argv[2] == "replace"


def test_unshaping_deletes_the_root() -> None:
    assert unshaping_commands("x") == [["tc", "qdisc", "del", "dev", "x", "root"]]


# what `tc class show dev X` printed on the project's machine (iproute2 6.1)
_TC_OUT = "class htb 1:1 root leaf 10: prio 0 rate 25Mbit ceil 25Mbit burst 12500b cburst 12500b \n"


def test_check_accepts_the_applied_recipe() -> None:
    assert check_command("x") == ["tc", "class", "show", "dev", "x"]
    assert check_shaping(_TC_OUT, 25e6) is None
    assert check_shaping(_TC_OUT.replace("25Mbit", "360Mbit"), 360e6) is None
    assert check_shaping(_TC_OUT.replace("25Mbit", "1500Kbit"), 1.5e6) is None


def test_check_reports_a_wrong_rate() -> None:
    problem = check_shaping(_TC_OUT, 20e6)
    assert problem is not None and "25000000" in problem


def test_check_reports_a_missing_shaper() -> None:
    # what is left after Open vSwitch removed the qdisc: no classes at all
    problem = check_shaping("", 20e6)
    assert problem is not None and "missing" in problem


def test_unshaped_names_ports_without_the_htb_root_or_its_leaf() -> None:
    # `tc -j qdisc show` as iproute2 6.1 prints it (trimmed)
    qdiscs: list[dict[str, object]] = [
        {"kind": "htb", "handle": "1:", "dev": "a-eth1", "root": True},
        {"kind": "pfifo_head_drop", "handle": "10:", "dev": "a-eth1", "parent": "1:1"},
        {"kind": "htb", "handle": "1:", "dev": "a-eth2", "root": True},  # leaf gone
        {"kind": "pfifo_fast", "handle": "0:", "dev": "a-eth3", "root": True},  # OVS removed it
        {"kind": "htb", "handle": "1:", "dev": "a-eth4", "root": True},
        {"kind": "bfifo", "handle": "10:", "dev": "a-eth4", "parent": "1:1"},  # not the recipe's
    ]
    ports = ["a-eth1", "a-eth2", "a-eth3", "a-eth4", "a-eth5"]
    assert unshaped(qdiscs, ports) == ["a-eth2", "a-eth3", "a-eth4", "a-eth5"]
    assert unshaped(qdiscs, ports, ShapingRecipe(switch_queue="bfifo")) == [
        "a-eth1", "a-eth2", "a-eth3", "a-eth5",
    ]  # fmt: skip
    assert qdisc_list_command() == ["tc", "-j", "qdisc", "show"]
