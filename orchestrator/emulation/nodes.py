"""Mininet node, interface and link classes that let the emulation build in batches.

Mininet's stock classes configure one thing per shell round trip (``ifconfig`` per
interface, ``ip link add`` per link, one long ``ovs-vsctl`` string per switch) and each
switch keeps a bash shell it rarely uses. Here the emulation creates veth pairs, bridges and
addresses itself, in a few batched commands built from argument lists, and these classes
only give Mininet's objects (``net.hosts``, ``net['p0s0g0'].cmd(...)``, the CLI) a view of
what exists:

- :class:`GpuHost`: a Mininet ``Host`` (a shell in its own network namespace). Its default
  interface is its first NIC port, so ``host.IP()`` is its fabric address.
- :class:`FabricSwitch` (Open vSwitch) and :class:`NvlinkBridge` (Linux bridge): switches
  whose root-namespace shell starts on first use (CLI commands on a switch, ``dpctl``), not
  at creation; ``on_shell`` lets the emulation record its pid.
- :class:`PrecreatedLink` / :class:`PrecreatedIntf`: wrap a veth pair that already exists;
  creating them runs no command, and deleting them is left to the run record
  (``orchestrator.emulation.state.clean``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mininet.link import Intf, Link
from mininet.node import Host, Node, OVSSwitch, Switch


class PrecreatedIntf(Intf):
    """An interface that exists already, configured by the emulation in batch."""

    def config(
        self,
        mac: str | None = None,
        ip: str | None = None,
        prefixlen: int | None = None,
        **_params: Any,
    ) -> dict[str, Any]:
        # Record what the emulation configures, for Mininet's IP()/MAC() and the CLI.
        if mac:
            self.mac = mac
        if ip:
            self.ip, self.prefixLen = ip, prefixlen
        return {}

    def delete(self) -> None:
        """Left to the run record: ``clean`` deletes the pair in one batch."""


class PrecreatedLink(Link):
    """A link whose veth pair the emulation created in a batch beforehand."""

    def __init__(self, node1: Node, node2: Node, **params: Any) -> None:
        params["intf"] = PrecreatedIntf  # Mininet.addLink passes its default Intf
        super().__init__(node1, node2, fast=True, **params)

    @classmethod
    def makeIntfPair(cls, *args: Any, **kwargs: Any) -> None:
        """The pair exists already (orchestrator.emulation.network creates all at once)."""

    def delete(self) -> None:
        """Left to the run record."""

    def stop(self) -> None:
        """Left to the run record."""


class GpuHost(Host):
    """An emulated GPU: a shell in its own network namespace."""

    def defaultIntf(self) -> Intf | None:
        """The first NIC port (port 1), so that ``IP()`` is the fabric address."""
        ports = sorted(p for p in self.intfs if p > 0)
        if ports:
            return self.intfs[ports[0]]
        return super().defaultIntf()


class _LazyShellSwitch:
    """Mixin: a root-namespace switch node whose shell starts on first use.

    Mininet starts one bash per node at creation; switches here are configured through
    ``ovs-vsctl``/``ip`` batches instead, so the shell only serves interactive use.
    """

    shell: Any
    name: str
    pid: int | None
    on_shell: Callable[[str, int], None] | None = None
    _lazy: bool = True

    def startShell(self, mnopts: str | None = None) -> None:
        if self._lazy:
            return
        Node.startShell(self, mnopts)
        if self.on_shell is not None and self.pid is not None:
            self.on_shell(self.name, self.pid)

    def _ensure_shell(self) -> None:
        if self.shell is None:
            self._lazy = False
            self.startShell()

    def sendCmd(self, *args: Any, **kwargs: Any) -> Any:
        self._ensure_shell()
        return super().sendCmd(*args, **kwargs)  # type: ignore[misc]

    def cmd(self, *args: Any, **kwargs: Any) -> Any:
        self._ensure_shell()
        return super().cmd(*args, **kwargs)  # type: ignore[misc]

    def popen(self, *args: Any, **kwargs: Any) -> Any:
        self._ensure_shell()
        return super().popen(*args, **kwargs)  # type: ignore[misc]


def _init_root_switch(node: Any, name: str, dpid: str, params: dict[str, Any]) -> None:
    """What ``Switch.__init__`` does, minus the ``lo`` control interface it configures with
    a shell command (model ports start at 1; port 0 stays free)."""
    params["inNamespace"] = False
    Node.__init__(node, name, **params)
    node.dpid = dpid
    node.opts = ""
    node.listenPort = None
    node.controlIntf = None


class FabricSwitch(_LazyShellSwitch, OVSSwitch):
    """A ToR/agg/core switch: an Open vSwitch bridge the emulation created in one batch."""

    def __init__(
        self,
        name: str,
        dpid: str,
        datapath: str = "user",
        on_shell: Callable[[str, int], None] | None = None,
        **params: Any,
    ) -> None:
        self.on_shell = on_shell
        _init_root_switch(self, name, dpid, params)
        # OVSSwitch's attributes, for its helpers (dpctl, vsctl, connected).
        self.failMode = "secure"
        self.datapath = datapath
        self.inband = False
        self.protocols = "OpenFlow13,OpenFlow15"  # 1.5: select groups with selection_method
        self.reconnectms = 1000
        self.stp = False
        self._uuids: list[str] = []
        self.batch = False
        self.commands: list[str] = []

    def start(self, controllers: Any) -> None:
        """Created by the emulation (orchestrator.emulation.network), not by Mininet."""

    def stop(self, deleteIntfs: bool = True) -> None:
        """Removed by the run record (orchestrator.emulation.state.clean)."""


class NvlinkBridge(_LazyShellSwitch, Switch):
    """A server's NVLink switch: a Linux bridge, no controller."""

    def __init__(
        self,
        name: str,
        dpid: str,
        on_shell: Callable[[str, int], None] | None = None,
        **params: Any,
    ) -> None:
        self.on_shell = on_shell
        _init_root_switch(self, name, dpid, params)

    def connected(self) -> bool:
        return True

    def start(self, controllers: Any) -> None:
        """Created by the emulation."""

    def stop(self, deleteIntfs: bool = True) -> None:
        """Removed by the run record."""
