"""Link faults as data (orchestrator/emulation/faults.py): which commands, on which node,
for both ends of a link (or one), a switch's ports, loss tables and blackhole entries, and
how FabricFaults hands them to an executor. No root."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from controllers.openflow import COOKIE
from controllers.plan import FAULT_PRIORITY, ROUTE_PRIORITY, is_fault_cookie
from controllers.policies.adaptive import FLOW_PRIORITY
from controllers.policies.path_pinned import PIN_PRIORITY
from orchestrator.emulation.executor import Completed
from orchestrator.emulation.faults import (
    LOSS_MODULUS,
    FabricFaults,
    NodeCommand,
    blackhole_commands,
    blackhole_removal_commands,
    fault_cookie,
    link_rate_commands,
    link_state_commands,
    loss_commands,
    loss_removal_commands,
    loss_table,
    loss_threshold,
    switch_state_commands,
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
    # the class and the leaf at each end; the root HTB from bring-up stays (HTB refuses a
    # change of itself)
    assert [c.node for c in commands] == ["p0s0g0"] * 2 + ["p0r0t0"] * 2
    assert not any("root" in c.argv for c in commands)
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
    assert [c.node for c in commands] == [link.a] * 2 + [link.b] * 2
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
    assert executor.calls == [  # the root namespace's end first: it is the quicker
        ("p0r0t1", ("ip", "link", "set", "dev", "p0r0t1-eth1", "down")),
        ("p0s0g0", ("ip", "link", "set", "dev", "p0s0g0-eth2", "down")),
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
    assert {node for node, _ in executor.calls} == {link.a, link.b}  # switches: root ns


def test_a_failing_command_is_an_error_naming_the_node_and_the_command(
    astral: FabricDescription,
) -> None:
    executor = RecordingExecutor(returncode=1, stderr="Cannot find device\n")
    link = nic_link(astral, "p0s0g0", 1)
    with pytest.raises(EmulationError, match=r"ip link set dev p0r0t0-eth1 up on p0r0t0 failed"):
        FabricFaults(executor, astral).set_link_state(link, up=True)
    assert len(executor.calls) == 1  # stops at the first failure


# --- switches, loss, blackholes --------------------------------------------------------------


def test_a_switch_goes_down_on_every_one_of_its_ports_in_the_root_namespace(
    astral: FabricDescription,
) -> None:
    commands = switch_state_commands(astral.fabric, "p0r0t0", up=False)
    ports = sorted(link.port_of("p0r0t0") for link in astral.fabric.links_of("p0r0t0"))
    assert len(ports) >= 3  # its GPUs and its aggregation uplinks
    assert [c.argv for c in commands] == [
        ("ip", "link", "set", "dev", f"p0r0t0-eth{p}", "down") for p in ports
    ]
    executor = RecordingExecutor()
    FabricFaults(executor, astral).set_switch_state("p0r0t0", up=True)
    assert {node for node, _ in executor.calls} == {"p0r0t0"}  # the root namespace
    assert all(argv[-1] == "up" for _, argv in executor.calls)


def test_loss_is_one_netdev_egress_table_per_end_dropping_at_random() -> None:
    link = Link("p0r0t0", 3, "p0r0a0", 1, LinkKind.TOR_AGG, 200e9)
    table = loss_table("20261201T120000-42", 3)
    assert table == "astral_20261201T120000_42_f3"
    commands = loss_commands(table, link, 0.02)
    assert [(c.node, c.argv) for c in commands] == [
        ("p0r0t0", ("nft", "-f", "-")),
        ("p0r0a0", ("nft", "-f", "-")),
    ]
    script = commands[0].input or ""
    assert f"table netdev {table}" in script
    assert 'hook egress device "p0r0t0-eth3"' in script
    assert f"numgen random mod {LOSS_MODULUS} < 20000 counter drop" in script
    # one direction: only the sending end gets a table; removal deletes what was made
    (one,) = loss_commands(table, link, 0.5, ends=[("p0r0a0", 1)])
    assert 'device "p0r0a0-eth1"' in (one.input or "")
    assert [c.argv for c in loss_removal_commands(table, link, [("p0r0a0", 1)])] == [
        ("nft", "delete", "table", "netdev", table)
    ]
    assert loss_threshold(1e-9) == 1 and loss_threshold(1.0) == LOSS_MODULUS


def test_a_gpu_end_of_a_lossy_link_steals_its_packets_so_that_its_sender_retransmits() -> None:
    # a drop at the GPU's own egress would be reported to its TCP as a refused send (no
    # retransmission); a packet forwarded away counts as sent and is lost as on a wire
    link = Link("p0s0g1", 1, "p0r0t0", 2, LinkKind.NIC, 200e9)
    gpu_end, tor_end = loss_commands("t", link, 0.03, hosts={"p0s0g1"})
    assert gpu_end.node == "p0s0g1"
    assert 'counter fwd to "lo"' in (gpu_end.input or "")
    assert "drop" not in (gpu_end.input or "")
    assert tor_end.node == "p0r0t0" and "counter drop" in (tor_end.input or "")


def test_a_blackhole_drops_each_address_above_every_policy_with_its_own_cookie() -> None:
    cookie = fault_cookie(7)
    assert is_fault_cookie(cookie) and not is_fault_cookie(COOKIE)
    (command,) = blackhole_commands("c3", ["10.1.0.5", "10.1.1.5"], cookie)
    assert command.argv == ("ovs-ofctl", "-O", "OpenFlow13", "add-flows", "c3", "-")
    assert (command.input or "").splitlines() == [
        f"cookie={cookie:#x},table=0,priority={FAULT_PRIORITY},ip,nw_dst={a},actions=drop"
        for a in ("10.1.0.5", "10.1.1.5")
    ]
    assert max(PIN_PRIORITY, FLOW_PRIORITY, ROUTE_PRIORITY) < FAULT_PRIORITY
    (removal,) = blackhole_removal_commands("c3", cookie)
    assert removal.argv == (
        "ovs-ofctl",
        "-O",
        "OpenFlow13",
        "del-flows",
        "c3",
        f"cookie={cookie:#x}/-1",
    )
    with pytest.raises(ValueError):
        fault_cookie(1 << 32)


def test_removing_a_loss_table_already_gone_is_done_and_input_reaches_the_executor(
    astral: FabricDescription,
) -> None:
    inputs: list[str | None] = []

    class Gone(RecordingExecutor):
        def run(self, node: str | None, argv: Sequence[str], **options: Any) -> Completed:
            inputs.append(options.get("input"))
            return Completed(tuple(argv), 1, "", "Error: No such file or directory\n")

    link = nic_link(astral, "p0s0g0", 1)
    FabricFaults(Gone(), astral).remove_link_loss("t", link)  # no error
    with pytest.raises(EmulationError, match="nft -f -"):
        FabricFaults(Gone(), astral).add_link_loss("t", link, 0.1)
    assert inputs[-1] is not None and "numgen random" in inputs[-1]
