"""Where the switches send a connection: its path walked switch by switch with ofproto/trace.

Under a policy that hashes (``ecmp`` and the others with select groups), the switches choose
a connection's uplinks from its five-tuple; the orchestrator plans its first hop only. Open
vSwitch answers the rest itself: ``ofproto/trace BRIDGE FLOW`` runs a packet of that flow
through the bridge's tables and groups with the code forwarding uses (a select group of
selection method ``hash`` picks its bucket from the listed fields and the basis, the same
way for the trace as for the connection's packets) and says what the datapath would do
with it. Following the output port's link in the fabric model to the next switch and
asking again, until the destination GPU, gives the whole path as the switches forward it
now: :func:`trace_paths`.

Reading a trace (:func:`read_trace`; real ones in tests/unit/data/ovs_traces.json):

- the last line, ``Datapath actions: ...``, is what the datapath does: outputs by
  *datapath* port number (ovs-vswitchd numbers the ports of all its bridges in one space),
  ``drop``, ``set(...)``, ``hash(...),recirc(...)``. The datapath port is mapped to its
  interface by ``dpif/show`` (asked once per walk, :class:`PortTable`: per bridge,
  ``<interface> <OpenFlow port>/<datapath port>``), the interface name
  ``<node>-eth<port>`` (:func:`orchestrator.emulation.wiring.intf_name`) to the node and
  model port. So the walk depends neither on OpenFlow port = model port (which the
  emulation asks for and checks at bring-up) nor on the datapath's numbering.
- the OpenFlow-level ``output:N`` of the bucket the group chose (``-> using bucket 3``,
  then ``output:3``) is the cross-check: an output followed by a ``>>`` note was not done
  (``>> skipping output to input port``: OpenFlow never sends a packet back where it came
  from), and the last one done must be the datapath port's OpenFlow number, or the trace is
  not trusted.
- the trace's ``in_port`` is the OpenFlow number of the interface the packet entered by,
  from the same table.

What cannot be traced yields a path marked as such, with the hops known up to the switch
where it stopped, never a guessed one: :data:`DROPPED` (the datapath drops it: no entry, no
live bucket, an output back to its input port, delivered to another GPU) and
:data:`UNKNOWN` (the bucket is chosen by the datapath's per-packet hash, which a trace
cannot know: a select group without ``selection_method=hash``, Open vSwitch's default
``dp_hash``, as an OpenFlow 1.3-only bridge gets it; several outputs; to the controller
only; an action not understood; a trace that disagrees with itself; a node that is no Open vSwitch
bridge; a loop; an error reply).

The flow traced carries the five-tuple, the in_port and the Ethernet addresses the GPU
sends with (its NIC's MAC to the virtual gateway's), the same at every switch: the policies
match the IP five-tuple and in_port only, and their one rewrite (the Ethernet addresses on
delivery) happens on the last hop.

Talking to ovs-vswitchd (:func:`open_control`): its control socket
``<rundir>/ovs-vswitchd.<pid>.ctl`` takes JSON-RPC 1.0 objects back to back, what
``ovs-appctl`` sends; one connection serves a whole walk (:class:`VswitchdControl`, about
0.2 ms a trace here against 3.7 ms for an ``ovs-appctl`` process: docs/monitoring.md).
Without the socket (switches this process cannot reach), ``ovs-appctl`` through the
:class:`~orchestrator.emulation.executor.CommandExecutor`, one process a trace
(:class:`AppctlControl`).
"""

from __future__ import annotations

import codecs
import json
import os
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from orchestrator.emulation.executor import CommandExecutor
from orchestrator.emulation.wiring import intf_name
from topologies.addressing import GATEWAY_MAC
from topologies.description import FabricDescription
from topologies.errors import EmulationError
from topologies.fivetuple import FiveTuple
from topologies.model import Fabric, Link

TRACED = "traced"  # GPU to GPU, every switch's output read from its trace
DROPPED = "dropped"  # the last hop's switch drops it (or delivers it to another GPU)
UNKNOWN = "unknown"  # the last hop's switch decides in a way a trace cannot tell

RUNDIR = Path("/var/run/openvswitch")  # ovs-vswitchd's, unless OVS_RUNDIR says otherwise
CONTROL_TIMEOUT = 10.0  # seconds for one reply of ovs-vswitchd
# datapath actions beside the outputs that do not send the packet on: rewrites, and a copy
# to the controller (adaptive's catch entry forwards a connection's first packets and
# copies them to the controller)
HARMLESS = ("set(", "masked_set(", "userspace(")
DATAPATH_ACTIONS = "Datapath actions:"
OUTPUT = re.compile(r"^\s*output:(\S+)\s*$")
PORT_LINE = re.compile(r"^\s+(\S+) (\d+)/(\d+|none):")
BRIDGE_LINE = re.compile(r"^  (\S+):\s*$")


