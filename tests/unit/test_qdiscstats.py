"""The netlink qdisc reader against ``tc``'s own reading, and on bytes it was not given
by the kernel (a malformed or foreign message)."""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess

import pytest

from orchestrator.emulation import qdiscstats
from orchestrator.emulation.qdiscstats import (
    NLMSG_DONE,
    RTM_NEWQDISC,
    TC_H_ROOT,
    dump,
    open_socket,
    parse_messages,
)


def _tc() -> list[dict[str, object]]:
    done = subprocess.run(
        ["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True, check=True
    )
    return list(json.loads(done.stdout))


@pytest.mark.skipif(shutil.which("tc") is None, reason="tc (iproute2) is not installed")
def test_the_dump_reads_what_tc_reads_in_the_same_namespace() -> None:
    """Every root qdisc tc lists, the dump lists, with its kind, and counters between
    tc's reading before and after (this namespace's traffic goes on meanwhile)."""
    names = {index: name for index, name in socket.if_nameindex()}
    before = {q["dev"]: q for q in _tc() if q.get("root")}
    with open_socket() as sock:
        read = {names[q.ifindex]: q for q in dump(sock) if q.root and q.ifindex in names}
    after = {q["dev"]: q for q in _tc() if q.get("root")}
    assert read and set(read) == set(before) == set(after)
    for dev, q in read.items():
        assert q.kind == before[dev]["kind"]
        for field in ("bytes", "packets", "drops"):
            assert before[dev][field] <= getattr(q, field) <= after[dev][field], (dev, field)


def _message(kind: int, seq: int, body: bytes) -> bytes:
    length = 16 + len(body)
    padded = body + b"\0" * (-length % 4)
    return struct.pack("=IHHII", length, kind, 2, seq, 0) + padded


def _attr(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def test_a_root_qdiscs_counters_are_parsed_and_other_answers_skipped() -> None:
    """A root HTB with its basic and queue statistics (nested, NLA_F_NESTED set as the
    kernel sets it); an answer to an earlier request is skipped; DONE ends the dump."""
    stats = _attr(1, struct.pack("=QI4x", 123_456, 789)) + _attr(
        3, struct.pack("=IIIII", 7, 10_500, 42, 0, 3)
    )
    body = struct.pack("=BxxxiIII", 0, 5, 0x10000, TC_H_ROOT, 1)
    body += _attr(1, b"htb\0") + _attr(7 | 0x8000, stats)
    data = _message(RTM_NEWQDISC, 8, body) + _message(RTM_NEWQDISC, 7, body)
    found, done = parse_messages(data + _message(NLMSG_DONE, 8, b"\0" * 4), 8)
    assert done and found == [
        qdiscstats.QdiscStats(5, 0x10000, TC_H_ROOT, "htb", 123_456, 789, 42, 10_500, 7)
    ]
    assert found[0].root
    # cut short: what is whole is read, the rest left, and the dump is not over
    found, done = parse_messages(data[:-3], 8)
    assert not done and len(found) == 1
    found, done = parse_messages(_message(RTM_NEWQDISC, 8, body)[:-3], 8)
    assert not done and not found
    with pytest.raises(OSError):
        parse_messages(_message(2, 9, struct.pack("=i", -1) + b"\0" * 16), 9)
