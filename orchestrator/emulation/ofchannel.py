"""One OpenFlow connection to a bridge, held open, for changes that must land on time.

A blackhole fault is a few OpenFlow entries on one switch. ``ovs-ofctl add-flows`` puts them
there in 16-60 ms on an idle fabric here, and in over 200 ms while shaped traffic keeps
ovs-vswitchd's main thread busy: a process to start, a connection to open and a version to
negotiate, each waiting for that thread, before the one message that matters. A fault due
at an instant cannot afford that. :class:`OpenFlowChannel` opens the bridge's management
socket (``<OVS rundir>/<bridge>.mgmt``, the one ``ovs-ofctl`` itself uses) and says hello
ahead of time; at the fault's instant it only sends the flow-mods with a barrier after them
and waits for the barrier's reply, 1-3 ms measured on the same fabric.

The messages are os-ken's OpenFlow 1.3 encoders (the same library the controller speaks
with), built without a datapath: :class:`os_ken.ofproto.ofproto_protocol.ProtocolDesc`
gives them the version. What the switch answers is read as plain OpenFlow headers; an
``ERROR`` before the barrier's reply fails the request with its type and code.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from os_ken.ofproto.ofproto_protocol import ProtocolDesc

from topologies.errors import EmulationError

OVS_RUNDIR = Path(os.environ.get("OVS_RUNDIR", "/var/run/openvswitch"))
HEADER = struct.Struct("!BBHI")  # version, type, length, xid
ALL_COOKIE_BITS = 0xFFFF_FFFF_FFFF_FFFF
_PROTOCOL = ProtocolDesc(ofp.OFP_VERSION)


def blackhole_messages(addresses: Sequence[str], cookie: int, priority: int) -> list[Any]:
    """Per address, an entry in table 0 dropping IPv4 to it (no instructions: drop), with
    the fault's cookie, at ``priority``: what ``blackhole_commands`` writes for ovs-ofctl."""
    return [
        parser.OFPFlowMod(
            _PROTOCOL,
            cookie=cookie,
            table_id=0,
            command=ofp.OFPFC_ADD,
            priority=priority,
            match=parser.OFPMatch(eth_type=0x0800, ipv4_dst=address),
            instructions=[],
        )
        for address in addresses
    ]


def cookie_removal_message(cookie: int) -> Any:
    """Delete, in every table, exactly the entries whose cookie is ``cookie`` (all 64 bits)."""
    return parser.OFPFlowMod(
        _PROTOCOL,
        cookie=cookie,
        cookie_mask=ALL_COOKIE_BITS,
        table_id=ofp.OFPTT_ALL,
        command=ofp.OFPFC_DELETE,
        out_port=ofp.OFPP_ANY,
        out_group=ofp.OFPG_ANY,
        match=parser.OFPMatch(),
    )


class OpenFlowChannel:
    """A held OpenFlow 1.3 connection to one bridge (see the module docstring)."""

    def __init__(self, bridge: str, rundir: Path = OVS_RUNDIR, timeout: float = 5.0) -> None:
        self.bridge = bridge
        self.path = rundir / f"{bridge}.mgmt"
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._xid = 0
        self._buffer = b""

    def open(self) -> OpenFlowChannel:
        """Connect and exchange hellos (a no-op when already open)."""
        if self._sock is not None:
            return self
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except OSError as error:
            sock.close()
            raise EmulationError(
                f"cannot open an OpenFlow connection to switch {self.bridge} ({self.path}): {error}"
            ) from error
        self._sock, self._buffer = sock, b""
        try:
            self._send([parser.OFPHello(_PROTOCOL)])
            kind, _, _ = self._receive()
        except BaseException:
            self.close()
            raise
        if kind != ofp.OFPT_HELLO:
            self.close()
            raise EmulationError(f"switch {self.bridge} answered hello with message {kind}")
        return self

    def request(self, messages: Sequence[Any]) -> float:
        """Send ``messages`` and a barrier; return once the switch has done them (the
        epoch instant its barrier reply arrived). An error message fails the request; a
        connection the switch closed meanwhile is opened again once."""
        for attempt in (1, 2):
            self.open()
            try:
                return self._request(messages)
            except (ConnectionError, BrokenPipeError) as error:
                self.close()
                if attempt == 2:
                    raise EmulationError(
                        f"OpenFlow connection to switch {self.bridge} lost: {error}"
                    ) from error
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def __enter__(self) -> OpenFlowChannel:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, messages: Sequence[Any]) -> float:
        barrier = self._send([*messages, parser.OFPBarrierRequest(_PROTOCOL)])
        deadline = time.monotonic() + self.timeout
        while True:
            kind, xid, body = self._receive(deadline)
            if kind == ofp.OFPT_ERROR:
                error_type, code = struct.unpack_from("!HH", body)
                raise EmulationError(
                    f"switch {self.bridge} refused an OpenFlow request: error type "
                    f"{error_type}, code {code}"
                )
            if kind == ofp.OFPT_ECHO_REQUEST:
                self._send_raw(HEADER.pack(ofp.OFP_VERSION, ofp.OFPT_ECHO_REPLY, 8, xid))
            elif kind == ofp.OFPT_BARRIER_REPLY and xid == barrier:
                return time.time()

    def _send(self, messages: Sequence[Any]) -> int:
        """Encode and send ``messages`` in one write; returns the last one's xid."""
        data = b""
        for message in messages:
            self._xid = self._xid % 0xFFFF_FFFF + 1
            message.set_xid(self._xid)
            message.serialize()
            data += bytes(message.buf)
        self._send_raw(data)
        return self._xid

    def _send_raw(self, data: bytes) -> None:
        assert self._sock is not None
        self._sock.sendall(data)

    def _receive(self, deadline: float | None = None) -> tuple[int, int, bytes]:
        """The next message: its type, xid and body."""
        while True:
            if len(self._buffer) >= HEADER.size:
                _, kind, length, xid = HEADER.unpack_from(self._buffer)
                if length < HEADER.size:
                    raise EmulationError(f"switch {self.bridge} sent a malformed message")
                if len(self._buffer) >= length:
                    body = self._buffer[HEADER.size : length]
                    self._buffer = self._buffer[length:]
                    return kind, xid, body
            self._fill(deadline)

    def _fill(self, deadline: float | None) -> None:
        assert self._sock is not None
        left = self.timeout if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise EmulationError(
                f"switch {self.bridge} did not answer an OpenFlow request in {self.timeout:g} s"
            )
        self._sock.settimeout(left)
        try:
            data = self._sock.recv(1 << 16)
        except TimeoutError:
            raise EmulationError(
                f"switch {self.bridge} did not answer an OpenFlow request in {self.timeout:g} s"
            ) from None
        if not data:
            raise ConnectionError("closed by the switch")
        self._buffer += data
