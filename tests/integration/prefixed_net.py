"""A fabric in Mininet under a name prefix, for controller tests that must not collide.

The same construction as tests/integration/test_controller.py (userspace Open vSwitch,
fabric switches fail-secure, GPU hosts configured as the controller's contract says), with
two differences: every node name starts with a given prefix (so that these tests can run
next to an ``astral up`` or another test on the same machine), and the bridges allow
OpenFlow 1.3 *and* 1.5 (the controller negotiates 1.5 to install select groups with
``selection_method=hash``; ``controllers.openflow``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from mininet.net import Mininet
from mininet.node import Host, OVSSwitch

from controllers.routing import programmable_switches
from topologies.addressing import FABRIC_PREFIX, GATEWAY_IP, GATEWAY_MAC
from topologies.description import FabricDescription
from topologies.model import Tier

PROTOCOLS = "OpenFlow13,OpenFlow15"
HERE = Path(__file__).resolve().parent


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


class PrefixedFabric:
    """Names, construction and probes of one prefixed emulated fabric."""

    def __init__(self, description: FabricDescription, prefix: str) -> None:
        self.description = description
        self.prefix = prefix
        self.net: Mininet | None = None

    def node(self, name: str) -> str:
        return self.prefix + name

    def intf(self, name: str, port: int) -> str:
        return f"{self.node(name)}-eth{port}"

    def host(self, gpu: str) -> Host:
        assert self.net is not None
        return self.net[self.node(gpu)]

    # --- lifecycle -------------------------------------------------------------------------

    def remove_leftovers(self) -> None:
        """Bridges and root-namespace interfaces of a crashed run (our names only)."""
        for switch in self.description.fabric.switches:
            run(["ovs-vsctl", "--if-exists", "del-br", self.node(switch)])
        for link in self.description.fabric.links:
            for name, port in ((link.a, link.a_port), (link.b, link.b_port)):
                if Path(f"/sys/class/net/{self.intf(name, port)}").exists():
                    run(["ip", "link", "del", self.intf(name, port)])

    @contextmanager
    def running(self) -> Iterator[PrefixedFabric]:
        self.remove_leftovers()
        self.net = self._build()
        try:
            self.net.start()
            self._configure_hosts()
            yield self
        finally:
            self.net.stop()
            self.net = None
            self.remove_leftovers()

    def _build(self) -> Mininet:
        desc = self.description
        fabric = desc.fabric
        net = Mininet(
            topo=None,
            build=False,
            controller=None,
            switch=partial(OVSSwitch, datapath="user", protocols=PROTOCOLS),
            autoSetMacs=False,
        )
        for switch in sorted(fabric.switches.values(), key=lambda s: s.dpid):
            net.addSwitch(
                self.node(switch.name),
                dpid=f"{switch.dpid:016x}",
                failMode="standalone" if switch.tier is Tier.NVLINK else "secure",
            )
        for gpu in fabric.gpus_by_rank():
            net.addHost(self.node(gpu.name), cls=Host, ip=None)
        macs = {
            (addr.gpu, port.port): port.mac
            for addr in desc.addresses.values()
            for port in (addr.nvlink, *addr.nics)
        }
        for link in fabric.links:
            addrs = {
                key: mac
                for key, mac in (
                    ("addr1", macs.get((link.a, link.a_port))),
                    ("addr2", macs.get((link.b, link.b_port))),
                )
                if mac is not None
            }
            net.addLink(
                self.node(link.a),
                self.node(link.b),
                port1=link.a_port,
                port2=link.b_port,
                **addrs,
            )
        return net

    def _configure_hosts(self) -> None:
        """The contract: fabric /32 on every NIC port, static gateway, multipath route."""
        for addr in self.description.addresses.values():
            host = self.host(addr.gpu)
            nics = [self.intf(addr.gpu, nic.port) for nic in addr.nics]
            nvlink = self.intf(addr.gpu, addr.nvlink.port)
            commands = [
                [
                    "sysctl",
                    "-q",
                    "-w",
                    "net.ipv6.conf.all.disable_ipv6=1",
                    "net.ipv4.fib_multipath_hash_policy=1",
                    "net.ipv4.conf.all.ignore_routes_with_linkdown=1",
                    "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.default.rp_filter=0",
                    *(f"net.ipv4.conf.{name}.rp_filter=0" for name in [nvlink, *nics]),
                ],
                ["ip", "addr", "replace", f"{addr.nvlink.ip}/24", "dev", nvlink],
            ]
            for name in nics:
                commands += [
                    ["ip", "addr", "replace", f"{addr.fabric_ip}/32", "dev", name],
                    [
                        *("ip", "neigh", "replace", GATEWAY_IP, "lladdr", GATEWAY_MAC),
                        *("dev", name, "nud", "permanent"),
                    ],
                ]
            route = ["ip", "route", "replace", FABRIC_PREFIX, "src", addr.fabric_ip]
            for name in nics:
                route += ["nexthop", "via", GATEWAY_IP, "dev", name, "onlink"]
            commands.append(route)
            for argv in commands:
                out, err, code = host.pexec(*argv)
                assert code == 0, f"{addr.gpu}: {' '.join(argv)}: {out}{err}"

    def point_switches_at(self, target: str) -> None:
        """Connect the fabric switches to the controller with a 1 s reconnect backoff (two
        transactions: OVS 3.1 ignores max_backoff given when the row is created)."""
        switches = [self.node(s.name) for s in programmable_switches(self.description.fabric)]
        argv = ["ovs-vsctl"]
        for i, switch in enumerate(switches):
            argv += ["--", f"--id=@c{i}", "create", "Controller", f'target="{target}"']
            argv += ["--", "set", "Bridge", switch, f"controller=@c{i}"]
        result = run(argv)
        assert result.returncode == 0, result.stderr
        argv = ["ovs-vsctl"]
        for switch in switches:
            argv += ["--", "set", "Controller", switch, "max_backoff=1000"]
        result = run(argv)
        assert result.returncode == 0, result.stderr

    # --- probes ----------------------------------------------------------------------------

    def unreachable(self, down: frozenset[str] = frozenset()) -> list[str]:
        """Every (source NIC port, destination) pair without an echo reply (icmp_probe.py)."""
        import json

        failures = []
        addresses = self.description.addresses
        for src in addresses.values():
            host = self.host(src.gpu)
            targets = [dst.fabric_ip for dst in addresses.values() if dst is not src]
            for nic in src.nics:
                name = self.intf(src.gpu, nic.port)
                if name in down:
                    continue
                argv = [
                    sys.executable,
                    str(HERE / "icmp_probe.py"),
                    "--dev",
                    name,
                    "--src",
                    src.fabric_ip,
                    *targets,
                ]
                out, err, code = host.pexec(*argv)
                assert code == 0, f"{' '.join(argv)}: {out}{err}"
                failures += [f"{name} -> {ip}" for ip in json.loads(out)]
        return failures

    def set_link(self, a: str, a_port: int, b: str, b_port: int, state: str) -> None:
        """Take both ends of a link down (or up); GPU ends inside their namespace."""
        for name, port in ((a, a_port), (b, b_port)):
            if name in self.description.fabric.gpus:
                out, err, code = self.host(name).pexec(
                    "ip", "link", "set", "dev", self.intf(name, port), state
                )
                assert code == 0, out + err
            else:
                result = run(["ip", "link", "set", "dev", self.intf(name, port), state])
                assert result.returncode == 0, result.stderr

    def port_tx_bytes(self) -> dict[tuple[str, int], int]:
        """Transmitted bytes of every fabric switch port, by (model switch name, port)."""
        counters: dict[tuple[str, int], int] = {}
        pattern = re.compile(r"port\s+(\d+): rx .*?\n\s+tx pkts=\d+, bytes=(\d+)", re.S)
        for switch in programmable_switches(self.description.fabric):
            out = run(["ovs-ofctl", "-O", "OpenFlow15", "dump-ports", self.node(switch.name)])
            assert out.returncode == 0, out.stderr
            for port, tx in pattern.findall(out.stdout):
                counters[(switch.name, int(port))] = int(tx)
        return counters

    def dump_groups(self, switch: str) -> str:
        out = run(["ovs-ofctl", "-O", "OpenFlow15", "dump-groups", self.node(switch)])
        assert out.returncode == 0, out.stderr
        return out.stdout

    def group_types(self, switch: str) -> dict[int, str]:
        """Type of every group of ``switch`` (``select``, ``ff``, ...), by group id."""
        found = re.findall(r"group_id=(\d+),type=(\w+)", self.dump_groups(switch))
        return {int(gid): kind for gid, kind in found}

    def group_stats(self, switch: str) -> dict[int, list[int]]:
        """Packets per bucket of every group of ``switch``, by group id."""
        out = run(["ovs-ofctl", "-O", "OpenFlow15", "dump-group-stats", self.node(switch)])
        assert out.returncode == 0, out.stderr
        stats = {}
        for line in out.stdout.splitlines():
            gid = re.search(r"group_id=(\d+)", line)
            if gid is None:
                continue
            buckets = re.findall(r"bucket(\d+):packet_count=(\d+)", line)
            stats[int(gid.group(1))] = [int(n) for _, n in sorted(buckets, key=lambda b: int(b[0]))]
        return stats


def wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
