"""Raw userspace-OVS test networks: a chain of bridges between namespaces, shaped, measured.

Used to find and check the link-shaping recipe (docs/fidelity.md) and meant for
``astral calibrate``: it builds the smallest network that exercises what the emulation
exercises (veth pairs, Open vSwitch's userspace datapath, HTB on every link end) without
Mininet, a controller or a fabric description, runs iperf3 flows and returns per-flow
goodput plus what the shapers counted.

Shape of the network (``switches=3, pairs=2, lanes=2``)::

    s0 ---+                                      +--- r0
          b1 ==lane0== b2 ==lane0== b3
    s1 ---+   ==lane1==    ==lane1==     +--- r1

    s<i>, r<i>  namespaces <prefix>s<i> / <prefix>r<i>, one veth each (10.77.1.i / 10.77.2.i)
    b<j>        bridges <prefix>b<j>, datapath_type=netdev, fail_mode=secure
    lanes       parallel trunk links between consecutive bridges; pair i uses lane i % lanes

``lanes=1`` makes every flow share one trunk (a shared bottleneck); ``lanes=pairs`` gives
each flow a path of its own through the same bridges (a load test of the datapath).
Forwarding is static: one OpenFlow rule per destination (IP and ARP) per bridge, so no
learning, no flooding and no controller.

Every link end is shaped at egress with the given shaper (the recipe of
``orchestrator.emulation.shaping`` by default, any ``(intf, rate_bps) -> argv lists`` for
comparisons), exactly as the emulation shapes both ends of every link, and only after the
port has joined its bridge
(Open vSwitch deletes a root qdisc it finds on a port when the port is added).

The Open vSwitch instance is the system's by default; :class:`OvsInstance` points at
another one (for instance a private ovs-vswitchd running in its own namespace, so that a
measurement is not disturbed by, and does not disturb, other users of the system one).

The context manager removes exactly what it created, in reverse order, on exceptions and
Ctrl-C too: the iperf3/ping processes it started (by pid), its bridges, its veths and its
namespaces. It never cleans up by name pattern. Needs root, ``ip``, ``tc``, ``ethtool``,
``ovs-vsctl``, ``ovs-ofctl``, ``ovs-appctl`` and ``iperf3``; Open vSwitch must be running.

Example (goodput / R is at most TCP_PAYLOAD_SHARE_WITH_TIMESTAMPS, 0.956)::

    with RawChain(switches=5, pairs=1, host_rate_bps=20e6, trunk_rate_bps=20e6) as net:
        result = net.run(duration=10)
    print(result.flows[0].goodput_bps / 20e6)

Command line (one measurement, JSON lines on stdout), with the project's virtual
environment, which has the project installed::

    sudo .venv/bin/python benchmarks/_rawnet.py --switches 5 --pairs 8 --rate 25M --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.emulation.shaping import DEFAULT_RECIPE, ShapingRecipe, shaping_commands
from orchestrator.testbed.traffic import cpu_times, jain, process_ticks
from topologies.errors import EmulationError
from topologies.units import parse_rate

Argv = Sequence[str]
#: Renders the tc commands for one interface: (intf, rate_bps, host_side) -> argv lists.
Shaper = Callable[[str, float, bool], Sequence[Argv]]

_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,3}$")
IPERF_PORT = 5201
#: Goodput ceiling of TCP over 1500-byte frames *with* timestamps (12 option bytes leave 1448
#: of a 1514-byte frame), as a share of the frame rate tc's HTB accounts (dst+src+type+payload,
#: no preamble, FCS or gap). The chain's namespaces keep the kernel's TCP defaults, timestamps
#: on, unlike the emulated GPUs (orchestrator.emulation.hostconfig turns them off: 1460/1514,
#: topologies.units.TCP_PAYLOAD_SHARE): the raw-chain measurements in docs/fidelity.md were
#: taken that way, and a new run stays comparable with them.
TCP_PAYLOAD_SHARE_WITH_TIMESTAMPS = 1448 / 1514


def recipe_shaper(recipe: ShapingRecipe = DEFAULT_RECIPE, mtu: int = 1500) -> Shaper:
    """The project's shaper (orchestrator.emulation.shaping) with the given recipe."""

    def shaper(intf: str, rate_bps: float, host_side: bool) -> list[list[str]]:
        return shaping_commands(intf, rate_bps, recipe, mtu=mtu, host_side=host_side)

    return shaper


