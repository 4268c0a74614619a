"""A transport connection's five-tuple: the one name for it on every side of the testbed.

The workers report the five-tuple of every connection they open (the orchestrator's
launcher builds it from their report), the results store keeps each connection's samples
under it, and the controller's adaptive policy tracks and steers connections by the same
five fields it matches in the switches. Defined here, below all of them, because the
controller may import nothing of the orchestrator's.

``src`` is the end that opened the connection (the worker that sends on it, or the source
of the packets a switch saw); ``protocol`` is "tcp" or "udp".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class FiveTuple:
    src_ip: str
    src_port: int
    dst_ip: str
    dst_port: int
    protocol: str = "tcp"

    @property
    def label(self) -> str:
        """The short form plots use: ``src_ip:src_port->dst_ip:dst_port``."""
        return f"{self.src_ip}:{self.src_port}->{self.dst_ip}:{self.dst_port}"

    def __str__(self) -> str:
        """``tcp src_ip:src_port>dst_ip:dst_port``: what the controller logs, and what the
        adaptive policy hashes to place a connection (so this text must not change)."""
        return f"{self.protocol} {self.src_ip}:{self.src_port}>{self.dst_ip}:{self.dst_port}"

    def to_dict(self) -> dict[str, Any]:
        """The telemetry file's form (docs/telemetry.md): proto, src, sport, dst, dport."""
        return {
            "proto": self.protocol,
            "src": self.src_ip,
            "sport": self.src_port,
            "dst": self.dst_ip,
            "dport": self.dst_port,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FiveTuple:
        return cls(
            src_ip=str(data["src"]),
            src_port=int(data["sport"]),
            dst_ip=str(data["dst"]),
            dst_port=int(data["dport"]),
            protocol=str(data["proto"]),
        )
