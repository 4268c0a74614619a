"""Plan entries <-> OpenFlow messages, both versions, without a switch.

A group-description reply is built from the group-mods the app would send (the same bucket
and property encoding Open vSwitch uses in its reply), parsed by os-ken as a switch's reply
would be, and read back into plan groups.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from os_ken.ofproto import ofproto_parser, ofproto_v1_3, ofproto_v1_5
from os_ken.ofproto.ofproto_protocol import ProtocolDesc

from controllers.openflow import (
    COOKIE,
    decode_selection_method,
    encode_selection_method,
    entry_from_flow_stats,
    fix_os_ken_group_parsing,
    flow_mod,
    group_from_desc,
    group_mod,
)
from controllers.plan import (
    FIVE_TUPLE_FIELDS,
    Bucket,
    FlowEntry,
    Group,
    GroupEntry,
    GroupType,
    Output,
    SelectionMethod,
    SetField,
)
from controllers.ports import PortMap

PORTS = PortMap({"s": {"1": 11, "2": 12, "3": 13}})
SELECT = GroupEntry(
    1,
    "s",
    77,
    GroupType.SELECT,
    (Bucket((Output(1),), watch_port=1), Bucket((Output(2),), weight=3, watch_port=2)),
    SelectionMethod("hash", FIVE_TUPLE_FIELDS, 0xDEADBEEF12345678),
)
FAILOVER = GroupEntry(
    1,
    "s",
    78,
    GroupType.FAST_FAILOVER,
    (
        Bucket(
            (
                SetField("eth_src", "02:a5:ff:ff:ff:fe"),
                SetField("eth_dst", "02:a5:00:00:00:01"),
                Output(1),
            ),
            watch_port=1,
        ),
        Bucket((Output(3),), watch_port=3),
    ),
)


def test_selection_method_round_trips() -> None:
    data = encode_selection_method(SELECT.selection)  # type: ignore[arg-type]
    assert len(data) % 8 == 0
    kind, length, experimenter, exp_type = struct.unpack_from("!HHII", data)
    assert (kind, experimenter, exp_type) == (0xFFFF, 0x154D, 1)
    assert length == 40 + sum(4 + n for n in (2, 1, 1, 4, 4, 2, 2, 2, 2))
    assert decode_selection_method(data[12:length]) == SELECT.selection


def serialized(msg: Any) -> bytes:
    msg.serialize()
    return bytes(msg.buf)


def desc_reply(version: int, groups: list[GroupEntry]) -> Any:
    """A group-description multipart reply carrying ``groups``, parsed by os-ken."""
    dp = ProtocolDesc(version)
    ofp = dp.ofproto
    body = b""
    for group in groups:
        mod = serialized(group_mod(dp, group, ofp.OFPGC_ADD, PORTS))
        if version == ofproto_v1_5.OFP_VERSION:
            bucket_len = struct.unpack_from("!H", mod, 8 + 8)[0]
            buckets = mod[8 + 16 : 8 + 16 + bucket_len]
            props = mod[8 + 16 + bucket_len :]
            entry = struct.pack(
                "!HBxIH6x", 16 + len(buckets) + len(props), mod[10], group.group_id, len(buckets)
            )
            body += entry + buckets + props
        else:
            buckets = mod[8 + 8 :]
            body += struct.pack("!HBxI", 8 + len(buckets), mod[10], group.group_id) + buckets
    header = struct.pack("!BBHI", version, ofp.OFPT_MULTIPART_REPLY, 16 + len(body), 1)
    raw = header + struct.pack("!HH4x", ofp.OFPMP_GROUP_DESC, 0) + body
    return ofproto_parser.msg(None, version, ofp.OFPT_MULTIPART_REPLY, len(raw), 1, raw)


def test_groups_read_back_over_openflow_15() -> None:
    fix_os_ken_group_parsing()
    reply = desc_reply(ofproto_v1_5.OFP_VERSION, [SELECT, FAILOVER])
    assert reply is not None, "os-ken could not parse the reply"
    back = [group_from_desc(s, ofproto_v1_5.OFP_VERSION, 1, "s", PORTS) for s in reply.body]
    assert back == [SELECT, FAILOVER]


def test_groups_read_back_over_openflow_13_lose_the_selection_method() -> None:
    plain = GroupEntry(1, "s", 77, SELECT.type, SELECT.buckets)
    reply = desc_reply(ofproto_v1_3.OFP_VERSION, [plain, FAILOVER])
    back = [group_from_desc(s, ofproto_v1_3.OFP_VERSION, 1, "s", PORTS) for s in reply.body]
    assert back == [plain, FAILOVER]


@pytest.mark.parametrize("version", [ofproto_v1_3.OFP_VERSION, ofproto_v1_5.OFP_VERSION])
def test_flow_entries_round_trip(version: int) -> None:
    dp = ProtocolDesc(version)
    parser = dp.ofproto_parser
    entry = FlowEntry(
        1,
        "s",
        "10.0.1.1",
        (Group(77),),
        priority=200,
        ip_proto=6,
        tcp_src=4,
        tcp_src_mask=12,
        in_port=2,
    )
    mod = flow_mod(dp, entry, dp.ofproto.OFPFC_ADD, PORTS)
    assert mod.match["in_port"] == 12 and mod.match["tcp_src"] == (4, 12)
    # 1.3 replies with flow stats, 1.5 with flow descriptions: the same fields are read.
    record = parser.OFPFlowDesc if version == ofproto_v1_5.OFP_VERSION else parser.OFPFlowStats
    stat = record(
        table_id=0,
        priority=mod.priority,
        cookie=COOKIE,
        match=mod.match,
        instructions=mod.instructions,
    )
    assert entry_from_flow_stats(stat, 1, "s", PORTS) == entry


def test_bucket_ids_follow_the_next_hop_not_the_position() -> None:
    # a re-render without a failed next hop must not renumber the others: OVS scores
    # buckets by hash(bucket_id, flow hash), so a new id would move healthy flows
    three = GroupEntry(1, "s", 77, GroupType.SELECT, tuple(Bucket((Output(p),)) for p in (1, 2, 3)))
    two = GroupEntry(1, "s", 77, GroupType.SELECT, (Bucket((Output(1),)), Bucket((Output(3),))))
    dp = ProtocolDesc(ofproto_v1_5.OFP_VERSION)
    ids = []
    for group in (three, two):
        mod = group_mod(dp, group, dp.ofproto.OFPGC_ADD, PORTS)
        ids.append([bucket.bucket_id for bucket in mod.buckets])
    assert ids == [[1, 2, 3], [1, 3]]
    same_port = GroupEntry(1, "s", 78, GroupType.ALL, (Bucket((Output(1),)), Bucket((Output(1),))))
    assert same_port.bucket_ids() == [0, 1]  # not distinct: positions
