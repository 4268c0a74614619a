"""orchestrator.emulation.sendbuffer: finding ovs-vswitchd's sending socket (the borrowing
itself needs root and a running ovs-vswitchd: tests/integration/test_emulation.py checks it)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.emulation.sendbuffer import SendBuffer, socket_fds, unbound_packet_inodes

# /proc/net/packet on the project's machine with a fabric up (trimmed)
PROC_NET_PACKET = """\
sk       RefCnt Type Proto  Iface R Rmem   User   Inode
0000000000000000 3      3    0000   0     0 0      0      84211
0000000000000000 3      3    0003   97    1 0      0      84307
0000000000000000 3      3    0003   98    1 0      0      84309
"""


def test_the_unbound_socket_is_the_one_with_interface_zero() -> None:
    assert unbound_packet_inodes(PROC_NET_PACKET) == {84211}


def test_no_packet_sockets_means_none_found() -> None:
    assert unbound_packet_inodes("") == set()
    assert unbound_packet_inodes(PROC_NET_PACKET.splitlines()[0]) == set()


def test_descriptors_are_matched_by_socket_inode(tmp_path: Path) -> None:
    fd_dir = tmp_path / "4242" / "fd"
    fd_dir.mkdir(parents=True)
    os.symlink("socket:[84211]", fd_dir / "160")
    os.symlink("socket:[84307]", fd_dir / "40")
    os.symlink("/dev/null", fd_dir / "0")
    os.symlink("pipe:[5]", fd_dir / "7")
    assert socket_fds(4242, {84211}, proc=tmp_path) == [160]
    assert socket_fds(4242, {84211, 84307}, proc=tmp_path) == [40, 160]
    assert socket_fds(4242, {1}, proc=tmp_path) == []


def test_description_names_sizes_in_kilobytes() -> None:
    text = SendBuffer(pid=1, fd=160, before=212992, after=8388608).describe()
    assert "208 kB -> 8192 kB" in text
