"""Paths walked through switches on several machines (orchestrator.emulation.pathtrace).

A path trace asks each switch on the way what it does with a connection's packet
(``ofproto/trace``) and maps the datapath port it answers with to an interface through one
``dpif/show`` table. In a cluster every machine has its own ovs-vswitchd, so its own
datapath port numbers: :class:`ClusterControl` asks each switch's own daemon and keeps
the numbers apart by adding ``machine index x`` :data:`PORT_SPACE` to every datapath port
of that machine, in the table and in the traces' datapath actions alike. The walk itself
is unchanged.

Each daemon is reached over one connection to its control socket: this machine's
directly, another's through an SSH session forwarding a Unix socket here to the one there
(``ssh -L``), about a millisecond a trace instead of an SSH login per trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.emulation.pathtrace import (
    DATAPATH_ACTIONS,
    PORT_LINE,
    Control,
    TraceError,
)

PORT_SPACE = 1_000_000


def shift_port_table(text: str, offset: int) -> str:
    """``dpif/show``'s text with every datapath port number raised by ``offset``."""
    if not offset:
        return text
    lines = []
    for line in text.splitlines():
        match = PORT_LINE.match(line)
        if match is not None and match.group(3) != "none":
            start, end = match.span(3)
            line = line[:start] + str(int(match.group(3)) + offset) + line[end:]
        lines.append(line)
    return "\n".join(lines) + "\n"


def shift_actions(text: str, offset: int) -> str:
    """A trace's text with the output ports of its ``Datapath actions:`` raised by
    ``offset`` (a bare number is an output; numbers inside actions are left alone)."""
    if not offset:
        return text
    out = []
    for line in text.splitlines():
        if line.startswith(DATAPATH_ACTIONS):
            head, actions = line[: len(DATAPATH_ACTIONS)], line[len(DATAPATH_ACTIONS) :]
            parts = _split_top(actions)
            parts = [str(int(p.strip()) + offset) if p.strip().isdigit() else p for p in parts]
            line = head + " " + ",".join(p.strip() for p in parts)
        out.append(line)
    return "\n".join(out) + "\n"


def _split_top(actions: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in actions:
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += (char == "(") - (char == ")")
        current += char
    if current.strip():
        parts.append(current)
    return parts


class ClusterControl:
    """A :class:`~orchestrator.emulation.pathtrace.Control` over every machine's daemon."""

    name = "control sockets (one per machine)"

    def __init__(
        self,
        machines: Sequence[str],
        open_one: Callable[[str], Control],
        machine_of: Callable[[str], str],
    ) -> None:
        self.machines = list(machines)
        self._open_one = open_one
        self._machine_of = machine_of
        self._controls: dict[str, Control] = {}

    def _control(self, machine: str) -> Control:
        if machine not in self._controls:
            self._controls[machine] = self._open_one(machine)
        return self._controls[machine]

    def _offset(self, machine: str) -> int:
        return self.machines.index(machine) * PORT_SPACE

    def call(self, method: str, params: Sequence[str]) -> str:
        if method == "dpif/show":
            return "".join(
                shift_port_table(self._control(m).call(method, params), self._offset(m))
                for m in self.machines
            )
        if method == "ofproto/trace" and params:
            machine = self._machine_of(params[0])
            text = self._control(machine).call(method, params)
            return shift_actions(text, self._offset(machine))
        raise TraceError(f"{method} is not asked of a cluster's switches")

    def close(self) -> None:
        for control in self._controls.values():
            control.close()
        self._controls.clear()
