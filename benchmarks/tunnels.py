"""Tunnels for links cut between machines: capacity and shaping fidelity of each, side by side.

    sudo .venv/bin/python benchmarks/tunnels.py [--duration 5] [--rate 20M]
        [--options underlay,veth,vxlan,vxlan-1500,ssh-tap,ovs-vxlan,ovs-vxlan-tx-off]
        [--ssh-cipher aes128-gcm@openssh.com] [--lock-wait 60]

A link cut between two machines of a cluster run (orchestrator.cluster) is a tunnel with one
end on each machine, a port of that machine's userspace (netdev) Open vSwitch bridge, shaped
with HTB at the link's emulated rate (12-20 Mbit/s, a few dozen of them between two
machines). The fabric uses a kernel VXLAN device; Mininet's cluster edition uses an SSH TAP
tunnel or gretap, and a kernel without the GRE module has no gretap. This measures the
candidates the way the fabric uses them, between this machine's root namespace ("machine 1")
and a :class:`~orchestrator.cluster.nsmachine.NamespaceMachine` ("machine 2": its own network
and mount namespaces, sshd and OVS daemons, reached over a veth of MTU 9000)::

    endpoint A --veth-- [atunbr] --TUNNEL-- ~~underlay~~ --TUNNEL-- [atunbr] --veth-- endpoint B
    10.99.0.1/24        machine 1                                   machine 2       10.99.0.2/24

Each endpoint is a network namespace held by a ``sleep`` (``unshare --net``, made inside its
machine; no name under /run/netns, so it goes with its process), TCP set up as the emulated
GPUs' (timestamps off, GSO packets of the emulator recipe's segments, 4 by default; iperf3
``-C cubic``), so the best goodput on a link shaped to R is R x 1460/1514 = 0.964 R. The
options:

    underlay          reference: iperf3 between the machines themselves, over their veth
    veth              reference: one veth between the two endpoints (no OVS, no tunnel)
    vxlan             a kernel VXLAN device per machine (what the fabric uses), MTU 1500, the
                      underlay at its MTU of 9000
    vxlan-1500        the same with the underlay veth at MTU 1500 for the measurement (so the
                      50 bytes of VXLAN do not fit; restored to 9000 afterwards)
    ssh-tap           Mininet cluster edition's RemoteLink: a TAP device on each machine
                      (``ip tuntap add``), joined by ``ssh -o Tunnel=Ethernet -w N:N`` with the
                      machine's key and known_hosts (the sshd has ``PermitTunnel yes``)
    ovs-vxlan         an OVS userspace tunnel port (``type=vxlan``), no kernel device: its
                      underlay is a second veth pair between the machines, each end in a netdev
                      bridge ``atunul`` whose internal port holds the tunnel address (OVS routes
                      native tunnels through a bridge: ovs/route, neighbours by ARP snooping)
    ovs-vxlan-tx-off  the same with the endpoints' transmit offloads off (``ethtool -K eth0 tx
                      off``): OVS 3.1 drops packets carrying TSO or checksum-offload flags at a
                      userspace tunnel's encapsulation (netdev_push_header_drops)

Per option, four iperf3 runs (``-t DURATION``, receiver's goodput) from endpoint A to B: one
stream and four streams unshaped, then one stream with the tunnel's two ends shaped to
``--rate`` by a plain HTB (``tc qdisc add dev T root handle 1: htb default 1; tc class add
dev T parent 1: classid 1:1 htb rate R burst 15k``, Mininet's TCLink) and by the project's
shaping (orchestrator.emulation.shaping, the switch side of ``$ASTRAL_RECIPE``'s: cburst,
quantum, a byte FIFO). The ratio is goodput / R. The OVS tunnel port has no kernel device
to shape: its underlay veth ends are shaped instead, which counts the 50 bytes of VXLAN in
every frame (ceiling 1460/1564 = 0.934) and would shape all the tunnels of a machine
together. The references are shaped on their own veth ends (the underlay is not shaped).

CPU, per run, from /proc (both machines share this host's CPUs): ``busy`` cores of the
whole host, both ovs-vswitchds together, softirq, and the SSH tunnel's processes (the ssh
client and its sshd session); also the IP fragments machine 1 made (``frags``). Conditions
(cores, load average, kernel, OVS, OpenSSH) are printed first and last: on a shared 2-core
machine every number moves with what else runs.

Holds the run lock (orchestrator.emulation.lock) so that no emulation starts meanwhile, and
waits (``--lock-wait``) for the host's Open vSwitch to have no bridges. Everything made is
removed in reverse order, also on errors, Ctrl-C and SIGTERM: processes by pid, interfaces,
bridges, the MTU of the underlay restored, the machine stopped. Interface names start with
``atun``; the machine's are ``asttun-h``/``asttun-m``. Takes about 3 minutes with the
defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import platform
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.cluster.nsmachine import (
    NamespaceMachine,
    descendants,
    free_network,
    machine_env,
    netns_id,
    route_destinations,
)
from orchestrator.cluster.ssh import SshMachine
from orchestrator.emulation.lock import RunLock
from orchestrator.emulation.network import Terminated
from orchestrator.emulation.recipe import current_recipe
from orchestrator.emulation.shaping import shaping_commands
from orchestrator.remote.inventory import load_inventory
from orchestrator.testbed.traffic import VSWITCHD_PIDFILE, process_ticks
from topologies.errors import ConcurrentRunError, EnvironmentProblem
from topologies.units import TCP_PAYLOAD_SHARE, parse_rate

MACHINE = "tun"  # NamespaceMachine name: interfaces asttun-h / asttun-m
BRIDGE = "atunbr"  # the endpoint's bridge on each machine
PORT = "atunp"  # its veth port towards the endpoint
UNDERLAY_BRIDGE = "atunul"  # ovs-vxlan: the bridge holding the tunnel address
UNDERLAY_PORTS = ("atunu1", "atunu2")  # ovs-vxlan: its veth pair (machine 1, machine 2)
VXLAN = "atunvx"  # the tunnel port (kernel device or OVS userspace port)
ENDPOINT_INTF = "eth0"  # inside each endpoint namespace
ENDPOINT_ADDRESSES = ("10.99.0.1", "10.99.0.2")
VNI = 4242
VXLAN_PORT = 4789
TAP_NUMBERS = range(90, 100)  # ssh -w N:N opens "tapN" on both sides
MTU = 1500  # the fabric's frames
IPERF_PORT = 5201
CLK_TCK = os.sysconf("SC_CLK_TCK")
ALL_OPTIONS = (
    "underlay",
    "veth",
    "vxlan",
    "vxlan-1500",
    "ssh-tap",
    "ovs-vxlan",
    "ovs-vxlan-tx-off",
)
# Candidates for ovs-vxlan's underlay /30, after the machine's own 172.31.251-254.
UNDERLAY_NETWORKS = tuple(f"172.31.{n}.0/30" for n in range(240, 245))
NOTES = {
    "underlay": "reference: root ns <-> machine 2 over their veth, MTU 9000, no OVS",
    "veth": "reference: a veth between the endpoints (same host), no OVS, no tunnel",
    "vxlan": "kernel vxlan module; root; UDP 4789 open; underlay MTU >= 1550",
    "vxlan-1500": "as vxlan, underlay MTU 1500: every full frame sent as 2 IP fragments",
    "ssh-tap": "sshd PermitTunnel yes, root login by key, tun module; 1 ssh per link; TCP in TCP",
    "ovs-vxlan": "no module; NIC moved into an OVS bridge, IP on it; OVS 3.1 drops TSO packets",
    "ovs-vxlan-tx-off": "as ovs-vxlan, endpoints `ethtool -K tx off`: no TSO; shaped on underlay",
}


class BenchError(Exception):
    """A step of an option's set-up failed: the option is reported as failed, the run goes on."""


