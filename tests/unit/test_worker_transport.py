"""orchestrator.worker.transport: closing leaves no TIME_WAIT, so a pinned five-tuple can be
opened again at once (on loopback, in the test's own namespace)."""

from __future__ import annotations

import socket
from pathlib import Path

from orchestrator.worker.transport import Connection, ConnectionKey

TIME_WAIT = "06"  # the st column of /proc/net/tcp


LOOPBACK = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it


def _time_wait_ports(remote_port: int) -> set[int]:
    """Local ports of 127.0.0.1 with a connection to 127.0.0.1:``remote_port`` in
    TIME_WAIT: this test's five-tuples only (the other tests' loopback workers use
    127.0.1.x and pinned ports, and their closed connections' TIME_WAIT is theirs)."""
    ports = set()
    remote = f"{LOOPBACK}:{remote_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, port = fields[1].split(":")
        if fields[3] == TIME_WAIT and address == LOOPBACK and fields[2] == remote:
            ports.add(int(port, 16))
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
            assert src_port not in _time_wait_ports(server.getsockname()[1])
    finally:
        server.close()
