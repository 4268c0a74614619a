"""orchestrator.worker.rto: the workers' minimum RTO is asked for, read back, and reported.

On loopback, in the test's own namespace. Whether this kernel has TCP_RTO_MIN_US is not
assumed: each test asks the kernel directly and checks the module's answer against it, and
checks the floor's effect on a live connection's retransmission timeout (TCP_INFO's
tcpi_rto), which the read-back value alone could not show.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.worker import rto
from orchestrator.worker.launcher import Launcher
from orchestrator.worker.spec import CollectiveTest, LaunchOptions, loopback_workers
from orchestrator.worker.transport import tune

_TCPI_RTO = 8  # struct tcp_info: __u32 tcpi_rto (us), after eight one-byte fields


def kernel_answer() -> int | None:
    """What this kernel says to TCP_RTO_MIN_US on a fresh socket, asked without the module."""
    with socket.socket() as sock:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, 45, 5000)
        except OSError:
            return None
        value: int = sock.getsockopt(socket.IPPROTO_TCP, 45)
        return value


@contextmanager
def connection(tuned: bool) -> Iterator[socket.socket]:
    """A loopback connection that has carried a little data (so the RTO follows an RTT
    sample), its client tuned as a worker's or left alone."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.socket()
        if tuned:
            tune(client, 0)
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        try:
            for _ in range(5):
                client.sendall(b"x" * 1000)
                accepted.recv(1 << 16)
                time.sleep(0.01)
            yield client
        finally:
            accepted.close()
            client.close()


def current_rto_us(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    value: int = struct.unpack_from("I", info, _TCPI_RTO)[0]
    return value


def test_the_probe_reports_what_the_kernel_grants() -> None:
    answer = kernel_answer()
    requested, granted = rto.probe()
    assert requested == rto.RTO_MIN_US == 5000
    if answer is None:  # a kernel without the option: the 200 ms floor holds
        assert granted is None
    else:  # granted in the kernel's clock ticks: at least what was asked, under 200 ms
        assert granted == answer and rto.RTO_MIN_US <= granted < rto.KERNEL_RTO_MIN_US


def test_a_tuned_connection_retransmits_sooner_than_the_kernels_floor() -> None:
    granted = rto.probe()[1]
    with connection(tuned=True) as tuned:
        assert rto.granted_us(tuned) == granted
        tuned_rto = current_rto_us(tuned)
    with connection(tuned=False) as plain:
        assert rto.granted_us(plain) is None  # nothing asked: no floor below 200 ms
        plain_rto = current_rto_us(plain)
    assert plain_rto >= rto.KERNEL_RTO_MIN_US
    if granted is None:
        assert tuned_rto >= rto.KERNEL_RTO_MIN_US
    else:  # the floor plus a loopback RTT: far below the kernel's 200 ms
        assert granted <= tuned_rto < rto.KERNEL_RTO_MIN_US // 4


def test_workers_report_each_connections_floor_to_the_launcher() -> None:
    options = LaunchOptions(warmup=0, iterations=1, channels=2)
    with Launcher(loopback_workers(3), options=options) as launcher:
        result = launcher.run([CollectiveTest("all-reduce", "ring", 1 << 14)])
    result.raise_for_failure()
    assert len(result.connections) == 3 * 2
    assert {c.rto_min_us for c in result.connections} == {rto.probe()[1]}