class TraceError(EmulationError):
    """ovs-vswitchd could not be asked, or answered with an error."""


@dataclass(frozen=True)
class TraceRequest:
    """One connection to walk: its five-tuple from ``src`` to ``dst`` (GPU names), leaving
    by ``src``'s NIC port ``nic`` (model port number; None: by no NIC port, ``why_not``
    says what its kernel routes it out of)."""

    five_tuple: FiveTuple
    src: str
    dst: str
    nic: int | None
    why_not: str = ""


@dataclass(frozen=True)
class Hop:
    """A node of a path with the model ports it is entered and left by (None at the ends,
    and ``out_port`` at a switch where the trace stopped)."""

    node: str
    in_port: int | None
    out_port: int | None


@dataclass(frozen=True)
class TracedPath:
    """What a walk found: the hops from the source GPU; :data:`TRACED` when they end at the
    destination GPU, else :data:`DROPPED` or :data:`UNKNOWN` at the last hop, ``reason``
    saying why. ``traces``: how many switches were asked."""

    hops: tuple[Hop, ...]
    outcome: str
    reason: str = ""
    traces: int = 0

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(h.node for h in self.hops)

    @property
    def complete(self) -> bool:
        return self.outcome == TRACED


@dataclass(frozen=True)
class Port:
    """One port of an Open vSwitch bridge, as ``dpif/show`` lists it."""

    bridge: str
    ofport: int
    dp_port: int | None


@dataclass(frozen=True)
class PortTable:
    """``dpif/show``: every bridge port's OpenFlow and datapath numbers, by interface name."""

    ports: dict[str, Port]
    datapath: dict[int, str]  # datapath port -> interface

    @classmethod
    def parse(cls, text: str) -> PortTable:
        """From ``dpif/show``'s text: a datapath line, then per bridge ``  NAME:`` and per
        port ``    INTERFACE OFPORT/DPPORT: (TYPE...)`` (``none`` for a port the datapath
        does not have)."""
        ports: dict[str, Port] = {}
        bridge = None
        for line in text.splitlines():
            if (b := BRIDGE_LINE.match(line)) is not None:
                bridge = b.group(1)
            elif bridge is not None and (p := PORT_LINE.match(line)) is not None:
                dp = None if p.group(3) == "none" else int(p.group(3))
                ports[p.group(1)] = Port(bridge, int(p.group(2)), dp)
        datapath = {p.dp_port: name for name, p in ports.items() if p.dp_port is not None}
        return cls(ports, datapath)


@dataclass(frozen=True)
class Decision:
    """What one switch does with the packet: send it out of ``interface``, or ``outcome``
    (:data:`DROPPED`, :data:`UNKNOWN`) for ``reason``."""

    interface: str | None
    outcome: str = TRACED
    reason: str = ""


def datapath_actions(text: str) -> list[str] | None:
    """The trace's last ``Datapath actions:``, split at the commas between actions (not
    those inside an action's parentheses); None without one."""
    lines = [line for line in text.splitlines() if line.startswith(DATAPATH_ACTIONS)]
    if not lines:
        return None
    actions, depth, current = [], 0, ""
    for char in lines[-1][len(DATAPATH_ACTIONS) :].strip():
        if char == "," and depth == 0:
            actions.append(current.strip())
            current = ""
            continue
        depth += (char == "(") - (char == ")")
        current += char
    if current.strip():
        actions.append(current.strip())
    return actions


def openflow_outputs(text: str) -> list[str]:
    """The OpenFlow ``output:`` actions the trace did, in order (port numbers or names as
    the trace prints them); one followed by a ``>>`` note (skipped) is left out."""
    lines = text.splitlines()
    done = []
    for index, line in enumerate(lines):
        match = OUTPUT.match(line)
        if match is None:
            continue
        following = lines[index + 1].strip() if index + 1 < len(lines) else ""
        if not following.startswith(">>"):
            done.append(match.group(1))
    return done


def _drop_reason(text: str) -> str:
    """Why a trace ends in ``drop``, in the trace's words where it has some."""
    if "skipping output to input port" in text:
        return "its output is the port the packet came in by (OpenFlow does not send it back)"
    if "no live bucket" in text:
        return "its group has no live bucket"
    notes = [line.strip()[2:].strip() for line in text.splitlines() if line.strip()[:2] == ">>"]
    if notes:
        return notes[0]
    return "no entry sends it anywhere"