# -- where commands run ---------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where a command runs: machine 1's root namespace (no prefix), machine 2 (its network
    and mount namespaces, so that ``ovs-vsctl`` reaches its own daemons), or an endpoint's
    network namespace."""

    name: str
    prefix: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None

    def argv(self, command: Sequence[str]) -> list[str]:
        return [*self.prefix, *command]


def run(
    place: Place, command: Sequence[str], *, check: bool = True, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """``command`` at ``place`` to its end, output captured; failure raises BenchError."""
    try:
        done = subprocess.run(
            place.argv(command),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if place.env is None else dict(place.env),
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise BenchError(
            f"{place.name}: `{shlex.join(command)}` took over {timeout:g} s"
        ) from error
    if check and done.returncode != 0:
        raise BenchError(f"{place.name}: `{shlex.join(command)}` failed: {done.stderr.strip()}")
    return done


def undo(stack: contextlib.ExitStack, place: Place, command: Sequence[str]) -> None:
    """Run ``command`` at ``place`` when ``stack`` closes; a failure is reported, not raised,
    so that the steps after it still run. An interface already gone is no failure: it went
    with its namespace (a Ctrl-C reaches the namespaces' holders too)."""

    def step() -> None:
        try:
            run(place, command)
        except BenchError as error:
            if "Cannot find device" not in str(error):
                print(f"# cleanup: {error}", file=sys.stderr)

    stack.callback(step)


def end_process(process: subprocess.Popen[bytes]) -> None:
    """Stop a process we started (by its pid): SIGTERM, SIGKILL after a few seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def endpoint_namespace(stack: contextlib.ExitStack, machine: Place, name: str) -> Place:
    """A new network namespace made inside ``machine``, held by a ``sleep`` that ``stack``
    kills (the namespace and its interfaces go with it; nothing is named in /run/netns).

    ``nsenter`` without a pid namespace and ``unshare`` without ``--fork`` exec rather than
    fork, so the Popen's pid is the holder's."""
    script = "ip link set lo up && echo ready && exec sleep infinity"
    holder = subprocess.Popen(
        machine.argv(["unshare", "--net", "--", "sh", "-c", script]),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=None if machine.env is None else dict(machine.env),
    )
    stack.callback(end_process, holder)
    assert holder.stdout is not None
    ready, _, _ = select.select([holder.stdout], [], [], 10.0)
    if not ready or holder.stdout.readline() != b"ready\n":
        raise BenchError(f"{name}: its namespace could not be made")
    if netns_id(holder.pid) in (netns_id(os.getpid()), None):
        raise BenchError(f"{name}: the holder {holder.pid} is not in a namespace of its own")
    return Place(name, ("nsenter", "-t", str(holder.pid), "-n", "--"), machine.env)


# -- measuring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """Counters at one moment: jiffies of the host, clock ticks of processes, and the IP
    fragments machine 1 made (an underlay too small for the tunnel's packets)."""

    at: float
    busy: int
    softirq: int
    ovs: int
    tunnel: int
    fragments: int


@dataclass(frozen=True)
class Cpu:
    """Cores used over a run: the whole host busy, both ovs-vswitchds, softirq, tunnel
    processes (ssh-tap's client and sshd session)."""

    busy: float
    ovs: float
    softirq: float
    tunnel: float


def fragments_made() -> int:
    """IP fragments this network namespace (machine 1's) has made: ``Ip: FragCreates``."""
    with open("/proc/net/snmp", encoding="ascii") as snmp:
        lines = [line.split() for line in snmp if line.startswith("Ip:")]
    counters = dict(zip(lines[0][1:], lines[1][1:], strict=True))
    return int(counters.get("FragCreates", 0))


def pid_ticks(pids: Sequence[int]) -> int:
    """utime + stime (all threads) of ``pids`` together, clock ticks (gone ones count 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return total


@dataclass
class Setup:
    """What an option built: where the iperf3 client and server run, the server's address,
    the interfaces to shape (and where), and the tunnel's own processes, if any."""

    client: Place
    server: Place
    address: str
    shaped: list[tuple[Place, str]] = field(default_factory=list)
    tunnel_pids: Callable[[], list[int]] = list
    diagnose: Callable[[], str] = str


@dataclass
class Result:
    """One iperf3 run of an option."""

    option: str
    label: str
    mbps: float | None
    retransmits: int
    cpu: Cpu | None
    error: str = ""
    fragments: int = 0


class Bench:
    """Both machines, the CPU sampling and the iperf3 runs."""

    def __init__(self, machine: NamespaceMachine, args: argparse.Namespace) -> None:
        self.machine = machine
        self.args = args
        self.rate_bps = float(args.rate_bps)
        self.one = Place("machine 1")
        prefix = ("nsenter", "-t", str(machine.holder_pid), "-n", "-m", "--")
        self.two = Place("machine 2", prefix, machine_env())
        self.pidfiles = [VSWITCHD_PIDFILE, str(machine.directory / "ovs/run/ovs-vswitchd.pid")]

    def sample(self, setup: Setup) -> Sample:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(x) for x in stat.readline().split()[1:9]]
        busy = sum(fields) - fields[3] - fields[4]
        return Sample(
            time.monotonic(),
            busy,
            fields[6],
            sum(process_ticks(pidfile) for pidfile in self.pidfiles),
            pid_ticks(setup.tunnel_pids()),
            fragments_made(),
        )

    @staticmethod
    def cores(before: Sample, after: Sample) -> Cpu:
        seconds = max(after.at - before.at, 1e-3) * CLK_TCK
        return Cpu(
            (after.busy - before.busy) / seconds,
            (after.ovs - before.ovs) / seconds,
            (after.softirq - before.softirq) / seconds,
            (after.tunnel - before.tunnel) / seconds,
        )

    def iperf(self, option: str, label: str, setup: Setup, streams: int) -> Result:
        """One iperf3 measurement from the client's place to the server's (one-off server)."""
        server = subprocess.Popen(
            setup.server.argv(["iperf3", "-s", "-1", "-J", "-p", str(IPERF_PORT)]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            self._wait_listening(setup.server)
            client = [
                "iperf3", "-c", setup.address, "-p", str(IPERF_PORT), "-J", "-C", "cubic",
                "-t", f"{self.args.duration:g}", "-P", str(streams), "--connect-timeout", "3000",
            ]  # fmt: skip
            before = self.sample(setup)
            try:
                done = run(setup.client, client, check=False, timeout=self.args.duration + 20)
            except BenchError as error:
                return Result(option, label, None, 0, None, str(error))
            after = self.sample(setup)
        finally:
            end_process(server)
        try:
            report = json.loads(done.stdout)
        except ValueError:
            return Result(option, label, None, 0, None, f"iperf3: {done.stderr.strip()}")
        if "error" in report or "sum_received" not in report.get("end", {}):
            problem = report.get("error", "no result")
            return Result(option, label, None, 0, None, f"iperf3: {problem}")
        end = report["end"]
        return Result(
            option,
            label,
            end["sum_received"]["bits_per_second"] / 1e6,
            int(end["sum_sent"].get("retransmits", 0)),
            self.cores(before, after),
            fragments=after.fragments - before.fragments,
        )

    @staticmethod
    def _wait_listening(place: Place) -> None:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            listening = run(place, ["ss", "-Hltn", f"sport = :{IPERF_PORT}"], check=False)
            if listening.stdout.strip():
                return
            time.sleep(0.05)
        raise BenchError(f"{place.name}: iperf3 -s did not listen within 5 s")

    def shape(self, setup: Setup, recipe: bool) -> None:
        """Shape every one of the option's tunnel ends to the rate (egress, replacing)."""
        for place, intf in setup.shaped:
            if recipe:
                commands = shaping_commands(intf, self.rate_bps, current_recipe().shaping, mtu=MTU)
            else:
                rate = f"{self.rate_bps / 1e6:g}mbit"
                commands = [
                    ["tc", "qdisc", "add", "dev", intf, "root", "handle", "1:",
                     "htb", "default", "1"],
                    ["tc", "class", "add", "dev", intf, "parent", "1:", "classid", "1:1",
                     "htb", "rate", rate, "burst", "15k"],
                ]  # fmt: skip
            for command in commands:
                run(place, command)

    def unshape(self, setup: Setup) -> None:
        for place, intf in setup.shaped:
            run(place, ["tc", "qdisc", "del", "dev", intf, "root"], check=False)

    def measure(self, option: str, setup: Setup, results: list[Result]) -> None:
        """The four runs of an option (two for an unshaped reference); after a failed run
        the rest are skipped, with what the option's diagnosis says. Each run is appended to
        ``results`` as it ends, so that an interruption keeps what was measured."""
        runs: list[tuple[str, int, bool | None]] = [("1 stream", 1, None), ("4 streams", 4, None)]
        if setup.shaped:
            runs += [("HTB", 1, False), ("recipe", 1, True)]
        for label, streams, recipe in runs:
            if recipe is not None:
                self.unshape(setup)
                self.shape(setup, recipe)
            result = self.iperf(option, label, setup, streams)
            if recipe is not None:
                self.unshape(setup)
            if result.error:
                extra = setup.diagnose()
                result.error += f" ({extra})" if extra else ""
            results.append(result)
            print(f"  {option:17} {line(result, self.rate_bps)}", flush=True)
            if result.error:
                break


def line(result: Result, rate_bps: float) -> str:
    if result.mbps is None:
        return f"{result.label:9} failed: {result.error}"
    ratio = f"ratio {result.mbps * 1e6 / rate_bps:.3f}" if result.label in ("HTB", "recipe") else ""
    cpu = result.cpu
    assert cpu is not None
    return (
        f"{result.label:9} {result.mbps:8.1f} Mbit/s {ratio:11} retr {result.retransmits:<5} "
        f"busy {cpu.busy:.2f} ovs {cpu.ovs:.2f} sirq {cpu.softirq:.2f} tunnel {cpu.tunnel:.2f} "
        f"frags {result.fragments}"
    )


# -- the options ----------------------------------------------------------------------------


def bridged(
    stack: contextlib.ExitStack, bench: Bench, offloads: bool = True
) -> tuple[Place, Place]:
    """On each machine a netdev bridge with a veth to a new endpoint namespace (10.99.0.x);
    the tunnel is the bridge's other port, added by the caller."""
    endpoints = []
    for place, address in zip((bench.one, bench.two), ENDPOINT_ADDRESSES, strict=True):
        endpoint = endpoint_namespace(stack, place, f"endpoint on {place.name}")
        holder = endpoint.prefix[2]
        run(place, ["ip", "link", "add", PORT, "mtu", str(MTU), "type", "veth",
                    "peer", "name", ENDPOINT_INTF, "mtu", str(MTU), "netns", holder])  # fmt: skip
        undo(stack, place, ["ip", "link", "del", PORT])
        run(place, ["ovs-vsctl", "add-br", BRIDGE, "--", "set", "bridge", BRIDGE,
                    "datapath_type=netdev"])  # fmt: skip
        undo(stack, place, ["ovs-vsctl", "--if-exists", "del-br", BRIDGE])
        run(place, ["ovs-vsctl", "add-port", BRIDGE, PORT])
        run(place, ["ip", "link", "set", PORT, "up"])
        configure_endpoint(endpoint, address, offloads)
        endpoints.append(endpoint)
    return endpoints[0], endpoints[1]


def configure_endpoint(endpoint: Place, address: str, offloads: bool = True) -> None:
    """The endpoint's address, and TCP as the emulated GPUs' (orchestrator.emulation.hostconfig):
    no timestamps, and every packet handed to the NIC the same few segments (a 64 kB GSO
    packet would not even fit the recipe's switch queue)."""
    segments = str(current_recipe().segments)
    run(endpoint, ["ip", "addr", "add", f"{address}/24", "dev", ENDPOINT_INTF])
    run(endpoint, ["ip", "link", "set", "dev", ENDPOINT_INTF, "gso_max_segs", segments, "up"])
    run(endpoint, ["sysctl", "-qw", "net.ipv4.tcp_timestamps=0",
                   f"net.ipv4.tcp_min_tso_segs={segments}"])  # fmt: skip
    if not offloads:
        run(endpoint, ["ethtool", "-K", ENDPOINT_INTF, "tx", "off"])


def build_underlay(stack: contextlib.ExitStack, bench: Bench) -> Setup:
    machine = bench.machine
    server = Place("machine 2 (network)", ("nsenter", "-t", str(machine.holder_pid), "-n", "--"))
    return Setup(bench.one, server, machine.address)


def build_veth(stack: contextlib.ExitStack, bench: Bench) -> Setup:
    a = endpoint_namespace(stack, bench.one, "endpoint A")
    b = endpoint_namespace(stack, bench.two, "endpoint B")
    run(bench.one, ["ip", "link", "add", ENDPOINT_INTF, "netns", a.prefix[2], "mtu", str(MTU),
                    "type", "veth", "peer", "name", ENDPOINT_INTF, "mtu", str(MTU),
                    "netns", b.prefix[2]])  # fmt: skip
    undo(stack, a, ["ip", "link", "del", ENDPOINT_INTF])
    for endpoint, address in zip((a, b), ENDPOINT_ADDRESSES, strict=True):
        configure_endpoint(endpoint, address)
    return Setup(a, b, ENDPOINT_ADDRESSES[1], [(a, ENDPOINT_INTF), (b, ENDPOINT_INTF)])


def build_vxlan(stack: contextlib.ExitStack, bench: Bench) -> Setup:
    """A kernel VXLAN device on each machine, as orchestrator.emulation.wiring.Tunnel makes."""
    a, b = bridged(stack, bench)
    ends = ((bench.one, bench.machine.host_address, bench.machine.address),
            (bench.two, bench.machine.address, bench.machine.host_address))  # fmt: skip
    for place, local, remote in ends:
        run(place, ["ip", "link", "add", VXLAN, "mtu", str(MTU), "type", "vxlan", "id", str(VNI),
                    "local", local, "remote", remote, "dstport", str(VXLAN_PORT)])  # fmt: skip
        undo(stack, place, ["ip", "link", "del", VXLAN])
        run(place, ["ovs-vsctl", "add-port", BRIDGE, VXLAN])
        undo(stack, place, ["ovs-vsctl", "--if-exists", "del-port", BRIDGE, VXLAN])
        run(place, ["ip", "link", "set", VXLAN, "up"])
    return Setup(a, b, ENDPOINT_ADDRESSES[1], [(bench.one, VXLAN), (bench.two, VXLAN)])


def build_vxlan_1500(stack: contextlib.ExitStack, bench: Bench) -> Setup:
    """The underlay veth at 1500 for as long as the option lasts (back to the machine's
    MTU when ``stack`` closes, whatever happens in between)."""
    machine = bench.machine
    underlay = ((bench.one, machine.host_interface), (bench.two, machine.machine_interface))
    for place, intf in underlay:
        undo(stack, place, ["ip", "link", "set", intf, "mtu", str(machine.mtu)])
        run(place, ["ip", "link", "set", intf, "mtu", str(MTU)])
    return build_vxlan(stack, bench)


def build_ssh_tap(stack: contextlib.ExitStack, bench: Bench) -> Setup:
    """Mininet's RemoteLink.makeTunnel: tapN on both machines, ``ssh -w N:N`` between them."""
    a, b = bridged(stack, bench)
    machine = bench.machine
    number = next(
        (n for n in TAP_NUMBERS
         if not Path(f"/sys/class/net/tap{n}").exists()
         and run(bench.two, ["ip", "link", "show", f"tap{n}"], check=False).returncode != 0),
        None,
    )  # fmt: skip
    if number is None:
        raise BenchError(f"every tap{TAP_NUMBERS[0]}..tap{TAP_NUMBERS[-1]} exists")
    tap = f"tap{number}"
    for place in (bench.one, bench.two):
        run(place, ["ip", "tuntap", "add", "dev", tap, "mode", "tap"])
        undo(stack, place, ["ip", "link", "del", tap])
        run(place, ["ip", "link", "set", tap, "mtu", str(MTU), "up"])
        run(place, ["ovs-vsctl", "add-port", BRIDGE, tap])
        undo(stack, place, ["ovs-vsctl", "--if-exists", "del-port", BRIDGE, tap])
    inventory = machine.inventory(machine.directory / "machines.yaml")
    ssh = SshMachine.of(load_inventory(inventory).machine(machine.name))
    argv = ["ssh", *ssh.options(), "-N", "-o", "ExitOnForwardFailure=yes",
            "-o", "Tunnel=ethernet", "-w", f"{number}:{number}"]  # fmt: skip
    if bench.args.ssh_cipher:
        argv += ["-c", bench.args.ssh_cipher]
    log = (machine.directory / "ssh-tunnel.log").open("wb")
    with log:
        client = subprocess.Popen(
            [*argv, f"root@{machine.address}"], stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    stack.callback(end_process, client)
    deadline = time.monotonic() + 10.0
    while not carrier(bench, tap):
        if client.poll() is not None or time.monotonic() > deadline:
            text = (machine.directory / "ssh-tunnel.log").read_text(errors="replace").strip()
            raise BenchError(f"ssh -w {number}:{number} did not connect the taps: {text}")
        time.sleep(0.05)

    def tunnel_pids() -> list[int]:
        sshd = machine.sshd.pid if machine.sshd is not None else None
        return [client.pid, *(descendants(sshd) if sshd else [])]

    return Setup(a, b, ENDPOINT_ADDRESSES[1], [(bench.one, tap), (bench.two, tap)], tunnel_pids)


def carrier(bench: Bench, tap: str) -> bool:
    """Both taps have a process attached (a tap's carrier is on while one holds it)."""
    here = Path(f"/sys/class/net/{tap}/carrier")
    there = run(bench.two, ["cat", str(here)], check=False)
    with contextlib.suppress(OSError):
        return here.read_text().strip() == "1" and there.stdout.strip() == "1"
    return False


def ovs_vxlan(stack: contextlib.ExitStack, bench: Bench, offloads: bool) -> Setup:
    """An OVS userspace VXLAN port on each machine. Native tunnels route the encapsulated
    packet by OVS's own route table (from the kernel's, or ovs/route/add) to a *bridge*
    whose internal port holds the local address, then out that bridge's ports: so each
    machine gets a netdev bridge ``atunul`` with one end of a veth pair between the
    machines and the tunnel address on its internal port."""
    a, b = bridged(stack, bench, offloads=offloads)
    taken = route_destinations(run(bench.one, ["ip", "-4", "route", "show", "table", "all"]).stdout)
    network = free_network(taken, [ipaddress.IPv4Network(n) for n in UNDERLAY_NETWORKS])
    if network is None:
        raise BenchError(f"every one of {', '.join(UNDERLAY_NETWORKS)} is routed already")
    addresses = (str(network[1]), str(network[2]))
    one_port, two_port = UNDERLAY_PORTS
    holder, mtu = str(bench.machine.holder_pid), str(bench.machine.mtu)
    run(bench.one, ["ip", "link", "add", one_port, "mtu", mtu, "type", "veth",
                    "peer", "name", two_port, "mtu", mtu, "netns", holder])  # fmt: skip
    undo(stack, bench.one, ["ip", "link", "del", one_port])
    places = (bench.one, bench.two)
    for place, port, address in zip(places, UNDERLAY_PORTS, addresses, strict=True):
        run(place, ["ovs-vsctl", "add-br", UNDERLAY_BRIDGE, "--", "set", "bridge",
                    UNDERLAY_BRIDGE, "datapath_type=netdev"])  # fmt: skip
        undo(stack, place, ["ovs-vsctl", "--if-exists", "del-br", UNDERLAY_BRIDGE])
        run(place, ["ovs-vsctl", "add-port", UNDERLAY_BRIDGE, port])
        run(place, ["ip", "link", "set", port, "up"])
        run(place, ["ip", "addr", "add", f"{address}/{network.prefixlen}", "dev", UNDERLAY_BRIDGE])
        run(place, ["ip", "link", "set", UNDERLAY_BRIDGE, "up"])
    for place, local, remote in zip(places, addresses, reversed(addresses), strict=True):
        run(place, ["ovs-vsctl", "add-port", BRIDGE, VXLAN, "--", "set", "interface", VXLAN,
                    "type=vxlan", f"options:remote_ip={remote}", f"options:local_ip={local}",
                    f"options:key={VNI}", f"options:dst_port={VXLAN_PORT}"])  # fmt: skip
    for place, remote in zip(places, reversed(addresses), strict=True):
        # The neighbour: OVS snoops the ARP exchange of a ping through the bridge.
        run(place, ["ping", "-c", "1", "-W", "2", remote], check=False)
        lookup = run(place, ["ovs-appctl", "ovs/route/lookup", remote], check=False)
        if UNDERLAY_BRIDGE not in lookup.stdout:
            raise BenchError(f"{place.name}: OVS routes {remote} elsewhere: {lookup.stdout}")
        neighbours = run(place, ["ovs-appctl", "tnl/neigh/show"]).stdout
        if remote not in neighbours:
            raise BenchError(f"{place.name}: no neighbour entry for {remote}: {neighbours}")

    def diagnose() -> str:
        drops = []
        for place in places:
            coverage = run(place, ["ovs-appctl", "coverage/read-counter",
                                   "netdev_push_header_drops"], check=False)  # fmt: skip
            drops.append(f"{place.name} {coverage.stdout.strip() or '?'}")
        return "netdev_push_header_drops: " + ", ".join(drops)

    shaped = [(bench.one, one_port), (bench.two, two_port)]
    return Setup(a, b, ENDPOINT_ADDRESSES[1], shaped, diagnose=diagnose)


BUILDERS: dict[str, Callable[[contextlib.ExitStack, Bench], Setup]] = {
    "underlay": build_underlay,
    "veth": build_veth,
    "vxlan": build_vxlan,
    "vxlan-1500": build_vxlan_1500,
    "ssh-tap": build_ssh_tap,
    "ovs-vxlan": lambda stack, bench: ovs_vxlan(stack, bench, offloads=True),
    "ovs-vxlan-tx-off": lambda stack, bench: ovs_vxlan(stack, bench, offloads=False),
}


# -- conditions and the table ---------------------------------------------------------------


def version(argv: Sequence[str]) -> str:
    """The first line a tool prints about its version (stdout or stderr), or "?"."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else "?"


def conditions() -> list[str]:
    load = os.getloadavg()
    bridges = host_bridges()
    tso = subprocess.run(
        [
            "ovs-vsctl",
            "--if-exists",
            "get",
            "Open_vSwitch",
            ".",
            "other_config:userspace-tso-enable",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return [
        f"# host: {os.cpu_count()} cores (nproc), load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}, kernel {platform.release()}",
        f"# {version(['ovs-vsctl', '--version'])}, userspace TSO {tso or 'unset'}, other bridges: "
        f"{' '.join(bridges) or 'none'}",
        f"# {version(['ssh', '-V'])}; {version(['iperf3', '--version'])}",
    ]


def summary(options: Sequence[str], results: Sequence[Result], rate_bps: float) -> list[str]:
    """One row per option: unshaped goodput (1 and 4 streams), the shaped ratios, the CPU of
    the one-stream run, and what the option needs."""

    def of(option: str, label: str) -> Result | None:
        return next((r for r in results if r.option == option and r.label == label), None)

    def mbps(result: Result | None) -> str:
        if result is None:
            return "-"
        return "failed" if result.mbps is None else f"{result.mbps:.0f}"

    def ratio(result: Result | None) -> str:
        if result is None:
            return "-"
        return "failed" if result.mbps is None else f"{result.mbps * 1e6 / rate_bps:.3f}"

    rate = f"{rate_bps / 1e6:g}M"
    header = (
        f"{'option':17} {'1 stream':>8} {'4 streams':>9} {'HTB ' + rate:>9} {'recipe':>7} "
        f"{'busy':>5} {'ovs':>5} {'sirq':>5} {'ssh':>5}  notes"
    )
    rows = [header, "-" * len(header)]
    for option in options:
        one = of(option, "1 stream")
        cpu = one.cpu if one is not None else None
        cores = (
            f"{cpu.busy:5.2f} {cpu.ovs:5.2f} {cpu.softirq:5.2f} {cpu.tunnel:5.2f}"
            if cpu is not None
            else f"{'-':>5} {'-':>5} {'-':>5} {'-':>5}"
        )
        rows.append(
            f"{option:17} {mbps(one):>8} {mbps(of(option, '4 streams')):>9} "
            f"{ratio(of(option, 'HTB')):>9} {ratio(of(option, 'recipe')):>7} {cores}  "
            f"{NOTES[option]}"
        )
    return rows


# -- the run --------------------------------------------------------------------------------


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Cleanup goes to its end: a second Ctrl-C or SIGTERM waits until it is done."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def host_bridges() -> list[str]:
    done = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=False)
    return done.stdout.split()


def wait_for_quiet_ovs(seconds: float) -> None:
    """Wait up to ``seconds`` until the host's Open vSwitch has no bridge. Another emulation
    (a test's, which may not hold this state directory's lock) would share ovs-vswitchd's
    threads and the CPUs with the measurement; after the wait it goes on, and the
    conditions printed say what was there."""
    deadline = time.monotonic() + seconds
    told = False
    while (bridges := host_bridges()) and time.monotonic() < deadline:
        if not told:
            print(f"# waiting up to {seconds:.0f} s for the host's bridges to go: {len(bridges)}")
            told = True
        time.sleep(2.0)


def check_free() -> None:
    """None of the names this uses is taken on the host (a killed earlier run's leftovers
    are for the user to look at, not for us to delete)."""
    names = (BRIDGE, PORT, UNDERLAY_BRIDGE, *UNDERLAY_PORTS, VXLAN, f"ast{MACHINE}-h")
    taken = [name for name in names if Path("/sys/class/net", name).exists()]
    if taken:
        raise EnvironmentProblem(f"interfaces exist already: {' '.join(taken)} (ip link del them)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per iperf3 run")
    parser.add_argument("--rate", default="20M", help="the shaped runs' rate (bit/s)")
    parser.add_argument("--options", default=",".join(ALL_OPTIONS), help="which, in order")
    parser.add_argument("--ssh-cipher", default="", help="ssh-tap: ssh -c CIPHER (ssh's default)")
    parser.add_argument(
        "--lock-wait", type=float, default=60.0, help="wait for another run, and its bridges"
    )
    args = parser.parse_args(argv)
    args.rate_bps = parse_rate(args.rate)
    options = [name for name in args.options.split(",") if name]
    unknown = [name for name in options if name not in BUILDERS]
    if unknown:
        parser.error(f"unknown options {unknown}; known: {', '.join(ALL_OPTIONS)}")
    if os.geteuid() != 0:
        parser.error("makes namespaces, interfaces and bridges: run it as root")

    def terminate(signum: int, frame: object) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, terminate)
    began = time.monotonic()
    for text in conditions():
        print(text)
    print(
        f"# shaped runs at {args.rate_bps / 1e6:g} Mbit/s; TCP goodput ceiling "
        f"{TCP_PAYLOAD_SHARE:.3f} of it (ovs-vxlan, shaped on the underlay: {1460 / 1564:.3f})"
    )
    results: list[Result] = []
    status = 0
    lock = RunLock(purpose="tunnel benchmark")
    stack = contextlib.ExitStack()
    try:
        lock.acquire(wait=args.lock_wait)
        stack.callback(lock.release)
        wait_for_quiet_ovs(args.lock_wait)
        check_free()
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="astral-tun-")))
        machine = stack.enter_context(NamespaceMachine(scratch / "machine", name=MACHINE))
        bench = Bench(machine, args)
        print(f"# machine 2 at {machine.address}, machine 1 at {machine.host_address}")
        for option in options:
            built = contextlib.ExitStack()  # what this option made, gone before the next
            try:
                bench.measure(option, BUILDERS[option](built, bench), results)
            except BenchError as error:
                results.append(Result(option, "1 stream", None, 0, None, str(error)))
                print(f"  {option:17} failed: {error}", flush=True)
            finally:
                with signals_deferred():
                    built.close()
    except (KeyboardInterrupt, Terminated) as stop:
        status = stop.exit_status if isinstance(stop, Terminated) else 130
        print("# interrupted: the table has the runs measured so far")
    except (ConcurrentRunError, EnvironmentProblem) as error:
        print(f"# {error}", file=sys.stderr)
        status = 2
    finally:
        with signals_deferred():
            stack.close()
    print()
    for row in summary(options, results, args.rate_bps):
        print(row)
    failed = [r for r in results if r.error]
    for result in failed:
        print(f"# {result.option} {result.label}: {result.error}")
    for text in conditions():
        print(text)
    print(f"# took {time.monotonic() - began:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
