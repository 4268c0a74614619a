"""Plan entries <-> OpenFlow messages (os-ken), for OpenFlow 1.3 and 1.5 connections.

The app (:mod:`controllers.app`) negotiates OpenFlow 1.3 and 1.5 with each switch and uses
whichever the switch speaks (the highest both do). Everything version-specific lives here:

- **Flows** are the same in both versions, except that reading a table back is an
  ``OFPFlowStatsRequest`` in 1.3 and an ``OFPFlowDescStatsRequest`` in 1.5 (1.5 moved the
  cookie and instructions to "flow description"; Open vSwitch answers the 1.5 flow-stats
  request type 1 with descriptions). :func:`flow_table_request` picks the right one; both
  replies carry ``cookie``, ``table_id``, ``priority``, ``match`` and ``instructions``,
  which is all :func:`entry_from_flow_stats` reads.
- **Groups**: a bucket's weight and watched port are fields in 1.3 and properties in 1.5.
  Only 1.5 can carry Open vSwitch's selection method for select groups: the Netronome
  experimenter group property (``NTR_VENDOR_ID`` 0x0000154d, ``NTRT_SELECTION_METHOD`` 1;
  Open vSwitch include/openflow/netronome-ext.h, lib/ofp-group.c)::

      be16 type = 0xffff (OFPGPT_EXPERIMENTER)   be16 length (without trailing padding)
      be32 experimenter = 0x0000154d             be32 exp_type = 1
      be32 pad                                   char selection_method[16] ("hash\\0...")
      be64 selection_method_param (the basis)
      OXM headers with full-mask payloads (the hashed fields), then zeros to 8 bytes

  Over an OpenFlow 1.3 connection a select group falls back to the switch's default
  method (``dp_hash`` in Open vSwitch >= 2.10); the app logs it once per switch.
- **Packet-out**: 1.3 names the input port as a field, 1.5 as a match.

Port numbers are translated with :class:`~controllers.ports.PortMap` (plans use model
ports, switches OpenFlow ports).
"""

from __future__ import annotations

import struct
from typing import Any

from os_ken.lib.packet import ether_types
from os_ken.ofproto import ofproto_v1_3, ofproto_v1_5, ofproto_v1_5_parser