def read_trace(text: str, ports: PortTable, bridge: str) -> Decision:
    """The decision of ``bridge`` in one ``ofproto/trace`` text (the module docstring)."""
    actions = datapath_actions(text)
    if actions is None:
        return Decision(None, UNKNOWN, "the trace has no datapath actions")
    if actions == ["drop"]:
        return Decision(None, DROPPED, _drop_reason(text))
    if any(a.startswith(("hash(", "recirc(")) for a in actions):
        return Decision(
            None,
            UNKNOWN,
            "its select group picks a bucket by the datapath's packet hash (dp_hash: no "
            "selection_method=hash, an OpenFlow 1.3 bridge?), which a trace cannot know "
            f"(datapath actions {','.join(actions)})",
        )
    outputs = [a for a in actions if a.isdigit()]
    others = [a for a in actions if not a.isdigit() and not a.startswith(HARMLESS)]
    if others:
        return Decision(None, UNKNOWN, f"datapath action {others[0]} is not an output")
    if not outputs and any(a.startswith("userspace(") for a in actions):
        return Decision(None, UNKNOWN, "it sends the packet to the controller only")
    if not outputs:
        return Decision(None, DROPPED, _drop_reason(text))
    if len(outputs) > 1:
        return Decision(None, UNKNOWN, f"it sends the packet out of {len(outputs)} ports")
    interface = ports.datapath.get(int(outputs[0]))
    port = ports.ports.get(interface) if interface is not None else None
    if interface is None or port is None:
        return Decision(None, UNKNOWN, f"datapath port {outputs[0]} is no bridge's port")
    if port.bridge != bridge:
        return Decision(None, UNKNOWN, f"it leaves by {interface}, a port of {port.bridge}")
    done = openflow_outputs(text)
    if done and done[-1] not in (str(port.ofport), interface):
        return Decision(
            None,
            UNKNOWN,
            f"its OpenFlow output ({done[-1]}) is not the datapath's ({interface}, "
            f"OpenFlow port {port.ofport})",
        )
    return Decision(interface)


class Control(Protocol):
    """Asks ovs-vswitchd a unixctl command (``ofproto/trace``, ``dpif/show``)."""

    name: str

    def call(self, method: str, params: Sequence[str]) -> str:
        """The command's text; :class:`TraceError` for an error reply or none."""
        ...

    def close(self) -> None: ...


class VswitchdControl:
    """One connection to ovs-vswitchd's control socket: JSON-RPC 1.0 requests and replies,
    objects back to back with nothing between them (what ``ovs-appctl`` speaks)."""

    name = "control socket"

    def __init__(self, path: Path, timeout: float = CONTROL_TIMEOUT) -> None:
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.settimeout(timeout)
        try:
            self._socket.connect(str(path))
        except OSError as error:
            self._socket.close()
            raise TraceError(f"cannot connect to ovs-vswitchd at {path}: {error}") from error
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._decoder = json.JSONDecoder()
        self._buffer = ""
        self._id = 0

    def call(self, method: str, params: Sequence[str]) -> str:
        self._id += 1
        request = {"id": self._id, "method": method, "params": list(params)}
        try:
            self._socket.sendall(json.dumps(request).encode())
            reply = self._receive()
        except OSError as error:
            raise TraceError(f"ovs-vswitchd at {self.path}: {error}") from error
        if reply.get("id") != self._id:
            raise TraceError(f"ovs-vswitchd answered request {reply.get('id')}, not {self._id}")
        if reply.get("error") is not None:
            raise TraceError(str(reply["error"]).strip())
        return str(reply.get("result") or "")

    def _receive(self) -> dict[str, Any]:
        """The next whole JSON object on the connection."""
        while True:
            text = self._buffer.lstrip()
            if text:
                try:
                    reply, end = self._decoder.raw_decode(text)
                except json.JSONDecodeError:
                    pass  # not all of it has arrived
                else:
                    self._buffer = text[end:]
                    if not isinstance(reply, dict):
                        raise TraceError(f"ovs-vswitchd sent {reply!r}, not a JSON-RPC reply")
                    return reply
            chunk = self._socket.recv(65536)
            if not chunk:
                raise TraceError("ovs-vswitchd closed its control connection")
            self._buffer = text + self._utf8.decode(chunk)

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> VswitchdControl:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class AppctlControl:
    """``ovs-appctl`` through a :class:`CommandExecutor` (root namespace of the machine that
    holds the switches): one process a command, for where the socket is out of reach."""

    name = "ovs-appctl"

    def __init__(self, executor: CommandExecutor) -> None:
        self.executor = executor

    def call(self, method: str, params: Sequence[str]) -> str:
        argv = ["ovs-appctl", f"--timeout={CONTROL_TIMEOUT:g}", method, *params]
        done = self.executor.run(None, argv, timeout=CONTROL_TIMEOUT + 5)
        if not done.ok:
            raise TraceError((done.stderr or done.stdout).strip() or f"exit {done.returncode}")
        return done.stdout

    def close(self) -> None:
        pass


