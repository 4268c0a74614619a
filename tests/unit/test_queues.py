"""The switches' egress queue sampler: tc's JSON read into per-port counters, and the
diagnosis's count of what a queue dropped over a window."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.diagnosis.evidence import Observations, direction_map
from orchestrator.emulation.executor import Completed
from orchestrator.testbed.queues import QDISC_COMMAND, QueueSampler, parse_qdiscs, switch_interfaces
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


class Machine:
    """A command executor that answers tc's command with :data:`TC_OUTPUT`, or fails."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.calls: list[tuple[str | None, list[str]]] = []

    def run(self, node: str | None, argv: list[str], **_: object) -> Completed:
        self.calls.append((node, list(argv)))
        code = 0 if self.ok else 127
        return Completed(tuple(argv), code, json.dumps(TC_OUTPUT) if self.ok else "", "")


def test_a_sampler_samples_on_start_and_stop_and_counts_what_it_could_not() -> None:
    machine = Machine()
    sampler = QueueSampler(machine, {"p0r0t0-eth1": ("p0r0t0", 1)}, ["p0r0t0"], interval=60)
    sampler.start()
    sampler.stop()
    sampler.stop()  # idempotent
    assert [c[1] for c in machine.calls] == [QDISC_COMMAND, QDISC_COMMAND]
    assert len(sampler.snapshot()) == 2 and sampler.failures == 0
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
