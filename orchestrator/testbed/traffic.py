"""TCP flows between the GPUs of a running emulation, measured the way fidelity checks need.

::

    flows = [Flow("p0s0g0", "p1s0g0"), Flow("p0s1g0", "p1s0g0")]
    result = run_flows(emu, flows, duration=8, omit=2)
    result.flows[0].goodput_bps          # receiver's in-order bytes over the common window
    result.aggregate_bps, result.jain    # sum, Jain's fairness index
    result.busiest()                     # the link that carried most (its configured rate)
    result.path(result.flows[0].goodput_bps / 2)   # switch chain the bytes took

How (used by ``benchmarks/fidelity.py`` and ``astral calibrate``):

- every flow is one ``iperf3`` client in the source GPU's namespace and a one-off
  ``iperf3 -s -1`` server of its own (own port) in the destination's, both started with
  :meth:`Emulation.popen <orchestrator.emulation.network.Emulation.popen>` so that the run record
  stops them however the measurement ends;
- goodput is read at the receivers: ``tcp_info.bytes_received`` (``ss -ti``: in-order
  payload, retransmissions not counted) at the start and the end of one common window,
  from ``omit`` seconds after the start (slow start, clients starting a little apart) to
  about a second before the first client can end, so all flows are compared over the same
  time;
- over the same window: bytes sent by the HTB root qdisc of every shaped interface the
  flows leave by (every switch egress in the root namespace, and the sending GPUs' NIC
  ports), so a result also says which links carried the flows and how busy each was *as
  tc counts frames* (Ethernet header + IP packet, no preamble, gap or FCS); the share of
  all CPUs busy (/proc/stat, everything on the machine) and the CPU ovs-vswitchd used.

The parsing helpers are pure and unit-tested; :func:`run_flows` needs root and a running
:class:`~orchestrator.emulation.network.Emulation`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.emulation.sendbuffer import PIDFILE
from topologies.errors import EmulationError

if TYPE_CHECKING:
    from orchestrator.emulation.network import Emulation

#: First iperf3 server port; flow i listens on BASE_PORT + i in its destination.
BASE_PORT = 5301
VSWITCHD_PIDFILE = str(PIDFILE)
LISTEN_TIMEOUT = 15.0


@dataclass(frozen=True)
class Flow:
    """One TCP flow from GPU ``src`` to GPU ``dst``; ``cport`` pins the client's port."""

    src: str
    dst: str
    cport: int | None = None


@dataclass(frozen=True)
class FlowResult:
    flow: Flow
    #: receiver's in-order bytes over the common window, bit/s
    goodput_bps: float
    #: segments the sender retransmitted over its whole test (iperf3)
    retransmits: int = 0


@dataclass(frozen=True)
class LinkDirectionLoad:
    """What one shaped link direction carried: the egress qdisc of ``intf`` at ``sender``."""

    intf: str
    sender: str
    receiver: str
    kind: str  # topologies.model.LinkKind value
    rate_bps: float  # configured (emulated) rate
    sent_bps: float  # frames as tc counts them (Ethernet header + IP packet)
    drops: int = 0

    @property
    def utilization(self) -> float:
        return self.sent_bps / self.rate_bps if self.rate_bps else 0.0


