"""Egress queues, sampled live: what each switch port's and GPU NIC port's shaper held
and dropped.

::

    sampler = QueueSampler.for_emulation(testbed.emulation, testbed.description).start()
    ...                                        # the run
    sampler.stop()
    writer.add_queue_counters(sampler.snapshot())

Why a layer of its own: the OpenFlow port counters the controller polls count a packet
when the port transmits it, so a packet a switch drops on its way out (its egress queue
full, a lossy link's drop, a blackhole's drop rule) is in the receive counter of the port
it came in by and in no transmit counter. The difference says *that* a switch dropped
packets, not *why*. A real switch tells its operator more: per egress queue, how many
packets the queue discarded because it was full and how deep it was. In this emulation
that queue is the port's shaper (an HTB qdisc on the switch end of each link,
orchestrator/emulation/shaping.py), and its own counters are that figure: ``drops`` (what
the full queue discarded) and ``backlog`` (bytes it held at the sample). A switch whose
ports received more than they sent, beyond what its queues discarded, dropped packets that
no queue reports: a lossy link or a blackhole, not congestion (docs/diagnosis.md).

One ``tc -s -j qdisc show`` per machine per sample lists every interface's root qdisc in
the namespace the switches live in (a few ms for a few hundred ports); the switch ports
are told from the rest by their names (``<switch>-eth<port>``,
:func:`orchestrator.emulation.wiring.intf_name`). Counters are cumulative and read
through the fabric's command executor, so a fabric over several machines is sampled on
each (one switch of each machine names where the command runs).

The GPUs' NIC ports have an egress queue too (the GPU end of each NIC link is shaped like
the switch end), in the GPU's own namespace: a slowed NIC port's direction from its GPU
shows there and nowhere else, as its bytes wait in the GPU's queue, not a switch's. Those
are read without a process, over a netlink socket opened inside each GPU's namespace
(:mod:`orchestrator.emulation.qdiscstats`), when the emulation gives its GPUs' namespaces
(this machine's fabric; not one spread over several machines, whose GPU ends are not
sampled). They are recorded beside the switch ports' under the GPU's name.

One more loss happens inside a switch with no fault and no full queue: the emulator's
own. Every switch port is read by ovs-vswitchd through a packet socket; a packet arriving
when that socket's receive buffer is full (the switch process starved of CPU for a
moment, or a burst of about 90 full frames arriving faster than it reads) is counted
received by the port and dropped by the kernel, never sent: the port counters show it as
they show a lossy link's drop. The sockets' own drop counts
(``ss -0 -m -p``, :data:`SOCKET_COMMAND`) name those per port, one command per machine
per sample beside tc's, and the diagnosis takes them off a switch's unexplained drops
(:class:`~orchestrator.results.store.IngressDrop`).
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Self

from orchestrator.emulation import qdiscstats
from orchestrator.emulation.executor import CommandExecutor
from orchestrator.emulation.probe import opened_in
from orchestrator.emulation.wiring import intf_name
from orchestrator.results.store import IngressDrop, QueueCounter
from orchestrator.testbed.sampling import PeriodicSampler
from topologies.description import FabricDescription
from topologies.model import LinkKind

QUEUE_INTERVAL = 0.5  # seconds between samples: the controller's counter polling's pace
QDISC_COMMAND = ["tc", "-s", "-j", "qdisc", "show"]
#: every packet socket of the namespace, with its process and memory (its drops): ``ss``
SOCKET_COMMAND = ["ss", "-H", "-0", "-m", "-p"]
SWITCH_PROCESS = "ovs-vswitchd"
_SOCKET_LINE = re.compile(
    r"^\S+\s+\d+\s+\d+\s+\S*:(?P<dev>\S+)\s.*?users:\(\(\"(?P<proc>[^\"]+)\"[^)]*\)"
    r".*?skmem:\((?P<mem>[^)]*)\)"
)


def switch_interfaces(description: FabricDescription) -> dict[str, tuple[str, int]]:
    """Every switch port's interface name -> (switch, model port)."""
    fabric = description.fabric
    out = {}
    for link in fabric.links:
        for node in (link.a, link.b):
            if node in fabric.switches:
                port = link.port_of(node)
                out[intf_name(node, port)] = (node, port)
    return out


def nic_interfaces(description: FabricDescription) -> dict[str, dict[str, int]]:
    """Every GPU -> its NIC ports' interface names -> model port (NVLink ports are not
    the network's)."""
    fabric = description.fabric
    out: dict[str, dict[str, int]] = {}
    for link in fabric.links:
        if link.kind is not LinkKind.NIC:
            continue
        for node in (link.a, link.b):
            if node not in fabric.switches:
                port = link.port_of(node)
                out.setdefault(node, {})[intf_name(node, port)] = port
    return out


