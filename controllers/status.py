"""The controller's status file: how the orchestrator sees what the controller process did.

The controller process (``python -m controllers --status FILE``) rewrites this JSON file
atomically (write a temporary file, then rename) whenever something changes, so a reader
never sees half a file. The orchestrator (``orchestrator.emulation.controller.ControllerProcess``)
polls it to learn when every switch is connected and programmed. Pure Python, no os-ken,
so the orchestrator imports it without importing the controller.

Format (version 1)::

    {"version": 1,
     "pid": 4242,                       # the controller process; compare before trusting
     "state": "starting" | "running" | "stopped",
     "listening": true,                 # the OpenFlow listener is bound
     "listen": {"host": "127.0.0.1", "port": 6653},
     "fabric": "astral-small", "policy": "shortest",
     "started_at": 1732900000.12, "updated_at": 1732900001.50,   # time.time()
     "expected_dpids": [5, 6, ..., 24], # the switches the controller programs
     "failed_links": [["p0r0t0", 1, "p0s0g0", 1]],   # [a, a_port, b, b_port], model ports
     "reprograms": 0,                   # plans rendered after the first (port events)
     "switches": [
        {"dpid": 5, "name": "p0r0t0",
         "connected": true,
         "programmed": true,            # the latest plan is installed AND the switch
                                        # answered the barrier sent after it
         "rules": 8,                    # route entries of the latest plan on this switch
         "flows": 10,                   # entries the controller installed (rules + ARP +
                                        # table-miss)
         "groups": 2,                   # groups of the latest plan on this switch
         "openflow": 6,                 # negotiated OpenFlow version (4 = 1.3, 6 = 1.5)
         "errors": 0,                   # OpenFlow error messages from this switch
         "connected_at": 1732900000.80, "programmed_at": 1732900000.95}, ...]}

A switch that connects with a dpid the fabric does not have is listed with ``"name": null``
and never counts as programmed.

Exit statuses of ``python -m controllers`` are defined here too, for the same reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

VERSION = 1

EXIT_OK = 0
EXIT_CONFIG = 2  # bad arguments, unreadable description, unknown policy
EXIT_LISTEN_FAILED = 75  # could not bind the OpenFlow port (EX_TEMPFAIL: try another port)
EXIT_CRASHED = 70  # the controller hit an internal error (EX_SOFTWARE)


@dataclass
class SwitchStatus:
    dpid: int
    name: str | None
    connected: bool = False
    programmed: bool = False
    rules: int = 0
    flows: int = 0
    errors: int = 0
    connected_at: float | None = None
    programmed_at: float | None = None
    groups: int = 0
    openflow: int | None = None


@dataclass
class ControllerStatus:
    pid: int
    fabric: str
    policy: str
    listen_host: str
    listen_port: int
    started_at: float
    updated_at: float
    state: str = "starting"
    listening: bool = False
    expected_dpids: list[int] = field(default_factory=list)
    failed_links: list[tuple[str, int, str, int]] = field(default_factory=list)
    reprograms: int = 0
    switches: dict[int, SwitchStatus] = field(default_factory=dict)

    def missing(self, dpids: Iterable[int] | None = None) -> list[int]:
        """Of ``dpids`` (default: every expected one), those not connected and programmed."""
        wanted = self.expected_dpids if dpids is None else dpids
        return sorted(
            d
            for d in wanted
            if d not in self.switches
            or not (self.switches[d].connected and self.switches[d].programmed)
        )

    def programmed(self, dpids: Iterable[int] | None = None) -> bool:
        return not self.missing(dpids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "pid": self.pid,
            "state": self.state,
            "listening": self.listening,
            "listen": {"host": self.listen_host, "port": self.listen_port},
            "fabric": self.fabric,
            "policy": self.policy,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "expected_dpids": sorted(self.expected_dpids),
            "failed_links": [list(x) for x in sorted(self.failed_links)],
            "reprograms": self.reprograms,
            "switches": [asdict(self.switches[d]) for d in sorted(self.switches)],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ControllerStatus:
        if data.get("version") != VERSION:
            raise ValueError(f"unsupported controller status version {data.get('version')!r}")
        switches = {s["dpid"]: SwitchStatus(**s) for s in data["switches"]}
        return cls(
            pid=data["pid"],
            fabric=data["fabric"],
            policy=data["policy"],
            listen_host=data["listen"]["host"],
            listen_port=data["listen"]["port"],
            started_at=data["started_at"],
            updated_at=data["updated_at"],
            state=data["state"],
            listening=data["listening"],
            expected_dpids=list(data["expected_dpids"]),
            failed_links=[(a, int(ap), b, int(bp)) for a, ap, b, bp in data["failed_links"]],
            reprograms=data.get("reprograms", 0),
            switches=switches,
        )


def write_status(path: str | Path, status: ControllerStatus) -> None:
    """Replace ``path`` atomically with ``status``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".controller-status-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(status.to_dict(), out, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_status(path: str | Path) -> ControllerStatus | None:
    """The status in ``path``, or None while there is none (not written yet)."""
    try:
        with open(path, encoding="utf-8") as src:
            return ControllerStatus.from_dict(json.load(src))
    except FileNotFoundError:
        return None
