"""The plan's data structures: richer matches, groups, and following a plan through groups."""

from __future__ import annotations

import pytest

from controllers.plan import (
    FIVE_TUPLE_FIELDS,
    Bucket,
    FlowEntry,
    ForwardingPlan,
    Group,
    GroupEntry,
    GroupType,
    Output,
    Packet,
    SelectionMethod,
    SwitchTable,
    stable_group_id,
)
from controllers.routing import RoutingError, shortest_path_plan
from controllers.tracer import follow, trace_all
from tests.helpers import preset_description


def test_masked_source_port_match() -> None:
    entry = FlowEntry(
        1, "s", "10.0.0.1", (Output(3),), priority=200, ip_proto=6, tcp_src=4, tcp_src_mask=12
    )
    assert entry.match() == {"ipv4_dst": "10.0.0.1", "ip_proto": 6, "tcp_src": (4, 12)}
    assert entry.matches(Packet.tcp("10.0.0.2", "10.0.0.1", 0b0111, 80))
    assert not entry.matches(Packet.tcp("10.0.0.2", "10.0.0.1", 0b1011, 80))
    assert not entry.matches(Packet("10.0.0.1"))
    assert entry.key != FlowEntry(1, "s", "10.0.0.1", (Output(3),), priority=200).key
    full = FlowEntry(1, "s", "10.0.0.1", (), ip_proto=6, tcp_src=4, tcp_src_mask=0xFFFF)
    assert full.tcp_src_mask is None and full.match()["tcp_src"] == 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"tcp_src": 1},  # no ip_proto
        {"ip_proto": 17, "tcp_src": 1},
        {"ip_proto": 6, "tcp_src_mask": 1},
        {"ip_proto": 6, "tcp_src": 3, "tcp_src_mask": 1},
    ],
)
def test_inconsistent_matches_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        FlowEntry(1, "s", "10.0.0.1", (), **kwargs)


def test_selection_method_is_canonical_and_checked() -> None:
    a = SelectionMethod(fields=FIVE_TUPLE_FIELDS, basis=7)
    b = SelectionMethod(fields=tuple(reversed(FIVE_TUPLE_FIELDS)), basis=7)
    assert a == b
    with pytest.raises(ValueError, match="multiple of 4"):
        SelectionMethod(fields=("ipv4_src", "ip_proto"))
    with pytest.raises(ValueError, match="no fields"):
        SelectionMethod(method="dp_hash")
    assert SelectionMethod(method="dp_hash", fields=()).fields == ()


def test_groups_are_checked() -> None:
    with pytest.raises(ValueError, match="watches"):
        GroupEntry(1, "s", 1, GroupType.FAST_FAILOVER, (Bucket((Output(1),)),))
    with pytest.raises(ValueError, match="select group"):
        GroupEntry(1, "s", 1, GroupType.ALL, (), SelectionMethod())
    with pytest.raises(ValueError, match="group id"):
        GroupEntry(1, "s", 0, GroupType.ALL, ())


def test_stable_group_ids_probe_past_other_content() -> None:
    first = stable_group_id("s", (1, 2), {})
    assert first == stable_group_id("s", (1, 2), {first: (1, 2)})
    other = stable_group_id("s", (1, 2), {first: (3, 4)})
    assert other != first and other > 0


def test_follow_resolves_fast_failover_and_select_groups() -> None:
    desc = preset_description("astral-small")
    base = shortest_path_plan(desc)
    tor = desc.fabric.switches["p0r0t0"]
    dst = desc.addresses["p1s0g0"].fabric_ip
    entry = base.lookup(tor.dpid, dst)
    assert entry is not None
    up = sorted({p for e in base.tables[tor.dpid].flows for p in e.out_ports if p > 2})
    assert len(up) == 2
    ff = GroupEntry(
        tor.dpid,
        tor.name,
        5,
        GroupType.FAST_FAILOVER,
        (Bucket((Output(up[0]),), watch_port=up[0]), Bucket((Output(up[1]),), watch_port=up[1])),
    )
    sel = GroupEntry(
        tor.dpid,
        tor.name,
        6,
        GroupType.SELECT,
        tuple(Bucket((Output(p),), watch_port=p) for p in up),
        SelectionMethod(basis=1),
    )
    tables = dict(base.tables)
    flows = [e for e in base.tables[tor.dpid].flows if e.ipv4_dst != dst]
    pinned = FlowEntry(
        tor.dpid, tor.name, dst, (Group(6),), priority=200, ip_proto=6, tcp_src=1, tcp_src_mask=1
    )
    flows += [FlowEntry(tor.dpid, tor.name, dst, (Group(5),)), pinned]
    tables[tor.dpid] = SwitchTable(tor.dpid, tor.name, tuple(flows), (ff, sel))
    plan = ForwardingPlan("test", tables)
    via = {follow(desc, plan, tor.name, dst)[1]}
    assert len(via) == 1
    # The first bucket's port down: the second bucket's agg.
    failed = follow(desc, plan, tor.name, dst, down=[(tor.name, up[0])])[1]
    assert failed not in via
    # An odd source port hits the select group: the path depends on the hash.
    odd = Packet.tcp("10.0.0.1", dst, 1, 80)
    with pytest.raises(RoutingError, match="by hash"):
        follow(desc, plan, tor.name, odd)
    paths = trace_all(desc, plan, tor.name, odd)
    assert {p[1] for p in paths} == via | {failed}
    assert all(p[-1] == "p1s0g0" for p in paths)
    chosen = follow(desc, plan, tor.name, odd, choose=lambda sw, g, live: live[-1])
    assert chosen in paths
    assert follow(desc, plan, tor.name, Packet.tcp("10.0.0.1", dst, 2, 80))[1] in via
