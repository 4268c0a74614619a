"""The minimum retransmission timeout of the workers' connections: asked for, and checked.

Why a small one: when a collective's flows converge on a receiver (all-to-all incast) into
the emulated switches' 10 ms queues, a flow can lose the tail of a small transfer, which
only a retransmission timeout recovers, and Linux floors that timeout at 200 ms
(``TCP_RTO_MIN``): a 256 KiB all-to-all took 430 ms instead of about 50. An RDMA NIC
retransmits within milliseconds; :data:`RTO_MIN_US` keeps the floor near that (the RTO
still follows the measured RTT above it).

How: the socket option ``TCP_RTO_MIN_US`` (Linux 6.15 and later) on every connection, before
it connects or right after it is accepted. The kernel keeps the floor in clock ticks, so
what it grants is read back, not assumed: 5000 us is 8000 us on a kernel with HZ=250. A
kernel without the option refuses it; its connections keep the 200 ms floor, the worker
reports no floor for them (:func:`granted_us` is None), ``astral run`` warns and records it
in the bundle's conditions, and ``astral doctor`` warns before any run (it calls
:func:`probe`). docs/environment.md ("The minimum RTO") has the alternatives considered.
"""

from __future__ import annotations

import contextlib
import socket

TCP_RTO_MIN_US = 45  # include/uapi/linux/tcp.h (Linux 6.15 and later)
RTO_MIN_US = 5000  # what the workers ask for (module docstring: why)
KERNEL_RTO_MIN_US = 200_000  # Linux's own floor (TCP_RTO_MIN), kept without the option


def request(sock: socket.socket) -> None:
    """Ask for :data:`RTO_MIN_US` on ``sock``; a kernel that refuses it is not an error
    here: :func:`granted_us` tells whether it took."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US, RTO_MIN_US)


def granted_us(sock: socket.socket) -> int | None:
    """The minimum RTO ``sock`` has below the kernel's own 200 ms floor, in us as the
    kernel rounded it; None where it has none (the kernel lacks the option, or refused the
    value), so the 200 ms floor holds."""
    try:
        value = sock.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US)
    except OSError:
        return None
    return value if value < KERNEL_RTO_MIN_US else None


def probe() -> tuple[int, int | None]:
    """(what the workers ask for, what this kernel grants a new TCP socket or None), in us:
    the real option on a real socket, as a worker sets it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        request(sock)
        return RTO_MIN_US, granted_us(sock)