default_shaper = recipe_shaper()


def tclink_shaper(intf: str, rate_bps: float, host_side: bool = False) -> list[list[str]]:
    """What Mininet 2.3.0 ``TCLink(bw=...)`` runs on each interface (link.py, TCIntf.config
    and bwCmds, HTB branch), for comparison: note no ceil, no cburst, no leaf qdisc."""
    mbit = f"{rate_bps / 1e6:f}Mbit"
    htb_class = ["parent", "5:0", "classid", "5:1", "htb", "rate", mbit, "burst", "15k"]
    return [
        ["ethtool", "-K", intf, "gro", "off", "tx", "on", "rx", "on"],
        ["tc", "qdisc", "add", "dev", intf, "root", "handle", "5:0", "htb", "default", "1"],
        ["tc", "class", "add", "dev", intf, *htb_class],
    ]


@dataclass(frozen=True)
class OvsInstance:
    """Which ovs-vswitchd to use: the system's (defaults) or a private one.

    ``netns`` is the namespace ovs-vswitchd runs in (switch-side interfaces must live
    there); ``rundir`` its OVS_RUNDIR, holding ``db.sock``, the pidfile and bridge sockets.
    """

    netns: str | None = None
    rundir: str | None = None

    def env(self) -> dict[str, str] | None:
        return None if self.rundir is None else {**os.environ, "OVS_RUNDIR": self.rundir}

    def vsctl(self) -> list[str]:
        db = [] if self.rundir is None else [f"--db=unix:{self.rundir}/db.sock"]
        return ["ovs-vsctl", *db]

    def pidfile(self) -> str:
        return f"{self.rundir or '/var/run/openvswitch'}/ovs-vswitchd.pid"


SYSTEM_OVS = OvsInstance()