def parse_qdiscs(
    text: str, interfaces: Mapping[str, tuple[str, int]], t: float
) -> list[QueueCounter]:
    """The root qdiscs of ``interfaces`` in ``tc -s -j qdisc show``'s output; others (the
    machine's own interfaces, the GPUs' ends, child qdiscs) are skipped. Empty when the
    text is not tc's JSON."""
    try:
        entries = json.loads(text or "[]")
    except json.JSONDecodeError:
        return []
    out = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not entry.get("root"):
            continue
        where = interfaces.get(str(entry.get("dev", "")))
        if where is None:
            continue
        out.append(
            QueueCounter(
                t=t,
                switch=where[0],
                port=where[1],
                packets=int(entry.get("packets", 0)),
                drops=int(entry.get("drops", 0)),
                backlog=int(entry.get("backlog", 0)),
            )
        )
    return out


def parse_socket_drops(
    text: str, interfaces: Mapping[str, tuple[str, int]], t: float
) -> list[IngressDrop]:
    """The drops of :data:`SWITCH_PROCESS`'s packet sockets on ``interfaces`` in
    :data:`SOCKET_COMMAND`'s output (``skmem``'s ``d``: packets the kernel received for
    the socket and found its receive buffer full); other processes' sockets (a capture
    on a switch port) and other interfaces are skipped, several sockets on a port add."""
    drops: dict[tuple[str, int], int] = {}
    for line in (text or "").splitlines():
        match = _SOCKET_LINE.match(line.strip())
        if match is None or match["proc"] != SWITCH_PROCESS:
            continue
        where = interfaces.get(match["dev"])
        counted = re.search(r"(?:^|,)d(\d+)(?:,|$)", match["mem"])
        if where is None or counted is None:
            continue
        drops[where] = drops.get(where, 0) + int(counted[1])
    return [IngressDrop(t, switch, port, n) for (switch, port), n in sorted(drops.items())]


def unread_per_port(drops: Iterable[IngressDrop]) -> dict[tuple[str, int], int]:
    """Per switch port, the packets its switch-process socket dropped from its first
    sample to its last (a count that went back, the socket opened again, counts from
    where it restarted); ports that dropped none are left out."""
    out = {}
    for port, values in ingress_rows(drops).items():
        n = sum(max(0, b[1] - a[1]) for a, b in itertools.pairwise(values))
        if n:
            out[port] = n
    return out


