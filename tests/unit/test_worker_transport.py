"""orchestrator.worker.transport: closing leaves no TIME_WAIT, so a pinned five-tuple can be
opened again at once (on loopback, in the test's own namespace)."""

from __future__ import annotations

import socket
from pathlib import Path

from orchestrator.worker.transport import Connection, ConnectionKey

TIME_WAIT = "06"  # the st column of /proc/net/tcp


def _time_wait_ports() -> set[int]:
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == TIME_WAIT:
            ports.add(int(fields[1].split(":")[1], 16))
    return ports


def _pair(server: socket.socket, src_port: int) -> tuple[socket.socket, socket.socket]:
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    client.bind(("127.0.0.1", src_port))
    client.connect(server.getsockname())
    accepted, _ = server.accept()
    return client, accepted


def test_closing_a_connection_leaves_no_time_wait_and_the_tuple_is_reusable() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    src_port = probe.getsockname()[1]
    probe.close()
    try:
        for _ in range(2):  # the second round opens the very same five-tuple
            client, accepted = _pair(server, src_port)
            ends = [
                Connection(ConnectionKey(0, 1), client, "fabric", outgoing=True, index=0),
                Connection(ConnectionKey(0, 1), accepted, "fabric", outgoing=False, index=0),
            ]
            ends[0].sock.sendall(b"x")
            assert ends[1].sock.recv(1) == b"x"
            for end in ends:
                end.close()
            assert src_port not in _time_wait_ports()
    finally:
        server.close()
