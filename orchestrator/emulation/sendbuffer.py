"""Give ovs-vswitchd's packet-sending socket a send buffer deep enough for the fabric.

Why (docs/fidelity.md, "Open vSwitch drops what does not fit one send buffer"): the
userspace datapath sends on every port of every bridge through *one* unbound AF_PACKET
socket. Packets waiting in the ports' egress qdiscs (our shapers) stay charged to that
socket until they leave, so once all queued packets together exceed its send buffer
(``net.core.wmem_default`` when ovs-vswitchd started, 208 kB on Debian and Ubuntu)
``sendmmsg`` fails with EAGAIN and ovs-vswitchd drops the packet, on whatever port it was
sending to. Nothing counts the drop but a rate-limited
log line (``error sending Ethernet packet on X: Resource temporarily unavailable``). Two
congested 100 Mbit/s ports, or eight 20 Mbit/s ones, are enough; a congested all-to-all has
more. Measured: an unrelated flow fell to 0.04-0.20 of its rate while another link's queue
was full, and 0.92-0.93 with the buffer raised.

How: the socket belongs to ovs-vswitchd, so it is borrowed. ``pidfd_getfd(2)`` (Linux 5.6,
root) duplicates its descriptor into this process, ``SO_SNDBUFFORCE`` raises the limit (root
may exceed ``wmem_max``; the kernel doubles the value for its bookkeeping), and the
duplicate is closed. The run puts the old value back when it ends
(:func:`restore_send_buffer`); a run killed with SIGKILL leaves the larger buffer, which
lasts until ovs-vswitchd restarts and harms nothing. Nothing else on the machine changes.
The alternative, raising ``net.core.wmem_default`` before ovs-vswitchd starts, would change
every socket created afterwards in the root namespace.

The socket is found without parsing ``ss``: ``/proc/net/packet`` lists packet sockets with
the interface each is bound to (0 for the unbound sending socket) and their inode, and
``/proc/<pid>/fd`` maps inodes to descriptors. Returns what the kernel reports afterwards,
so the caller can say what holds.
"""

from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: What is asked for; the kernel reports (and enforces) twice this.
DEFAULT_SEND_BUFFER = 4 * 1024 * 1024
#: pidfd_getfd's number in the unified syscall table (x86_64, arm64 and others alike).
SYS_PIDFD_GETFD = 438
PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")
#: Linux's SO_SNDBUFFORCE (Python has it on Linux, its type stubs do not).
SO_SNDBUFFORCE: int = getattr(socket, "SO_SNDBUFFORCE", 32)


@dataclass(frozen=True)
class SendBuffer:
    """The sending socket of one ovs-vswitchd and its buffer, before and after."""

    pid: int
    fd: int
    before: int
    after: int

    def describe(self) -> str:
        return (
            f"ovs-vswitchd send buffer {self.before // 1024} kB -> {self.after // 1024} kB "
            f"(pid {self.pid}, fd {self.fd})"
        )


def unbound_packet_inodes(proc_net_packet: str) -> set[int]:
    """Inodes of the packet sockets bound to no interface (``Iface`` 0), read from
    ``/proc/net/packet`` (header: sk RefCnt Type Proto Iface R Rmem User Inode)."""
    lines = proc_net_packet.splitlines()
    if not lines:
        return set()
    header = lines[0].split()
    iface, inode = header.index("Iface"), header.index("Inode")
    found = set()
    for line in lines[1:]:
        fields = line.split()
        if len(fields) > max(iface, inode) and fields[iface] == "0":
            found.add(int(fields[inode]))
    return found


def socket_fds(pid: int, inodes: set[int], proc: Path = Path("/proc")) -> list[int]:
    """``pid``'s descriptors that are sockets with one of ``inodes``."""
    fds = []
    for entry in (proc / str(pid) / "fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:[") and int(target[8:-1]) in inodes:
            fds.append(int(entry.name))
    return sorted(fds)


def _pidfd_getfd(pid: int, fd: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        dup = int(libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0))
        if dup < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"pidfd_getfd({pid}, {fd}): {os.strerror(errno)}")
        return dup
    finally:
        os.close(pidfd)


def vswitchd_pid(pidfile: Path = PIDFILE) -> int:
    return int(pidfile.read_text().strip())


@contextmanager
def _vswitchd_socket(pid: int) -> Iterator[tuple[int, socket.socket]]:
    """ovs-vswitchd's unbound packet socket, borrowed: (its fd there, our duplicate)."""
    inodes = unbound_packet_inodes(Path("/proc/net/packet").read_text())
    fds = socket_fds(pid, inodes)
    if len(fds) != 1:
        raise OSError(f"expected one unbound packet socket in ovs-vswitchd {pid}, found {fds}")
    sock = socket.socket(fileno=_pidfd_getfd(pid, fds[0]))
    try:
        yield fds[0], sock
    finally:
        sock.close()  # our duplicate only; ovs-vswitchd's descriptor stays open


def raise_send_buffer(size: int = DEFAULT_SEND_BUFFER, pid: int | None = None) -> SendBuffer:
    """Raise the send buffer of ovs-vswitchd's unbound packet socket to at least ``size``
    (never lowers it). OSError if the socket cannot be found or borrowed."""
    pid = vswitchd_pid() if pid is None else pid
    with _vswitchd_socket(pid) as (fd, sock):
        before = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        if before < 2 * size:
            sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size)
        after = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    return SendBuffer(pid, fd, before, after)


def restore_send_buffer(raised: SendBuffer) -> bool:
    """Put the buffer back to what it was before :func:`raise_send_buffer`, when the run
    ends: the change was for the run. Only if it is still that process and socket and still
    the raised value (else someone else owns it now); True if restored."""
    if raised.after <= raised.before:
        return False
    try:
        if vswitchd_pid() != raised.pid:
            return False  # ovs-vswitchd restarted: the new socket has its default already
    except (OSError, ValueError):
        return False
    with _vswitchd_socket(raised.pid) as (fd, sock):
        if fd != raised.fd or sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) != raised.after:
            return False
        # the kernel stores twice what is set (and reported ``before`` that way)
        sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, raised.before // 2)
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == raised.before