@dataclass
class TrafficResult:
    """One measurement: flows, link loads, CPU, over a window of ``window_s`` seconds."""

    window_s: float
    flows: list[FlowResult]
    links: list[LinkDirectionLoad] = field(default_factory=list)
    cpu_busy: float = 0.0  # share of all CPUs busy (1.0 = all), everything on the machine
    vswitchd_cores: float = 0.0  # CPU ovs-vswitchd used, in cores
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)  # at the end of the window

    @property
    def aggregate_bps(self) -> float:
        return sum(f.goodput_bps for f in self.flows)

    @property
    def jain(self) -> float:
        return jain([f.goodput_bps for f in self.flows])

    @property
    def retransmits(self) -> int:
        return sum(f.retransmits for f in self.flows)

    def busiest(self, kinds: Sequence[str] | None = None) -> LinkDirectionLoad | None:
        """The link (of ``kinds``, default any) with the highest utilization."""
        chosen = [link for link in self.links if kinds is None or link.kind in kinds]
        return max(chosen, key=lambda link: link.utilization, default=None)

    def path(self, min_bps: float) -> list[str]:
        """The node chain of the links that carried at least ``min_bps`` (one flow's path
        when only one flow ran: its reverse ACK stream stays far below its goodput)."""
        return chain([(x.sender, x.receiver) for x in self.links if x.sent_bps >= min_bps])


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2); 1.0 when all are equal."""
    if not values or not any(values):
        return 0.0
    return sum(values) ** 2 / (len(values) * sum(x * x for x in values))


def chain(hops: Sequence[tuple[str, str]]) -> list[str]:
    """Order directed links into one path ``[a, b, c, ...]`` (empty if they do not form
    exactly one simple chain)."""
    if not hops:
        return []
    nxt = dict(hops)
    if len(nxt) != len(hops):
        return []
    starts = set(nxt) - set(nxt.values())
    if len(starts) != 1:
        return []
    path = [starts.pop()]
    while path[-1] in nxt and len(path) <= len(hops):
        path.append(nxt[path[-1]])
    return path if len(path) == len(hops) + 1 else []


# --- parsing (pure) ------------------------------------------------------------------------

_ADDR = re.compile(r"^(?P<ip>\[?[0-9a-fA-F.:]+\]?):(?P<port>\d+)$")
_RECEIVED = re.compile(r"\bbytes_received:(\d+)")


def parse_ss(output: str) -> dict[int, int]:
    """Local port -> largest ``bytes_received`` among its connections, from
    ``ss -tinH state established`` (iperf3's control connection shares the data
    connection's port and receives a few hundred bytes: the largest is the data)."""
    received: dict[int, int] = {}
    port: int | None = None
    for line in output.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            fields = line.split()
            port = None
            # state filter given: Recv-Q Send-Q Local Peer [Process]
            if len(fields) >= 4:
                match = _ADDR.match(fields[2])
                if match:
                    port = int(match.group("port"))
            continue
        if port is None:
            continue
        match = _RECEIVED.search(line)
        if match:
            received[port] = max(received.get(port, 0), int(match.group(1)))
    return received


def parse_qdiscs(document: str) -> dict[str, tuple[int, int]]:
    """Interface -> (bytes sent, drops) of its root qdisc and children, from
    ``tc -s -j qdisc show``. Bytes are the root's (HTB counts what it dequeued); drops
    are summed over the root and its leaves (the leaf FIFO is where packets are dropped)."""
    out: dict[str, tuple[int, int]] = {}
    for qdisc in json.loads(document or "[]"):
        dev = qdisc.get("dev")
        if not isinstance(dev, str):
            continue
        sent, drops = out.get(dev, (0, 0))
        if qdisc.get("root"):
            sent = int(qdisc.get("bytes", 0))
        drops += int(qdisc.get("drops", 0))
        out[dev] = (sent, drops)
    return out


def iperf_report(output: str) -> dict[str, Any]:
    """iperf3 -J's report; EmulationError with iperf3's own message if it failed."""
    try:
        report: dict[str, Any] = json.loads(output)
    except ValueError:
        raise EmulationError(f"iperf3 printed no report: {output.strip()[:300]!r}") from None
    if "error" in report:
        raise EmulationError(f"iperf3: {report['error']}")
    return report


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(x) for x in stat.readline().split()[1:9]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def process_ticks(pidfile: str = VSWITCHD_PIDFILE) -> int:
    """utime + stime (all threads) of the process in ``pidfile``, clock ticks; 0 if unknown."""
    try:
        with open(pidfile, encoding="ascii") as handle:
            pid = int(handle.read().strip())
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


# --- measuring -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Watched:
    """A shaped interface whose egress counters are read; ``gpu`` None: root namespace."""

    intf: str
    gpu: str | None
    sender: str
    receiver: str
    kind: str
    rate_bps: float


def _watched(emu: Emulation, senders: Sequence[str]) -> list[_Watched]:
    """Every switch egress (root namespace) and the sending GPUs' NIC/NVLink egress."""
    assert emu.wiring is not None
    out = []
    for veth in emu.wiring.veths:
        kind = veth.kind.value
        out.append(_Watched(veth.a_intf, None, veth.a_node, veth.b_node, kind, veth.rate_bps))
        if veth.b_host is None:
            out.append(_Watched(veth.b_intf, None, veth.b_node, veth.a_node, kind, veth.rate_bps))
        elif veth.b_host in senders:
            out.append(
                _Watched(veth.b_intf, veth.b_host, veth.b_node, veth.a_node, kind, veth.rate_bps)
            )
    return out


class _Sampler:
    """Reads receivers' bytes and qdisc counters, several namespaces at once."""

    def __init__(self, emu: Emulation, receivers: Sequence[str], watched: Sequence[_Watched]):
        self.emu = emu
        self.receivers = list(dict.fromkeys(receivers))
        self.watched = watched
        self.gpus_with_links = sorted({w.gpu for w in watched if w.gpu is not None})

    def _spawn(self, gpu: str, argv: list[str]) -> subprocess.Popen[bytes]:
        process: subprocess.Popen[bytes] = self.emu.host(gpu).popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        return process

    def sample(self) -> tuple[dict[str, tuple[float, dict[int, int]]], dict[str, tuple[int, int]]]:
        """({receiver: (time, {port: bytes})}, {intf: (bytes, drops)})."""
        began = time.monotonic()
        ss = {g: self._spawn(g, ["ss", "-tinH", "state", "established"]) for g in self.receivers}
        tc = {g: self._spawn(g, ["tc", "-s", "-j", "qdisc", "show"]) for g in self.gpus_with_links}
        root = subprocess.run(
            ["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True, check=False
        )
        received = {}
        for gpu, process in ss.items():
            out, _ = process.communicate(timeout=30)
            # the midpoint between start and exit: when ss read the sockets, within a few ms
            received[gpu] = ((began + time.monotonic()) / 2, parse_ss(out.decode()))
        counters = parse_qdiscs(root.stdout)
        for gpu, process in tc.items():
            out, _ = process.communicate(timeout=30)
            ours = {w.intf for w in self.watched if w.gpu == gpu}
            counters.update({k: v for k, v in parse_qdiscs(out.decode()).items() if k in ours})
        return received, counters


@contextmanager
def _servers(emu: Emulation, flows: Sequence[Flow]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One one-off iperf3 server per flow in its destination, listening when yielded."""
    started = []
    try:
        for i, flow in enumerate(flows):
            argv = ["iperf3", "-s", "-1", "-p", str(BASE_PORT + i)]
            started.append(
                emu.popen(
                    flow.dst,
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        wanted: dict[str, set[int]] = {}
        for i, flow in enumerate(flows):
            wanted.setdefault(flow.dst, set()).add(BASE_PORT + i)
        deadline = time.monotonic() + LISTEN_TIMEOUT
        while wanted:
            for gpu in list(wanted):
                out = emu.host(gpu).popen(["ss", "-ltnH"], stdin=subprocess.DEVNULL)
                text = out.communicate(timeout=30)[0].decode()
                listening = {int(m) for m in re.findall(r":(\d+)\s", text)}
                wanted[gpu] -= listening
                if not wanted[gpu]:
                    del wanted[gpu]
            if wanted and time.monotonic() > deadline:
                raise EmulationError(f"iperf3 servers not listening after {LISTEN_TIMEOUT:g} s")
            if wanted:
                time.sleep(0.05)
        yield started
    finally:
        for process in started:
            _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_flows(
    emu: Emulation,
    flows: Sequence[Flow],
    *,
    duration: float = 8.0,
    omit: float = 2.0,
    congestion_control: str | None = None,
) -> TrafficResult:
    """Run ``flows`` at once on ``emu`` and measure them over one common window of about
    ``duration`` seconds, ``omit`` seconds after they started (see the module docstring)."""
    if not flows:
        raise ValueError("no flows to run")
    if duration < 1.5 or omit < 0:
        raise ValueError("need duration >= 1.5 s and omit >= 0")
    description = emu.description
    assert description is not None
    watched = _watched(emu, [f.src for f in flows])
    sampler = _Sampler(emu, [f.dst for f in flows], watched)
    clients: list[tuple[Flow, subprocess.Popen[bytes]]] = []
    with _servers(emu, flows):
        start = time.monotonic()  # no client can end before start + omit + duration
        try:
            for i, flow in enumerate(flows):
                ip = description.addresses[flow.dst].fabric_ip
                argv = ["iperf3", "-c", ip, "-p", str(BASE_PORT + i), "-J"]
                argv += ["-t", f"{duration + omit + 1:g}"]
                if flow.cport is not None:
                    argv += ["--cport", str(flow.cport)]
                if congestion_control:
                    argv += ["-C", congestion_control]
                clients.append((flow, emu.popen(flow.src, argv, stdin=subprocess.DEVNULL)))
            time.sleep(max(0.0, start + omit - time.monotonic()))
            c0, v0 = cpu_times(), process_ticks()
            r0, q0 = sampler.sample()
            time.sleep(max(0.5, start + omit + duration - time.monotonic()))
            c1, v1 = cpu_times(), process_ticks()
            r1, q1 = sampler.sample()
            loadavg = os.getloadavg()
            results = []
            for i, (flow, process) in enumerate(clients):
                port = BASE_PORT + i
                (ta, before), (tb, after) = r0[flow.dst], r1[flow.dst]
                got = after.get(port, 0) - before.get(port, 0)
                if after.get(port, 0) == 0:
                    raise EmulationError(
                        f"flow {flow.src} -> {flow.dst} (port {port}) received nothing: "
                        "it did not connect or ended early"
                    )
                out, err = process.communicate(timeout=duration + omit + 60)
                report = iperf_report(out.decode() or err.decode())
                sent = report.get("end", {}).get("sum_sent", {})
                results.append(
                    FlowResult(flow, got * 8 / (tb - ta), int(sent.get("retransmits", 0)))
                )
        finally:
            for _, process in clients:
                _stop(process)
    span = max(1e-6, _span(r0, r1))
    links = [
        LinkDirectionLoad(
            w.intf,
            w.sender,
            w.receiver,
            w.kind,
            w.rate_bps,
            (q1.get(w.intf, (0, 0))[0] - q0.get(w.intf, (0, 0))[0]) * 8 / span,
            q1.get(w.intf, (0, 0))[1] - q0.get(w.intf, (0, 0))[1],
        )
        for w in watched
    ]
    return TrafficResult(
        window_s=span,
        flows=results,
        links=links,
        cpu_busy=(c1[0] - c0[0]) / max(1, c1[1] - c0[1]),
        vswitchd_cores=(v1 - v0) / os.sysconf("SC_CLK_TCK") / span,
        loadavg=(loadavg[0], loadavg[1], loadavg[2]),
    )


def _span(
    r0: Mapping[str, tuple[float, dict[int, int]]], r1: Mapping[str, tuple[float, dict[int, int]]]
) -> float:
    """The window's length: the mean over receivers of their two sample times' distance."""
    spans = [r1[g][0] - r0[g][0] for g in r0 if g in r1]
    return sum(spans) / len(spans) if spans else 0.0


def planned_flows(
    emu: Emulation,
    pairs: Sequence[tuple[str, str]],
    *,
    host_ports: str,
    paths: Mapping[str, Any] | None,
) -> tuple[list[Flow], int]:
    """``pairs`` (source GPU, destination GPU; a repeated pair is another connection of the
    same two GPUs) as flows whose source ports carry out ``host_ports``
    (orchestrator.testbed.hostports) and, when ``paths`` (the controller's paths document
    under a policy that pins them) is given, a path each: the least loaded by the flows
    placed before it (orchestrator.testbed.pinning). Flow i is planned for the iperf3
    server :func:`run_flows` gives it (``BASE_PORT + i``), around the ports earlier flows
    still hold (iperf3's connections linger in TIME_WAIT). Also how many found no port:
    those keep an ephemeral one (``cport`` None), as does every flow when nothing is
    planned (``hash`` under a policy that does not pin paths)."""
    from orchestrator.testbed.pinning import held_ports, plan_ports
    from orchestrator.worker.spec import workers_from_description

    description = emu.description
    assert description is not None
    workers = workers_from_description(description)
    rank = {w.host: w.rank for w in workers}
    seen: dict[tuple[str, str], int] = {}
    keys = []
    for pair in pairs:
        keys.append((rank[pair[0]], rank[pair[1]], seen.get(pair, 0)))
        seen[pair] = seen.get(pair, 0) + 1
    plan = plan_ports(
        emu,
        description,
        workers,
        [keys],
        {key: BASE_PORT + i for i, key in enumerate(keys)},
        host_ports=host_ports,
        paths=paths,
        taken=held_ports(emu, workers),
    )
    flows = [Flow(s, d, plan.ports.get(key)) for (s, d), key in zip(pairs, keys, strict=True)]
    return flows, len(plan.unpinned)
