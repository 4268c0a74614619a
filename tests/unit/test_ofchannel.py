"""The held OpenFlow connection of blackhole faults: what it encodes, read back by os-ken's
own parser, and how it answers a switch's error and a closed connection (a local socket
peer that speaks the OpenFlow headers; the real switch is in tests/integration/test_faults.py).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto.ofproto_protocol import ProtocolDesc

from controllers.plan import FAULT_PRIORITY
from orchestrator.emulation.faults import fault_cookie
from orchestrator.emulation.ofchannel import (
    HEADER,
    OpenFlowChannel,
    blackhole_messages,
    cookie_removal_message,
)
from topologies.errors import EmulationError


def decoded(message: object) -> object:
    message.serialize()  # type: ignore[attr-defined]
    data = bytes(message.buf)  # type: ignore[attr-defined]
    version, kind, length, xid = HEADER.unpack_from(data)
    return ofproto_parser.msg(ProtocolDesc(ofp.OFP_VERSION), version, kind, length, xid, data)


def test_a_blackhole_is_one_drop_entry_per_address_above_every_policy() -> None:
    cookie = fault_cookie(3)
    entries = [decoded(m) for m in blackhole_messages(["10.1.0.5", "10.1.1.5"], cookie, 1000)]
    assert [e.match["ipv4_dst"] for e in entries] == ["10.1.0.5", "10.1.1.5"]  # type: ignore[attr-defined]
    for e in entries:
        assert (e.cookie, e.priority, e.table_id, e.command) == (cookie, 1000, 0, ofp.OFPFC_ADD)  # type: ignore[attr-defined]
        assert e.match["eth_type"] == 0x0800 and e.instructions == []  # type: ignore[attr-defined]
    removal = decoded(cookie_removal_message(cookie))
    assert (removal.cookie, removal.cookie_mask) == (cookie, (1 << 64) - 1)  # type: ignore[attr-defined]
    assert (removal.table_id, removal.command) == (ofp.OFPTT_ALL, ofp.OFPFC_DELETE)  # type: ignore[attr-defined]
    assert FAULT_PRIORITY == 1000


def serve(path: Path, answer: Callable[[socket.socket, list[tuple[int, int]]], None]) -> None:
    """A peer on ``path`` that says hello and hands every later message to ``answer``."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)

    def run() -> None:
        conn, _ = server.accept()
        with conn, server:
            buffer = b""
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    return
                buffer += data
                seen = []
                while len(buffer) >= 8:
                    _, kind, length, xid = HEADER.unpack_from(buffer)
                    if len(buffer) < length:
                        break
                    buffer = buffer[length:]
                    seen.append((kind, xid))
                for kind, xid in seen:
                    if kind == ofp.OFPT_HELLO:
                        conn.sendall(HEADER.pack(4, ofp.OFPT_HELLO, 8, xid))
                answer(conn, [s for s in seen if s[0] != ofp.OFPT_HELLO])

    threading.Thread(target=run, daemon=True).start()


def test_the_barrier_reply_ends_a_request_and_an_error_before_it_fails_it(tmp_path: Path) -> None:
    flow_mods = []

    def answer(conn: socket.socket, seen: list[tuple[int, int]]) -> None:
        for kind, xid in seen:
            flow_mods.extend([xid] if kind == ofp.OFPT_FLOW_MOD else [])
            if kind == ofp.OFPT_FLOW_MOD and len(flow_mods) == 2:  # the second request's
                conn.sendall(HEADER.pack(4, ofp.OFPT_ERROR, 12, xid) + struct.pack("!HH", 5, 1))
            if kind == ofp.OFPT_BARRIER_REQUEST:
                conn.sendall(HEADER.pack(4, ofp.OFPT_BARRIER_REPLY, 8, xid))

    serve(tmp_path / "s1.mgmt", answer)
    with OpenFlowChannel("s1", rundir=tmp_path, timeout=2.0) as channel:
        channel.request(blackhole_messages(["10.0.0.1"], fault_cookie(1), 1000))
        with pytest.raises(EmulationError, match=r"switch s1 refused .* type 5, code 1"):
            channel.request(blackhole_messages(["10.0.0.1"], fault_cookie(1), 1000))


def test_a_switch_that_does_not_answer_or_is_not_there_is_an_error_naming_it(
    tmp_path: Path,
) -> None:
    serve(tmp_path / "s2.mgmt", lambda conn, seen: None)  # never answers a barrier
    channel = OpenFlowChannel("s2", rundir=tmp_path, timeout=0.3)
    with channel, pytest.raises(EmulationError, match="switch s2 did not answer"):
        channel.request([cookie_removal_message(fault_cookie(2))])
    with pytest.raises(EmulationError, match="cannot open an OpenFlow connection to switch s3"):
        OpenFlowChannel("s3", rundir=tmp_path).open()