class QueueSampler(PeriodicSampler):
    """Samples every switch port's egress queue every ``interval`` seconds in a daemon
    thread (one sample on start and one on stop, so that the run is spanned). ``nodes``:
    one switch per machine the fabric's switches live on (where the command runs).
    ``namespaces`` (GPU -> its ``/proc/PID/ns/net``) and ``nics`` (GPU -> interface ->
    model port): the GPUs whose NIC ports' queues are sampled too, over netlink."""

    name = "queue-sampler"

    def __init__(
        self,
        executor: CommandExecutor,
        interfaces: Mapping[str, tuple[str, int]],
        nodes: Sequence[str],
        interval: float = QUEUE_INTERVAL,
        namespaces: Mapping[str, str] | None = None,
        nics: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        super().__init__(interval)
        self.executor = executor
        self.interfaces = dict(interfaces)
        self.nodes = list(nodes)
        self.namespaces = {g: p for g, p in (namespaces or {}).items() if (nics or {}).get(g)}
        self.nics = {g: dict(ports) for g, ports in (nics or {}).items()}
        self.samples: list[QueueCounter] = []
        self.ingress: list[IngressDrop] = []  # the switch process's sockets' drops
        self.failures = 0  # samples a machine did not answer (tc missing, a timeout)
        self.socket_failures = 0  # socket samples a machine did not answer (ss missing)
        self.nic_failures = 0  # GPU samples not read (its namespace gone, a netlink error)
        self.nic_error: str | None = None  # why the GPUs' sockets could not be opened
        # GPU -> (its netlink socket, ifindex -> model port), while started
        self._nic_sockets: dict[str, tuple[socket.socket, dict[int, int]]] = {}

    @classmethod
    def for_emulation(
        cls,
        emulation: CommandExecutor,
        description: FabricDescription,
        interval: float = QUEUE_INTERVAL,
    ) -> QueueSampler:
        """A sampler for ``emulation``'s switches: one command per machine that holds some
        (an emulation over several machines says which holds a node: ``machine_of``)."""
        switches = sorted(description.fabric.switches)
        machine_of = getattr(emulation, "machine_of", None)
        by_machine: dict[str, str] = {}
        for switch in switches:
            by_machine.setdefault(machine_of(switch) if callable(machine_of) else "", switch)
        interfaces = switch_interfaces(description)
        netns_paths = getattr(emulation, "netns_paths", None)
        namespaces = netns_paths() if callable(netns_paths) else None
        nics = nic_interfaces(description) if namespaces else None
        return cls(emulation, interfaces, list(by_machine.values()), interval, namespaces, nics)

    def start(self) -> Self:
        """Open a netlink socket inside each sampled GPU's namespace, then sample. A
        namespace that cannot be entered leaves the GPU ends unsampled (said in
        :attr:`nic_error`), not the run undone."""
        if self.namespaces and not self._nic_sockets:
            try:
                self._nic_sockets = opened_in(self.namespaces, self._nic_socket, _close_nic)
            except OSError as err:
                self.nic_error = f"the GPUs' NIC queues are not sampled: {err}"
        return super().start()

    def _nic_socket(self, gpu: str) -> tuple[socket.socket, dict[int, int]]:
        """Made inside ``gpu``'s namespace: its socket, and its NIC ports' ifindexes."""
        ports = self.nics[gpu]
        indexes = {i: ports[name] for i, name in socket.if_nameindex() if name in ports}
        return qdiscstats.open_socket(), indexes

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            sockets, self._nic_sockets = self._nic_sockets, {}
            for made in sockets.values():
                _close_nic(made)

    def sample(self) -> None:
        """One sample of every switch port's queue, one command per machine, then every
        sampled GPU's NIC ports' queues."""
        for node in self.nodes:
            t = time.time()
            try:
                done = self.executor.run(node, QDISC_COMMAND, timeout=10.0)
            except Exception:  # OSError, a timeout, an SSH error on another machine's
                done = None  # a lost sample must not end the run: counted, said at the end
            if done is None or done.returncode != 0:
                self.failures += 1
                continue
            rows = parse_qdiscs(done.stdout, self.interfaces, t)
            with self._lock:
                self.samples += rows
            drops = self._socket_drops(node)
            with self._lock:
                self.ingress += drops
        for gpu, (sock, indexes) in self._nic_sockets.items():
            t = time.time()
            try:
                stats = qdiscstats.dump(sock)
            except OSError:
                self.nic_failures += 1
                continue
            rows = [
                QueueCounter(t, gpu, indexes[q.ifindex], q.packets, q.drops, q.backlog)
                for q in stats
                if q.root and q.ifindex in indexes
            ]
            with self._lock:
                self.samples += rows

    def _socket_drops(self, node: str) -> list[IngressDrop]:
        """One sample of the switch process's packet socket drops on the machine of
        ``node`` (none when ``ss`` did not answer: counted in :attr:`socket_failures`)."""
        t = time.time()
        try:
            done = self.executor.run(node, SOCKET_COMMAND, timeout=10.0)
        except Exception:  # as a lost queue sample: counted, said at the end
            done = None
        if done is None or done.returncode != 0:
            self.socket_failures += 1
            return []
        return parse_socket_drops(done.stdout, self.interfaces, t)

    def snapshot(self) -> list[QueueCounter]:
        with self._lock:
            return list(self.samples)

    def ingress_snapshot(self) -> list[IngressDrop]:
        """The switch ports' packet socket drops sampled so far."""
        with self._lock:
            return list(self.ingress)


def _close_nic(made: tuple[socket.socket, dict[int, int]]) -> None:
    made[0].close()


def queue_rows(
    counters: Iterable[QueueCounter],
) -> dict[tuple[str, int], list[tuple[float, int, int, int]]]:
    """Per (switch, port), its samples as the diagnosis reads them: (t, packets sent,
    dropped, bytes held), oldest first."""
    rows: dict[tuple[str, int], list[tuple[float, int, int, int]]] = {}
    for q in counters:
        rows.setdefault((q.switch, q.port), []).append((q.t, q.packets, q.drops, q.backlog))
    for values in rows.values():
        values.sort()
    return rows


def ingress_rows(drops: Iterable[IngressDrop]) -> dict[tuple[str, int], list[tuple[float, int]]]:
    """Per (switch, port), its socket's drop samples as the diagnosis reads them: (t,
    cumulative drops), oldest first."""
    rows: dict[tuple[str, int], list[tuple[float, int]]] = {}
    for d in drops:
        rows.setdefault((d.switch, d.port), []).append((d.t, d.drops))
    for values in rows.values():
        values.sort()
    return rows