def _run(
    argv: Argv, ns: str | None = None, env: Mapping[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    return subprocess.run(full, input=stdin, capture_output=True, text=True, check=False, env=env)


def userspace_tso(ovs: OvsInstance = SYSTEM_OVS) -> bool:
    """Whether ovs-vswitchd is configured with ``userspace-tso-enable=true``."""
    argv = [*ovs.vsctl(), "--if-exists", "get", "Open_vSwitch", "."]
    out = _run([*argv, "other_config:userspace-tso-enable"]).stdout
    return out.strip().strip('"') == "true"


def datapath_ports(ovs: OvsInstance = SYSTEM_OVS) -> int:
    """Ports in the userspace datapath (all bridges, anyone's): its non-PMD thread polls
    every one of them on each wake-up, so this count sets the per-packet cost."""
    out = _run(["ovs-appctl", "dpctl/show", "netdev@ovs-netdev"], env=ovs.env()).stdout
    return sum(1 for line in out.splitlines() if line.strip().startswith("port "))


@dataclass(frozen=True)
class FlowResult:
    """One iperf3 flow, measured at the receiver."""

    pair: int
    #: in-order bytes the receiver got over the common window (see RawChain.run), bit/s
    goodput_bps: float
    #: segments the sender retransmitted over the whole test
    retransmits: int
    #: iperf3's own receiver figure over the flow's whole test, start-up included
    whole_test_bps: float = 0.0


@dataclass(frozen=True)
class RunResult:
    """One measurement: flows, what the shapers sent, CPU use and RTT under load."""

    duration: float
    flows: list[FlowResult]
    #: bit/s each shaped trunk interface's root qdisc sent during the run, by interface
    #: (frames as tc counts them: Ethernet header + IP packet, no FCS/preamble/gap).
    trunk_l2_bps: dict[str, float] = field(default_factory=dict)
    #: Packets the trunk and switch-side host qdiscs dropped during the run.
    qdisc_drops: int = 0
    #: Share of all CPUs busy during the run (1.0 = every core busy), from /proc/stat;
    #: includes everything else running on the machine.
    cpu_busy: float = 0.0
    #: CPU time ovs-vswitchd used during the run, in cores (1.0 = one core all the time).
    vswitchd_cores: float = 0.0
    #: Ports in the userspace datapath at the start (ours and everyone else's).
    datapath_ports: int = 0
    #: ping from s0 to r0 during the run (ms): min/avg/max, empty if not probed.
    rtt_ms: dict[str, float] = field(default_factory=dict)

    @property
    def aggregate_bps(self) -> float:
        return sum(f.goodput_bps for f in self.flows)

    @property
    def jain(self) -> float:
        """Jain's fairness index of the flows' goodputs (1.0 = perfectly equal)."""
        return jain([f.goodput_bps for f in self.flows])


class RawChain:
    """A shaped chain of userspace OVS bridges between sender and receiver namespaces.

    Args:
        switches: bridges in the chain (5 = GPU-ToR-agg-core-agg-ToR-GPU).
        pairs: sender/receiver namespace pairs (one flow each).
        lanes: parallel trunks between consecutive bridges; pair i uses lane i % lanes.
        host_rate_bps: rate of each host link (both ends shaped); None = unshaped.
        trunk_rate_bps: rate of each trunk link (both ends shaped); None = unshaped.
        shaper: renders tc argv lists for one interface; default the project's recipe.
        host_offloads: ethtool -K settings for the host-side veths, e.g. ``{"tx": "off"}``;
            None = ``{"tx": "off"}`` unless OVS runs with userspace TSO (without it, TCP
            checksums are never filled in and TCP does not pass at all).
        switch_offloads: ethtool -K settings for the bridge-side veths (default none).
        prefix: 1-4 lowercase characters starting every name created.
        mtu: MTU of every veth.
        ovs: which Open vSwitch to use (default the system's).
    """

    def __init__(
        self,
        switches: int = 3,
        pairs: int = 1,
        lanes: int = 1,
        host_rate_bps: float | None = None,
        trunk_rate_bps: float | None = None,
        shaper: Shaper = default_shaper,
        host_offloads: Mapping[str, str] | None = None,
        switch_offloads: Mapping[str, str] | None = None,
        prefix: str = "fx",
        mtu: int = 1500,
        ovs: OvsInstance = SYSTEM_OVS,
    ) -> None:
        if not _PREFIX.match(prefix):
            raise ValueError(f"prefix must match {_PREFIX.pattern}, got {prefix!r}")
        if not (1 <= switches <= 9 and 1 <= pairs <= 99 and 1 <= lanes <= 40):
            raise ValueError("need 1 <= switches <= 9, 1 <= pairs <= 99, 1 <= lanes <= 40")
        self.switches = switches
        self.pairs = pairs
        self.lanes = lanes
        self.host_rate_bps = host_rate_bps
        self.trunk_rate_bps = trunk_rate_bps
        self.shaper = shaper
        self.host_offloads = host_offloads
        self.switch_offloads = dict(switch_offloads or {})
        self.prefix = prefix
        self.mtu = mtu
        self.ovs = ovs
        self.swns = ovs.netns  # namespace of every switch-side interface (None = root)
        self._undo: list[tuple[Argv, str | None]] = []  # run in reverse order on close
        self._procs: list[subprocess.Popen[str]] = []
        self.trunk_intfs: list[str] = []
        self.switch_host_intfs: list[str] = []

    # -- naming -------------------------------------------------------------------------
    def ns(self, side: str, i: int) -> str:
        """Namespace of sender (``side='s'``) or receiver (``'r'``) number ``i``."""
        return f"{self.prefix}{side}{i}"

    def ip(self, side: str, i: int) -> str:
        return f"10.77.{1 if side == 's' else 2}.{i + 1}"

    def bridge(self, j: int) -> str:
        return f"{self.prefix}b{j + 1}"

    # -- command helpers ------------------------------------------------------------------
    def sh(self, argv: Argv, ns: str | None = None, stdin: str = "") -> str:
        """Run ``argv`` in namespace ``ns`` (None = root); raise EmulationError on failure."""
        env = self.ovs.env() if argv and str(argv[0]).startswith("ovs-") else None
        proc = _run(argv, ns, env, stdin)
        if proc.returncode != 0:
            where = f" in {ns}" if ns else ""
            raise EmulationError(f"{' '.join(argv)}{where} failed: {proc.stderr.strip()}")
        return proc.stdout

    def _shape(self, intf: str, rate: float | None, ns: str | None, host_side: bool) -> None:
        if rate is not None:
            for argv in self.shaper(intf, rate, host_side):
                self.sh(argv, ns)

    def _ethtool(self, intf: str, settings: Mapping[str, str], ns: str | None) -> None:
        if settings:
            self.sh(["ethtool", "-K", intf, *[x for kv in settings.items() for x in kv]], ns)

    def _veth(self, a: str, b: str) -> None:
        """A veth pair in the switch namespace. Deleting ``b`` (which stays there) removes
        both ends at once, whereas interfaces of a deleted namespace go away asynchronously
        and can still hold the name when the next run starts."""
        self.sh(
            ["ip", "link", "add", a, "mtu", str(self.mtu), "type", "veth", "peer", "name", b],
            self.swns,
        )
        self._undo.append((["ip", "link", "del", b], self.swns))
        self.sh(["ip", "link", "set", b, "mtu", str(self.mtu)], self.swns)
        for intf in (a, b):
            self.sh(["sysctl", "-qw", f"net.ipv6.conf.{intf}.disable_ipv6=1"], self.swns)

    def _port(self, j: int, intf: str, ofport: int) -> None:
        self.sh(
            [
                *self.ovs.vsctl(),
                "add-port",
                self.bridge(j),
                intf,
                "--",
                "set",
                "Interface",
                intf,
                f"ofport_request={ofport}",
            ]
        )
        self.sh(["ip", "link", "set", intf, "up"], self.swns)

    # -- build ----------------------------------------------------------------------------
    def __enter__(self) -> RawChain:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        host_off = self.host_offloads
        if host_off is None:
            host_off = {} if userspace_tso(self.ovs) else {"tx": "off"}
        for j in range(self.switches):
            br = self.bridge(j)
            self.sh(
                [
                    *self.ovs.vsctl(),
                    "add-br",
                    br,
                    "--",
                    "set",
                    "Bridge",
                    br,
                    "datapath_type=netdev",
                    "fail_mode=secure",
                ]
            )
            self._undo.append(([*self.ovs.vsctl(), "--if-exists", "del-br", br], None))
        # hosts: s<i> on the first bridge (ofport 100+i), r<i> on the last (ofport 200+i)
        for side, j, base in (("s", 0, 100), ("r", self.switches - 1, 200)):
            for i in range(self.pairs):
                ns = self.ns(side, i)
                self.sh(["ip", "netns", "add", ns])
                self._undo.append((["ip", "netns", "del", ns], None))
                inner, outer = f"{ns}h", f"{ns}x"
                self._veth(inner, outer)
                self.sh(["ip", "link", "set", inner, "netns", ns], self.swns)
                self.sh(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"], ns)
                self.sh(["ip", "addr", "add", f"{self.ip(side, i)}/16", "dev", inner], ns)
                self.sh(["ip", "link", "set", inner, "up"], ns)
                self.sh(["ip", "link", "set", "lo", "up"], ns)
                self._port(j, outer, base + i)
                self._ethtool(inner, host_off, ns)
                self._ethtool(outer, self.switch_offloads, self.swns)
                self._shape(inner, self.host_rate_bps, ns, True)
                self._shape(outer, self.host_rate_bps, self.swns, False)
                self.switch_host_intfs.append(outer)
        # trunks: bridge j's port 50+l goes right to bridge j+1's port 1+l
        for j in range(self.switches - 1):
            for lane in range(self.lanes):
                left, right = f"{self.prefix}t{j + 1}l{lane}a", f"{self.prefix}t{j + 1}l{lane}b"
                self._veth(left, right)
                self._port(j, left, 50 + lane)
                self._port(j + 1, right, 1 + lane)
                for intf in (left, right):
                    self._ethtool(intf, self.switch_offloads, self.swns)
                    self._shape(intf, self.trunk_rate_bps, self.swns, False)
                    self.trunk_intfs.append(intf)
        self._install_flows()

    def _install_flows(self) -> None:
        last = self.switches - 1
        for j in range(self.switches):
            rules = []
            for i in range(self.pairs):
                lane = i % self.lanes
                to_r = 200 + i if j == last else 50 + lane
                to_s = 100 + i if j == 0 else 1 + lane
                for dst, port in ((self.ip("r", i), to_r), (self.ip("s", i), to_s)):
                    rules.append(f"priority=100,ip,nw_dst={dst},actions=output:{port}")
                    rules.append(f"priority=100,arp,arp_tpa={dst},actions=output:{port}")
            self.sh(["ovs-ofctl", "add-flows", self.bridge(j), "-"], stdin="\n".join(rules) + "\n")

    # -- measure --------------------------------------------------------------------------
    def _spawn(self, argv: Argv, ns: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._procs.append(proc)
        return proc

    def _stop(self, proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self._procs:
            self._procs.remove(proc)

    def _qdisc_counters(self, intfs: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(bytes, drops) of each interface's root qdisc and its children."""
        out: dict[str, tuple[int, int]] = {}
        for intf in intfs:
            data = json.loads(self.sh(["tc", "-s", "-j", "qdisc", "show", "dev", intf], self.swns))
            root = [q for q in data if q.get("root")]
            sent = int(root[0].get("bytes", 0)) if root else 0
            out[intf] = (sent, sum(int(q.get("drops", 0)) for q in data))
        return out

    @contextmanager
    def _servers(self, pairs: Sequence[int]) -> Iterator[None]:
        """One-off iperf3 servers, one in each receiver's namespace."""
        servers = [
            self._spawn(["iperf3", "-s", "-1", "-p", str(IPERF_PORT)], self.ns("r", i))
            for i in pairs
        ]
        try:
            deadline = time.monotonic() + 10
            for i in pairs:  # wait until each server listens
                while f":{IPERF_PORT}" not in self.sh(["ss", "-ltnH"], self.ns("r", i)):
                    if time.monotonic() > deadline:
                        raise EmulationError(f"iperf3 server in {self.ns('r', i)} not listening")
                    time.sleep(0.05)
            yield
        finally:
            for proc in servers:
                self._stop(proc)

    def received(self, i: int) -> tuple[float, int]:
        """(time, bytes) that receiver ``i``'s iperf3 data connection has received in
        order so far (tcp_info bytes_received: goodput, retransmissions not counted)."""
        out = self.sh(
            ["ss", "-tinH", "state", "established", "sport", "=", f":{IPERF_PORT}"], self.ns("r", i)
        )
        now = time.monotonic()
        counts = [int(m) for m in re.findall(r"bytes_received:(\d+)", out)]
        return now, max(counts, default=0)

    def run(
        self,
        duration: float = 10,
        omit: float = 2,
        pairs: Sequence[int] | None = None,
        congestion_control: str | None = None,
        probe_rtt: bool = False,
    ) -> RunResult:
        """Run one iperf3 flow per pair, all at once, and return what was measured.

        Data flows from s<i> to r<i>. Goodput is read from the receiving sockets'
        ``bytes_received`` at the start and end of one common window, from ``omit``
        seconds after the start (slow start, flows starting a little apart) to one second
        before the end, so all flows are compared over the same time; the shaper counters
        and CPU use are sampled over the same window. ``congestion_control`` is the
        senders' TCP algorithm (default: the system's).
        """
        chosen = list(range(self.pairs)) if pairs is None else list(pairs)
        ports = datapath_ports(self.ovs)
        watched = self.trunk_intfs + self.switch_host_intfs
        with self._servers(chosen):
            start = time.monotonic()  # no client can finish before start + omit + duration
            clients = []
            for i in chosen:
                argv = ["iperf3", "-c", self.ip("r", i), "-p", str(IPERF_PORT), "-J"]
                argv += ["-t", f"{duration + omit:g}"]
                if congestion_control:
                    argv += ["-C", congestion_control]
                clients.append((i, self._spawn(argv, self.ns("s", i))))
            pinger = None
            if probe_rtt:
                count = str(max(1, int((duration - 1) / 0.2)))
                ping = ["ping", "-q", "-i", "0.2", "-c", count, self.ip("r", 0)]
                pinger = self._spawn(ping, self.ns("s", 0))
            time.sleep(max(0.0, start + omit - time.monotonic()))
            c0, v0 = cpu_times(), process_ticks(self.ovs.pidfile())
            q0, r0 = self._qdisc_counters(watched), [self.received(i) for i in chosen]
            # close the window a second before the first flow can end, however long the
            # sampling itself took on a busy machine
            time.sleep(max(0.5, start + omit + duration - 1.0 - time.monotonic()))
            c1, v1 = cpu_times(), process_ticks(self.ovs.pidfile())
            q1, r1 = self._qdisc_counters(watched), [self.received(i) for i in chosen]
            if any(bb <= ba for (_, ba), (_, bb) in zip(r0, r1, strict=True)):
                raise EmulationError("a flow received nothing in the window (ended early?)")
            flows = []
            for (i, proc), (ta, ba), (tb, bb) in zip(clients, r0, r1, strict=True):
                report = self._report(i, proc, duration + omit + 30)
                flows.append(
                    FlowResult(
                        pair=i,
                        goodput_bps=(bb - ba) * 8 / (tb - ta),
                        retransmits=int(report["end"]["sum_sent"].get("retransmits", 0)),
                        whole_test_bps=float(report["end"]["sum_received"]["bits_per_second"]),
                    )
                )
            rtt: dict[str, float] = {}
            if pinger is not None:
                out, _ = pinger.communicate(timeout=duration + 10)
                self._procs.remove(pinger)
                m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)", out)
                if m:
                    rtt = dict(zip(("min", "avg", "max"), map(float, m.groups()), strict=True))
        span = r1[0][0] - r0[0][0]
        return RunResult(
            duration=duration,
            flows=flows,
            trunk_l2_bps={k: (q1[k][0] - q0[k][0]) * 8 / span for k in self.trunk_intfs},
            qdisc_drops=sum(q1[k][1] - q0[k][1] for k in watched),
            cpu_busy=(c1[0] - c0[0]) / max(1, c1[1] - c0[1]),
            vswitchd_cores=(v1 - v0) / os.sysconf("SC_CLK_TCK") / span,
            datapath_ports=ports,
            rtt_ms=rtt,
        )

    def _report(self, i: int, proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
        out, err = proc.communicate(timeout=timeout)
        self._procs.remove(proc)
        try:
            report: dict[str, Any] = json.loads(out)
            float(report["end"]["sum_received"]["bits_per_second"])  # must be there
        except (ValueError, KeyError) as error:
            raise EmulationError(f"iperf3 in {self.ns('s', i)}: {err or out}") from error
        return report

    # -- teardown -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop our processes and undo what was built, newest first; never raises."""
        for proc in list(self._procs):
            self._stop(proc)
        while self._undo:
            argv, ns = self._undo.pop()
            env = self.ovs.env() if argv[0].startswith("ovs-") else None
            _run(argv, ns, env)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--switches", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument("--rate", default="20M", help="rate of every link, e.g. 25M")
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--omit", type=float, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--cc", default=None, help="TCP congestion control (default: system's)")
    parser.add_argument("--tclink", action="store_true", help="shape like Mininet's TCLink")
    parser.add_argument("--ovs-netns", default=None)
    parser.add_argument("--ovs-rundir", default=None)
    args = parser.parse_args(argv)
    rate = parse_rate(args.rate)

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through RawChain.close()

    signal.signal(signal.SIGTERM, terminate)
    chain = RawChain(
        switches=args.switches,
        pairs=args.pairs,
        lanes=args.lanes,
        host_rate_bps=rate,
        trunk_rate_bps=rate,
        shaper=tclink_shaper if args.tclink else default_shaper,
        ovs=OvsInstance(args.ovs_netns, args.ovs_rundir),
    )
    with chain as net:
        for _ in range(args.repeat):
            result = net.run(args.duration, args.omit, congestion_control=args.cc, probe_rtt=True)
            record = asdict(result)
            record["aggregate_bps"] = result.aggregate_bps
            record["jain"] = result.jain
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
