"""One switch as the controller sees it: its connection, what it holds, which ports are down.

The os-ken app (:mod:`controllers.app`) keeps one :class:`SwitchSession` per datapath id for
the life of the process: created when the switch first connects, reset by every new
connection (os-ken hands over a new datapath object and the controller reads the switch's
tables again), kept when the switch disconnects. Some of it outlives a connection on purpose:

- ``down``: the ports the switch last reported down. A switch that disconnects is not a
  failure by itself (its neighbours' ports tell), so the failed links are computed from every
  session's ``down``, connected or not, and a reconnection replaces it with what the switch
  reports then.
- ``generation``: counts pushes over the process's life; a barrier reply counts only if it
  answers the barrier of the latest push.
- ``warned_v13``: a switch that speaks only OpenFlow 1.3 is warned about once.
- ``status``: the switch's entry in the status file (``controllers.status``), which keeps
  listing a switch after it disconnects.

The handlers that use a session all run on the app's one event thread, so nothing here is
locked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controllers.plan import FlowEntry, FlowKey, GroupEntry
from controllers.status import SwitchStatus


@dataclass
class Connecting:
    """What the controller learns about a switch between connecting and programming it."""

    down: set[int] = field(default_factory=set)  # OpenFlow port numbers
    flows_xid: int | None = None  # of the flow table request (replies to others' are not it)
    flows: list[Any] = field(default_factory=list)  # OFPFlowStats (1.3) / OFPFlowDesc (1.5)
    groups: list[Any] = field(default_factory=list)  # OFPGroupDescStats
    ports_done: bool = False
    flows_done: bool = False
    groups_done: bool = False


@dataclass
class SwitchSession:
    """Everything the controller holds about one switch (one datapath id)."""

    dpid: int
    name: str | None  # None: a dpid the fabric does not have (it only gets a drop rule)
    status: SwitchStatus  # this switch's entry of the status file
    datapath: Any = None  # os-ken's Datapath of the current connection; None when gone
    connecting: Connecting | None = None  # between connecting and programming
    ready: bool = False  # port states known, plan pushed at least once on this connection
    down: set[int] = field(default_factory=set)  # model ports that are down (last known)
    installed: dict[FlowKey, FlowEntry] = field(default_factory=dict)  # our route entries
    installed_groups: dict[int, GroupEntry] = field(default_factory=dict)
    generation: int = 0  # bumped on every push to the switch
    barrier: tuple[int, int] | None = None  # (xid, generation) of the barrier awaited
    warned_v13: bool = False  # told that its select groups use dp_hash

    def connect(self, datapath: Any) -> None:
        """A new connection: what the previous one learned no longer holds."""
        self._forget_connection()
        self.datapath = datapath

    def disconnect(self) -> None:
        self._forget_connection()
        self.datapath = None

    def _forget_connection(self) -> None:
        self.connecting = None
        self.ready = False
        self.barrier = None
        self.installed = {}
        self.installed_groups = {}
