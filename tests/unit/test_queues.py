"""The switches' egress queue sampler: tc's JSON read into per-port counters, and the
diagnosis's count of what a queue dropped over a window."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.diagnosis.evidence import Observations, direction_map
from orchestrator.emulation.executor import Completed
from orchestrator.testbed.queues import (
    QDISC_COMMAND,
    SOCKET_COMMAND,
    QueueSampler,
    parse_qdiscs,
    parse_socket_drops,
    switch_interfaces,
)
from tests.helpers import preset_description

# what `tc -s -j qdisc show` printed on this machine for a shaped port (HTB root, a
# pfifo leaf), a GPU-side interface and the loopback, trimmed
TC_OUTPUT = [
    {"kind": "noqueue", "handle": "0:", "dev": "lo", "root": True, "bytes": 0, "packets": 0,
     "drops": 0, "backlog": 0, "qlen": 0},
    {"kind": "htb", "handle": "1:", "dev": "p0r0t0-eth1", "root": True, "bytes": 9000,
     "packets": 120, "drops": 7, "overlimits": 3, "requeues": 0, "backlog": 6110, "qlen": 1},
    {"kind": "pfifo", "handle": "10:", "dev": "p0r0t0-eth1", "parent": "1:1", "bytes": 9000,
     "packets": 120, "drops": 7, "backlog": 6110, "qlen": 1},
    {"kind": "htb", "handle": "1:", "dev": "p0s0g0-eth1", "root": True, "packets": 5,
     "drops": 1, "backlog": 0},
]  # fmt: skip


def test_switch_ports_are_named_as_mininet_names_them_and_gpus_are_not_switches() -> None:
    description = preset_description("astral-small")
    interfaces = switch_interfaces(description)
    fabric = description.fabric
    assert set(interfaces.values()) == {
        (node, link.port_of(node))
        for link in fabric.links
        for node in (link.a, link.b)
        if node in fabric.switches
    }
    assert all(name.split("-eth")[0] in fabric.switches for name in interfaces)


def test_only_the_root_qdisc_of_a_switch_port_is_read() -> None:
    interfaces = {"p0r0t0-eth1": ("p0r0t0", 1)}
    (row,) = parse_qdiscs(json.dumps(TC_OUTPUT), interfaces, 5.0)
    assert (row.t, row.switch, row.port, row.packets, row.drops, row.backlog) == (
        5.0, "p0r0t0", 1, 120, 7, 6110,
    )  # fmt: skip
    assert parse_qdiscs("not json", interfaces, 5.0) == []
    assert parse_qdiscs('{"an": "object"}', interfaces, 5.0) == []


def ss_line(where: str, process: str, drops: int) -> str:
    """One line as `ss -H -0 -m -p` printed it on this machine, spaces trimmed."""
    return (
        f'p_raw 0 0 {where} * users:(("{process}",pid=21387,fd=43)) '
        f"skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d{drops})"
    )


# ovs-vswitchd's unbound socket, its sockets on a switch port (10,215 dropped after
# 200,000 frames were sent into it at once) and on a GPU-side interface, and a capture's
# socket on the same switch port
SS_OUTPUT = "\n".join(
    [
        ss_line("[0]:*", "ovs-vswitchd", 0),
        ss_line("*:p0r0t0-eth1", "ovs-vswitchd", 10215),
        ss_line("*:p0r0t0-eth1", "tcpdump", 31),
        ss_line("*:p0r0t0-eth2", "ovs-vswitchd", 0),
        ss_line("*:p0s0g0-eth1", "ovs-vswitchd", 9),
    ]
)


def test_the_switch_process_socket_drops_are_read_per_switch_port() -> None:
    interfaces = {"p0r0t0-eth1": ("p0r0t0", 1), "p0r0t0-eth2": ("p0r0t0", 2)}
    rows = parse_socket_drops(SS_OUTPUT, interfaces, 5.0)
    assert [(r.t, r.switch, r.port, r.drops) for r in rows] == [
        (5.0, "p0r0t0", 1, 10215), (5.0, "p0r0t0", 2, 0),
    ]  # fmt: skip
    assert parse_socket_drops("", interfaces, 5.0) == []
    assert parse_socket_drops("garbage\nlines", interfaces, 5.0) == []


class Machine:
    """A command executor that answers tc's command with :data:`TC_OUTPUT` and ss's with
    :data:`SS_OUTPUT`, or fails."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.calls: list[tuple[str | None, list[str]]] = []

    def run(self, node: str | None, argv: list[str], **_: object) -> Completed:
        self.calls.append((node, list(argv)))
        code = 0 if self.ok else 127
        out = SS_OUTPUT if argv == SOCKET_COMMAND else json.dumps(TC_OUTPUT)
        return Completed(tuple(argv), code, out if self.ok else "", "")


def test_a_sampler_samples_on_start_and_stop_and_counts_what_it_could_not() -> None:
    machine = Machine()
    sampler = QueueSampler(machine, {"p0r0t0-eth1": ("p0r0t0", 1)}, ["p0r0t0"], interval=60)
    sampler.start()
    sampler.stop()
    sampler.stop()  # idempotent
    assert [c[1] for c in machine.calls] == [QDISC_COMMAND, SOCKET_COMMAND] * 2
    assert len(sampler.snapshot()) == 2 and sampler.failures == 0
    assert [d.drops for d in sampler.ingress_snapshot()] == [10215, 10215]
    broken = QueueSampler(Machine(ok=False), {}, ["p0r0t0"], interval=60)
    broken.sample()
    assert broken.snapshot() == [] and broken.failures == 1


def test_a_queue_counts_its_drops_across_a_replaced_qdisc() -> None:
    description = preset_description("astral-small")
    rows = [(0.0, 0, 0, 0), (1.0, 50, 4, 0), (2.0, 10, 1, 0), (3.0, 40, 6, 0), (4.0, 90, 9, 0)]
    obs = Observations(
        path=Path("b"), description=description, status="ok", operations=[],
        directions=direction_map(description), counters={}, connections=[], events=[],
        saturated=[], gpus_by_rank={}, labels={}, queues={("p0r0t0", 1): rows},
    )  # fmt: skip
    # 0 -> 4, then the qdisc replaced (a slow link's new rate: counted from 1), 1 -> 6
    assert obs.queue_drops(("p0r0t0", 1), 0.0, 3.5) == 4 + 5
    assert obs.queue_drops(("p0r0t0", 1), 2.5, 10.0) == 5 + 3
    assert obs.queue_drops(("p0r0t1", 1), 0.0, 10.0) is None


def test_a_port_socket_counts_its_drops_over_a_window_and_none_when_not_sampled() -> None:
    description = preset_description("astral-small")
    rows = [(0.0, 100), (1.0, 100), (2.0, 120), (3.0, 3), (4.0, 10)]
    obs = Observations(
        path=Path("b"), description=description, status="ok", operations=[],
        directions=direction_map(description), counters={}, connections=[], events=[],
        saturated=[], gpus_by_rank={}, labels={}, ingress={("p0r0t0", 1): rows},
    )  # fmt: skip
    # 100 before the window is the socket's past; then its socket opened again at 3.0
    assert obs.ingress_drops(("p0r0t0", 1), 0.5, 2.5) == 20
    assert obs.ingress_drops(("p0r0t0", 1), 0.0, 10.0) == 20 + 7
    assert obs.ingress_drops(("p0r0t1", 1), 0.0, 10.0) == 0