def control_socket(rundir: Path | None = None) -> Path | None:
    """ovs-vswitchd's control socket (``<rundir>/ovs-vswitchd.<pid>.ctl``, the pid from its
    pidfile; ``rundir``: ``$OVS_RUNDIR`` or /var/run/openvswitch), None where there is none."""
    if rundir is None:
        rundir = Path(os.environ.get("OVS_RUNDIR") or RUNDIR)
    try:
        pid = int((rundir / "ovs-vswitchd.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    path = rundir / f"ovs-vswitchd.{pid}.ctl"
    return path if path.exists() else None


def open_control(executor: CommandExecutor, rundir: Path | None = None) -> Control:
    """The control socket where this process can reach it, else ``ovs-appctl``."""
    path = control_socket(rundir)
    if path is not None:
        try:
            return VswitchdControl(path)
        except TraceError:
            pass
    return AppctlControl(executor)


def flow_text(request: TraceRequest, in_port: int, src_mac: str | None) -> str:
    """``ofproto/trace``'s flow for ``request`` entering by OpenFlow port ``in_port``."""
    t = request.five_tuple
    ethernet = f"dl_src={src_mac},dl_dst={GATEWAY_MAC}," if src_mac else ""
    return (
        f"in_port={in_port},{t.protocol},{ethernet}nw_src={t.src_ip},nw_dst={t.dst_ip},"
        f"tp_src={t.src_port},tp_dst={t.dst_port}"
    )


def _interfaces(fabric: Fabric) -> dict[str, tuple[str, Link]]:
    """Every link end's interface name -> (its node, the link)."""
    return {
        intf_name(n, link.port_of(n)): (n, link) for link in fabric.links for n in (link.a, link.b)
    }


def walk(
    description: FabricDescription,
    request: TraceRequest,
    control: Control,
    ports: PortTable,
    interfaces: dict[str, tuple[str, Link]] | None = None,
) -> TracedPath:
    """One connection's path, switch by switch (the module docstring)."""
    fabric = description.fabric
    interfaces = interfaces if interfaces is not None else _interfaces(fabric)
    src, dst = request.src, request.dst
    start = next((x for x in fabric.nic_links(src) if x.port_of(src) == request.nic), None)
    if request.nic is None or start is None:
        why = request.why_not or f"{src} has no NIC port {request.nic}"
        return TracedPath((Hop(src, None, None),), UNKNOWN, why)
    macs = {n.port: n.mac for n in description.addresses[src].nics}
    hops = [Hop(src, None, request.nic)]
    node, in_port = start.other(src), start.port_of(start.other(src))
    seen: set[tuple[str, int]] = set()
    traces = 0

    def stop(outcome: str, reason: str) -> TracedPath:
        hops.append(Hop(node, in_port, None))
        return TracedPath(tuple(hops), outcome, f"{node}: {reason}", traces)

    while True:
        if node in fabric.gpus:
            if node == dst:
                hops.append(Hop(node, in_port, None))
                return TracedPath(tuple(hops), TRACED, "", traces)
            return stop(DROPPED, f"delivered to this GPU, not to {dst}")
        if (node, in_port) in seen:
            return stop(UNKNOWN, f"entered by port {in_port} a second time: a loop")
        seen.add((node, in_port))
        entry = ports.ports.get(intf_name(node, in_port))
        if entry is None or entry.bridge != node:
            return stop(UNKNOWN, "not an Open vSwitch bridge: not traced")
        try:
            text = control.call(
                "ofproto/trace", [node, flow_text(request, entry.ofport, macs.get(request.nic))]
            )
        except TraceError as error:
            return stop(UNKNOWN, f"ofproto/trace failed: {error}")
        traces += 1
        decision = read_trace(text, ports, node)
        out = interfaces.get(decision.interface or "")
        if decision.interface is None or out is None or out[0] != node:
            reason = decision.reason or f"{decision.interface} is no port of {node} in the model"
            return stop(decision.outcome if decision.interface is None else UNKNOWN, reason)
        link = out[1]
        hops.append(Hop(node, in_port, link.port_of(node)))
        node, in_port = link.other(node), link.port_of(link.other(node))


def trace_paths(
    description: FabricDescription, requests: Iterable[TraceRequest], control: Control
) -> list[TracedPath]:
    """Every request's path (in order), over one ``control``; the port table is asked once."""
    ports = PortTable.parse(control.call("dpif/show", []))
    interfaces = _interfaces(description.fabric)
    return [walk(description, r, control, ports, interfaces) for r in requests]
