"""Link faults as data (orchestrator/emulation/faults.py): which commands, on which node,
for both ends of a link, and how FabricFaults hands them to an executor. No root."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from orchestrator.emulation.executor import Completed
from orchestrator.emulation.faults import (
    FabricFaults,
    NodeCommand,
    link_rate_commands,
    link_state_commands,
)
from orchestrator.emulation.shaping import ShapingRecipe
from tests.helpers import preset_description
from topologies.description import FabricDescription
from topologies.errors import EmulationError
from topologies.model import Link, LinkKind


@pytest.fixture(scope="module")
def astral() -> FabricDescription:
    return preset_description("astral-small")


def nic_link(description: FabricDescription, gpu: str, port: int) -> Link:
    return next(x for x in description.fabric.nic_links(gpu) if x.port_of(gpu) == port)


def tor_agg_link(description: FabricDescription) -> Link:
    return description.fabric.links_of_kind(LinkKind.TOR_AGG)[0]


class RecordingExecutor:
    """A CommandExecutor that runs nothing: records (node, argv) and answers ``returncode``."""

    def __init__(self, returncode: int = 0, stderr: str = "") -> None:
        self.calls: list[tuple[str | None, tuple[str, ...]]] = []
        self.returncode = returncode
        self.stderr = stderr

    def run(self, node: str | None, argv: Sequence[str], **options: Any) -> Completed:
        self.calls.append((node, tuple(argv)))
        return Completed(tuple(argv), self.returncode, "", self.stderr)

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        raise AssertionError("a link fault starts no process")


# --- link state ------------------------------------------------------------------------------


def test_a_nic_link_goes_down_at_both_ends_each_on_its_own_node(
    astral: FabricDescription,
) -> None:
    link = nic_link(astral, "p0s0g0", 1)
    assert link_state_commands(link, up=False) == [
        NodeCommand("p0s0g0", ("ip", "link", "set", "dev", "p0s0g0-eth1", "down")),
        NodeCommand("p0r0t0", ("ip", "link", "set", "dev", "p0r0t0-eth1", "down")),
    ]


def test_a_switch_link_comes_up_at_both_ends(astral: FabricDescription) -> None:
    link = tor_agg_link(astral)  # p0r0t0 port 3 - p0r0a0 port 1
    commands = link_state_commands(link, up=True)
    assert [c.node for c in commands] == [link.a, link.b]
    assert [c.argv for c in commands] == [
        ("ip", "link", "set", "dev", f"{link.a}-eth{link.a_port}", "up"),
        ("ip", "link", "set", "dev", f"{link.b}-eth{link.b_port}", "up"),
    ]


# --- link rate -------------------------------------------------------------------------------


def _leaf(commands: list[NodeCommand], node: str) -> tuple[str, ...]:
    (leaf,) = [c.argv for c in commands if c.node == node and "10:" in c.argv]
    return leaf[leaf.index("10:") + 1 :]


def _class_rate(commands: list[NodeCommand], node: str) -> str:
    (cls,) = [c.argv for c in commands if c.node == node and c.argv[:2] == ("tc", "class")]
    return cls[cls.index("rate") + 1]


def test_rate_change_reshapes_both_ends_gpu_end_with_the_host_side_leaf(
    astral: FabricDescription,
) -> None:
    link = nic_link(astral, "p0s0g0", 1)
    commands = link_rate_commands(astral, link, 5e6)
    assert [c.node for c in commands] == ["p0s0g0"] * 3 + ["p0r0t0"] * 3
    assert {c.argv[c.argv.index("dev") + 1] for c in commands if c.node == "p0s0g0"} == {
        "p0s0g0-eth1"
    }
    assert {c.argv[c.argv.index("dev") + 1] for c in commands if c.node == "p0r0t0"} == {
        "p0r0t0-eth1"
    }
    assert _class_rate(commands, "p0s0g0") == _class_rate(commands, "p0r0t0") == "5000000bit"
    # The GPU's end is its NIC (deep packet FIFO), the ToR's end the switch buffer.
    assert _leaf(commands, "p0s0g0") == ("pfifo", "limit", "1000")
    assert _leaf(commands, "p0r0t0")[0] == "pfifo_head_drop"
    # tc ... replace: the link is never without a shaper while its rate changes.
    assert all(
        c.argv[:3] in (("tc", "qdisc", "replace"), ("tc", "class", "replace")) for c in commands
    )


def test_rate_change_of_a_switch_link_gives_both_ends_the_switch_leaf(
    astral: FabricDescription,
) -> None:
    link = tor_agg_link(astral)
    commands = link_rate_commands(astral, link, 8e6)
    assert [c.node for c in commands] == [link.a] * 3 + [link.b] * 3
    assert _leaf(commands, link.a)[0] == _leaf(commands, link.b)[0] == "pfifo_head_drop"


def test_rate_change_follows_the_recipe(astral: FabricDescription) -> None:
    recipe = ShapingRecipe(switch_queue="bfifo", host_queue_packets=50)
    commands = link_rate_commands(astral, nic_link(astral, "p1s1g1", 2), 10e6, recipe)
    tor = nic_link(astral, "p1s1g1", 2).other("p1s1g1")
    assert _leaf(commands, "p1s1g1") == ("pfifo", "limit", "50")
    assert _leaf(commands, tor)[0] == "bfifo"


# --- FabricFaults over an executor -----------------------------------------------------------


def test_gpu_ends_run_in_the_gpu_and_switch_ends_in_the_root_namespace(
    astral: FabricDescription,
) -> None:
    executor = RecordingExecutor()
    link = nic_link(astral, "p0s0g0", 2)
    FabricFaults(executor, astral).set_link_state(link, up=False)
    assert executor.calls == [
        ("p0s0g0", ("ip", "link", "set", "dev", "p0s0g0-eth2", "down")),
        (None, ("ip", "link", "set", "dev", "p0r0t1-eth1", "down")),
    ]


def test_restoring_a_rate_puts_back_the_emulated_rate(astral: FabricDescription) -> None:
    executor = RecordingExecutor()
    faults = FabricFaults(executor, astral)
    link = tor_agg_link(astral)
    faults.set_link_rate(link, 1e6)
    faults.restore_link_rate(link)
    rates = [argv[argv.index("rate") + 1] for _, argv in executor.calls if "rate" in argv]
    emulated = astral.emulated_rate(link)
    assert emulated == 20e6  # astral-small: 200G at scale 1e-4
    assert rates == ["1000000bit", "1000000bit", "20000000bit", "20000000bit"]
    assert all(node is None for node, _ in executor.calls)


def test_a_failing_command_is_an_error_naming_the_node_and_the_command(
    astral: FabricDescription,
) -> None:
    executor = RecordingExecutor(returncode=1, stderr="Cannot find device\n")
    link = nic_link(astral, "p0s0g0", 1)
    with pytest.raises(EmulationError, match=r"ip link set dev p0s0g0-eth1 up on p0s0g0 failed"):
        FabricFaults(executor, astral).set_link_state(link, up=True)
    assert len(executor.calls) == 1  # stops at the first failure