from controllers.plan import (
    ARP_PRIORITY,
    MATCH_FIELDS,
    OXM_FIELD_BYTES,
    Action,
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

# Every entry the controller installs carries this cookie (a5 = "astral").
COOKIE = 0xA5A5_0000_0000_0001

OFP13 = ofproto_v1_3.OFP_VERSION
OFP15 = ofproto_v1_5.OFP_VERSION
OFP_VERSIONS = [OFP13, OFP15]

NTR_VENDOR_ID = 0x0000154D
NTRT_SELECTION_METHOD = 1
NTR_MAX_SELECTION_METHOD_LEN = 16
OXM_CLASS_OPENFLOW_BASIC = 0x8000
# OpenFlow basic OXM field numbers of the fields a selection method may hash.
OXM_FIELD_NUMBERS = {
    "in_port": 0,
    "eth_type": 5,
    "ip_dscp": 8,
    "ip_ecn": 9,
    "ip_proto": 10,
    "ipv4_src": 11,
    "ipv4_dst": 12,
    "tcp_src": 13,
    "tcp_dst": 14,
    "udp_src": 15,
    "udp_dst": 16,
}
OXM_FIELD_NAMES = {number: name for name, number in OXM_FIELD_NUMBERS.items()}
# Each hashed field's payload is its mask: all ones (Open vSwitch refuses anything else for
# fields it cannot mask, such as ip_dscp, even where the field is narrower than its bytes).

GROUP_TYPES = {
    GroupType.ALL: 0,
    GroupType.SELECT: 1,
    GroupType.INDIRECT: 2,
    GroupType.FAST_FAILOVER: 3,
}
GROUP_TYPE_NAMES = {number: kind for kind, number in GROUP_TYPES.items()}


# --- an os-ken 4.2 defect, fixed at run time ---------------------------------------------------


def fix_os_ken_group_parsing() -> None:
    """Make os-ken's OpenFlow 1.5 group-description parser read what Open vSwitch sends.

    os-ken 4.2.2's ``OFPBucket.parser`` and ``OFPGroupDescStats.parser`` (ofproto_v1_5_parser)
    slice a bucket's (a group's) properties as ``buf[offset : offset + length]`` *after*
    advancing ``offset`` past the header and actions, so the slice runs into the next bucket
    (group) and parsing its header as a property raises: os-ken logs "Encountered an error
    while parsing OpenFlow packet" and drops the whole reply, and a restarted controller
    would never learn the switch's groups. The replacements slice from the record's start.
    Called by the app when it starts (explicitly, not on import); idempotent.
    """
    parser = ofproto_v1_5_parser
    if getattr(parser.OFPBucket, "_astral_fixed", False):
        return

    def bucket_parser(cls: Any, buf: Any, offset: int) -> Any:
        msg = cls()
        start = offset
        (msg.len, msg.action_array_len, msg.bucket_id) = struct.unpack_from(
            ofproto_v1_5.OFP_BUCKET_PACK_STR, buf, offset
        )
        offset += ofproto_v1_5.OFP_BUCKET_SIZE
        action_buf = buf[offset : offset + msg.action_array_len]
        msg.actions = []
        while action_buf:
            action = parser.OFPAction.parser(action_buf, 0)
            msg.actions.append(action)
            action_buf = action_buf[action.len :]
        offset += msg.action_array_len
        rest = buf[offset : start + msg.len]
        msg.properties = []
        while rest:
            prop, rest = parser.OFPGroupBucketProp.parse(rest)
            msg.properties.append(prop)
        return msg

    def group_desc_parser(cls: Any, buf: Any, offset: int) -> Any:
        stats = cls()
        start = offset
        (stats.length, stats.type, stats.group_id, stats.bucket_array_len) = struct.unpack_from(
            ofproto_v1_5.OFP_GROUP_DESC_STATS_PACK_STR, buf, offset
        )
        offset += ofproto_v1_5.OFP_GROUP_DESC_STATS_SIZE
        bucket_buf = buf[offset : offset + stats.bucket_array_len]
        stats.buckets = []
        while bucket_buf:
            bucket = parser.OFPBucket.parser(bucket_buf, 0)
            stats.buckets.append(bucket)
            bucket_buf = bucket_buf[bucket.len :]
        offset += stats.bucket_array_len
        rest = buf[offset : start + stats.length]
        stats.properties = []
        while rest:
            prop, rest = parser.OFPGroupProp.parse(rest)
            stats.properties.append(prop)
        return stats

    parser.OFPBucket.parser = classmethod(bucket_parser)
    parser.OFPGroupDescStats.parser = classmethod(group_desc_parser)
    parser.OFPBucket._astral_fixed = True


# --- the selection method property ---------------------------------------------------------


def encode_selection_method(selection: SelectionMethod) -> bytes:
    """The NTR selection-method group property, padded to 8 bytes (layout above)."""
    oxms = bytearray()
    for name in selection.fields:
        size = OXM_FIELD_BYTES[name]
        header = (OXM_CLASS_OPENFLOW_BASIC << 16) | (OXM_FIELD_NUMBERS[name] << 9) | size
        oxms += struct.pack("!I", header) + b"\xff" * size
    method = selection.method.encode("ascii").ljust(NTR_MAX_SELECTION_METHOD_LEN, b"\0")
    length = 40 + len(oxms)
    prop = struct.pack(
        "!HHIII16sQ",
        ofproto_v1_5.OFPGPT_EXPERIMENTER,
        length,
        NTR_VENDOR_ID,
        NTRT_SELECTION_METHOD,
        0,
        method,
        selection.basis,
    )
    prop += bytes(oxms)
    return prop + b"\0" * (-len(prop) % 8)


def decode_selection_method(payload: bytes) -> SelectionMethod:
    """A :class:`SelectionMethod` from the property's bytes after exp_type (pad onward).

    Raises ValueError for what this controller would not have installed.
    """
    if len(payload) < 28:
        raise ValueError("selection method property too short")
    method = payload[4:20].split(b"\0", 1)[0].decode("ascii")
    (basis,) = struct.unpack_from("!Q", payload, 20)
    fields = []
    rest = payload[28:]
    while len(rest) >= 4:
        (header,) = struct.unpack_from("!I", rest)
        if header == 0:  # padding
            break
        oxm_class, number, size = header >> 16, (header >> 9) & 0x7F, header & 0xFF
        name = OXM_FIELD_NAMES.get(number) if oxm_class == OXM_CLASS_OPENFLOW_BASIC else None
        if name is None or OXM_FIELD_BYTES[name] != size or header & 0x100:
            raise ValueError(f"unexpected hash field OXM header {header:#010x}")
        if rest[4 : 4 + size] != b"\xff" * size:
            raise ValueError(f"hash field {name} with a partial mask {rest[4 : 4 + size]!r}")
        fields.append(name)
        rest = rest[4 + size :]
    return SelectionMethod(method, tuple(fields), basis)


class NtrSelectionMethodProp(ofproto_v1_5_parser.OFPGroupProp):
    """The selection method as an os-ken OpenFlow 1.5 group property (serialize only).

    Reading it back goes through os-ken's ``OFPGroupPropExperimenter`` (4-byte words of
    data), hence SelectionMethod's rule that the field list is a multiple of 4 bytes.
    """

    def __init__(self, selection: SelectionMethod) -> None:
        super().__init__(ofproto_v1_5.OFPGPT_EXPERIMENTER)
        self.selection = selection

    def serialize(self) -> bytearray:
        data = encode_selection_method(self.selection)
        self.length = struct.unpack_from("!H", data, 2)[0]
        return bytearray(data)


def selection_from_properties(properties: list[Any]) -> SelectionMethod | None:
    """The selection method among a 1.5 group description's properties, if any."""
    for prop in properties:
        if (
            getattr(prop, "experimenter", None) == NTR_VENDOR_ID
            and getattr(prop, "exp_type", None) == NTRT_SELECTION_METHOD
        ):
            payload = b"".join(struct.pack("!I", word) for word in prop.data)
            return decode_selection_method(payload)
    return None


# --- flows ---------------------------------------------------------------------------------


def ofp_actions(parser: Any, switch: str, actions: tuple[Action, ...], ports: PortMap) -> list[Any]:
    result: list[Any] = []
    for action in actions:
        if isinstance(action, SetField):
            result.append(parser.OFPActionSetField(**{action.field: action.value}))
        elif isinstance(action, Output):
            result.append(parser.OFPActionOutput(ports.ofport(switch, action.port)))
        elif isinstance(action, Group):
            result.append(parser.OFPActionGroup(action.group_id))
        else:  # pragma: no cover - a new action type without support here
            raise TypeError(f"cannot install action {action!r}")
    return result


def ofp_match(parser: Any, entry: FlowEntry, ports: PortMap) -> Any:
    fields: dict[str, Any] = dict(entry.match())
    if "in_port" in fields:
        fields["in_port"] = ports.ofport(entry.switch, entry.in_port or 0)
    return parser.OFPMatch(eth_type=ether_types.ETH_TYPE_IP, **fields)


def flow_mod(dp: Any, entry: FlowEntry, command: int, ports: PortMap, cookie: int = COOKIE) -> Any:
    """The flow-mod that adds (modifies, deletes) ``entry``; deletes are strict, by cookie."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    match = ofp_match(parser, entry, ports)
    if command in (ofp.OFPFC_DELETE, ofp.OFPFC_DELETE_STRICT):
        return parser.OFPFlowMod(
            dp,
            cookie=cookie,
            cookie_mask=0xFFFF_FFFF_FFFF_FFFF,
            command=command,
            priority=entry.priority,
            out_port=ofp.OFPP_ANY,
            out_group=ofp.OFPG_ANY,
            match=match,
        )
    actions = ofp_actions(parser, entry.switch, entry.actions, ports)
    return parser.OFPFlowMod(
        dp,
        cookie=cookie,
        command=command,
        priority=entry.priority,
        match=match,
        instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)],
    )


def flow_table_request(dp: Any) -> Any:
    """Ask for every flow entry with its cookie and instructions (1.3 stats, 1.5 desc)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    cls = parser.OFPFlowDescStatsRequest if ofp.OFP_VERSION >= OFP15 else parser.OFPFlowStatsRequest
    return cls(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch())


def actions_from_ofp(ofp_actions: list[Any], switch: str, ports: PortMap) -> tuple[Action, ...]:
    """Plan actions from os-ken action objects; ValueError for one a plan never has."""
    actions: list[Action] = []
    for action in ofp_actions:
        if getattr(action, "key", None) in ("eth_src", "eth_dst"):
            actions.append(SetField(action.key, str(action.value)))
        elif hasattr(action, "port") and hasattr(action, "max_len"):
            actions.append(Output(ports.model_port(switch, action.port)))
        elif hasattr(action, "group_id") and not hasattr(action, "port"):
            actions.append(Group(int(action.group_id)))
        else:
            raise ValueError(f"unexpected action {action!r}")
    return tuple(actions)


def entry_from_flow_stats(
    stat: Any, dpid: int, switch: str, ports: PortMap, cookie: int = COOKIE
) -> FlowEntry | None:
    """The plan entry a flow-stats (1.3) or flow-desc (1.5) record describes, if it is one
    this controller would install: its cookie, table 0, an IPv4 match with an exact
    ``ipv4_dst`` and only fields plans use, one apply-actions instruction.
    """
    match = dict(stat.match.items())
    if (
        stat.cookie != cookie
        or stat.table_id != 0
        or stat.priority <= ARP_PRIORITY
        or match.pop("eth_type", None) != ether_types.ETH_TYPE_IP
        or not isinstance(match.get("ipv4_dst"), str)  # a (value, mask) pair is not ours
        or not set(match) <= set(MATCH_FIELDS)
        or len(stat.instructions) != 1
        or not hasattr(stat.instructions[0], "actions")
    ):
        return None
    fields: dict[str, Any] = {}
    for name, value in match.items():
        if isinstance(value, tuple):
            if name not in ("tcp_src", "tcp_dst", "udp_src", "udp_dst"):
                return None
            fields[name], fields[name + "_mask"] = int(value[0]), int(value[1])
        elif name == "in_port":
            fields[name] = ports.model_port(switch, int(value))
        else:
            fields[name] = value
    try:
        actions = actions_from_ofp(stat.instructions[0].actions, switch, ports)
        return FlowEntry(dpid, switch, actions=actions, priority=stat.priority, **fields)
    except (ValueError, TypeError):
        return None


# --- groups --------------------------------------------------------------------------------


def group_mod(dp: Any, group: GroupEntry, command: int, ports: PortMap) -> Any:
    """The group-mod that adds (or modifies) ``group``: buckets, weights, watched ports and,
    over OpenFlow 1.5, the selection method.
    """
    ofp, parser = dp.ofproto, dp.ofproto_parser
    gtype = GROUP_TYPES[group.type]
    select = group.type is GroupType.SELECT
    buckets = []
    for bucket_id, bucket in zip(group.bucket_ids(), group.buckets, strict=True):
        actions = ofp_actions(parser, group.switch, bucket.actions, ports)
        watch = (
            ofp.OFPP_ANY
            if bucket.watch_port is None
            else ports.ofport(group.switch, bucket.watch_port)
        )
        if ofp.OFP_VERSION >= OFP15:
            props = []
            if select:
                props.append(
                    parser.OFPGroupBucketPropWeight(type_=ofp.OFPGBPT_WEIGHT, weight=bucket.weight)
                )
            if bucket.watch_port is not None:
                props.append(
                    parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=watch)
                )
            buckets.append(parser.OFPBucket(bucket_id=bucket_id, actions=actions, properties=props))
        else:
            weight = bucket.weight if select else 0
            buckets.append(parser.OFPBucket(weight, watch, ofp.OFPG_ANY, actions))
    if ofp.OFP_VERSION >= OFP15:
        properties = [NtrSelectionMethodProp(group.selection)] if group.selection else []
        return parser.OFPGroupMod(
            dp, command, gtype, group.group_id, buckets=buckets, properties=properties
        )
    return parser.OFPGroupMod(dp, command, gtype, group.group_id, buckets)


def group_delete(dp: Any, group_id: int) -> Any:
    """Delete group ``group_id`` (OFPG_ALL: every group). The switch also deletes the flows
    that point at it, so delete a group only after its flows were changed.
    """
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, type_=0, group_id=group_id)


def group_from_desc(
    stat: Any, version: int, dpid: int, switch: str, ports: PortMap
) -> GroupEntry | None:
    """The plan group a group-description record describes, None if it is none of ours
    (an unknown type, action or hash field).
    """
    kind = GROUP_TYPE_NAMES.get(stat.type)
    if kind is None:
        return None
    any_port = ofproto_v1_5.OFPP_ANY  # the same value in 1.3
    buckets = []
    try:
        for raw in stat.buckets:
            actions = actions_from_ofp(raw.actions, switch, ports)
            if version >= OFP15:
                weight, watch = 1, any_port
                for prop in raw.properties:
                    if prop.type == ofproto_v1_5.OFPGBPT_WEIGHT:
                        weight = prop.weight
                    elif prop.type == ofproto_v1_5.OFPGBPT_WATCH_PORT:
                        watch = prop.watch
            else:
                weight, watch = raw.weight, raw.watch_port
            buckets.append(
                Bucket(
                    actions,
                    weight=weight if kind is GroupType.SELECT else 1,
                    watch_port=None if watch == any_port else ports.model_port(switch, watch),
                )
            )
        selection = (
            selection_from_properties(stat.properties)
            if version >= OFP15 and kind is GroupType.SELECT
            else None
        )
        return GroupEntry(dpid, switch, int(stat.group_id), kind, tuple(buckets), selection)
    except (ValueError, TypeError, struct.error):
        return None


def group_table_request(dp: Any) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPGroupDescStatsRequest(dp, 0, ofp.OFPG_ALL)


# --- packets -------------------------------------------------------------------------------


def packet_out(dp: Any, out_port: int, data: bytes) -> Any:
    """Send ``data`` out of OpenFlow port ``out_port``, from the controller."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    actions = [parser.OFPActionOutput(out_port)]
    if ofp.OFP_VERSION >= OFP15:
        return parser.OFPPacketOut(
            dp,
            buffer_id=ofp.OFP_NO_BUFFER,
            match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
            actions=actions,
            data=data,
        )
    return parser.OFPPacketOut(
        dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER, actions=actions, data=data
    )
