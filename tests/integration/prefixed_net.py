"""A fabric in Mininet under a name prefix, for controller tests that must not collide.

Built with Mininet's Python API, apart from :class:`orchestrator.emulation.network.Emulation`
(which takes the machine's run lock and would wait for any other run): userspace Open
vSwitch, fabric switches fail-secure, NVLink switches learning on their own, and every node
name starting with a given prefix, so that these tests can run next to an ``astral up`` or
another test on the same machine. The bridges allow OpenFlow 1.3 *and* 1.5 by default (the
controller negotiates 1.5 to install select groups with ``selection_method=hash``;
``controllers.openflow``).

:class:`PrefixedFabric` is a :class:`~orchestrator.emulation.executor.CommandExecutor` on the
fabric model's names: a command names interfaces as the model does (``p0s0g0-eth1``), and
:meth:`~PrefixedFabric.run` and :meth:`~PrefixedFabric.popen` turn them into this fabric's
(``g3p0s0g0-eth1``). So the product's own code works on it unchanged: every GPU is
configured with the commands :mod:`orchestrator.emulation.hostconfig` renders, links fail
through :class:`orchestrator.emulation.faults.FabricFaults`, and reachability is checked with
the emulation's readiness probe.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from mininet.net import Mininet
from mininet.node import Host, OVSSwitch

from controllers.routing import programmable_switches
from orchestrator.emulation.executor import Completed, run_local
from orchestrator.emulation.faults import FabricFaults, link_ends
from orchestrator.emulation.hostconfig import render_all, render_host_config
from orchestrator.emulation.readiness import Target, probe_once
from orchestrator.emulation.wiring import intf_name
from topologies.description import FabricDescription
from topologies.model import Tier

PROTOCOLS = "OpenFlow13,OpenFlow15"
#: Seconds an ovs-vsctl or ovs-ofctl call may take (a busy ovs-vswitchd answers slowly).
OVS_TIMEOUT = 120.0


class PrefixedFabric:
    """Names, construction, commands and probes of one prefixed emulated fabric."""

    def __init__(
        self, description: FabricDescription, prefix: str, protocols: str = PROTOCOLS
    ) -> None:
        self.description = description
        self.prefix = prefix
        self.protocols = protocols
        self.net: Mininet | None = None
        #: Link state and rate changes, on the model's links (orchestrator.emulation.faults).
        self.faults = FabricFaults(self, description)
        self._processes: list[subprocess.Popen[bytes]] = []
        # Every interface name of the model, as a whole word (a sysctl key holds it between
        # dots), to be replaced by this fabric's.
        names = sorted(
            {
                intf_name(node, port)
                for link in description.fabric.links
                for node, port in link_ends(link)
            },
            key=len,
            reverse=True,
        )
        self._model_intf = re.compile(
            r"(?<![\w-])(" + "|".join(map(re.escape, names)) + r")(?![\w-])"
        )

    def node(self, name: str) -> str:
        return self.prefix + name

    def intf(self, name: str, port: int) -> str:
        return self.node(intf_name(name, port))

    def host(self, gpu: str) -> Host:
        assert self.net is not None
        return self.net[self.node(gpu)]

    # --- the executor protocol, in the model's names -----------------------------------------

    def prefixed(self, argv: Sequence[str]) -> list[str]:
        """``argv`` with the model's interface names replaced by this fabric's."""
        return [self._model_intf.sub(lambda m: self.prefix + m.group(1), arg) for arg in argv]

    def run(
        self,
        node: str | None,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 30.0,
    ) -> Completed:
        """Run ``argv`` to completion in GPU ``node``'s namespace (entered with Mininet's
        ``mnexec -a``, as its ``Host.popen`` does), else in the root namespace, where the
        switch ports live."""
        command = self.prefixed(argv)
        if node in self.description.fabric.gpus:
            command = ["mnexec", "-a", str(self.host(node).pid), *command]
        return run_local(command, input=input, timeout=timeout)

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``gpu``'s namespace; the fabric stops it when it goes down."""
        process: subprocess.Popen[bytes] = self.host(gpu).popen(self.prefixed(argv), **kwargs)
        self._processes.append(process)
        return process

    # --- lifecycle -------------------------------------------------------------------------

    def remove_leftovers(self) -> None:
        """Bridges and root-namespace interfaces of a crashed run (our names only)."""
        for switch in self.description.fabric.switches:
            run_local(
                ["ovs-vsctl", "--if-exists", "del-br", self.node(switch)], timeout=OVS_TIMEOUT
            )
        for link in self.description.fabric.links:
            for name, port in link_ends(link):
                if Path(f"/sys/class/net/{self.intf(name, port)}").exists():
                    run_local(["ip", "link", "del", self.intf(name, port)])

    @contextmanager
    def running(self) -> Iterator[PrefixedFabric]:
        self.remove_leftovers()
        self.net = self._build()
        try:
            self.net.start()
            self._configure_hosts()
            yield self
        finally:
            self._stop_processes()
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
            switch=partial(OVSSwitch, datapath="user", protocols=self.protocols),
            autoSetMacs=False,
        )
        for switch in sorted(fabric.switches.values(), key=lambda s: s.dpid):
            net.addSwitch(
                self.node(switch.name),
                dpid=f"{switch.dpid:016x}",
                # NVLink switches learn on their own; fabric switches wait for the controller.
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
        """Every GPU as ``astral up`` configures it (orchestrator.emulation.hostconfig: the
        contract with the controller), without the shapers: these tests check where packets
        go, not at what rate, and the switch ends of the links are not shaped either."""
        for gpu, config in render_all(self.description).items():
            commands = [
                config.sysctl_argv(),
                *config.links,
                *config.addresses,
                *config.neighbours,
                *config.routes,
            ]
            for argv in commands:
                done = self.run(gpu, argv)
                assert done.ok, f"{gpu}: {' '.join(argv)}: {done.stdout}{done.stderr}"

    def restore_gateway(self, gpu: str, port: int) -> None:
        """Put back the permanent gateway neighbour entry of ``gpu``'s NIC port ``port``, as
        the host configuration renders it: setting a device down flushes it."""
        dev = intf_name(gpu, port)
        for argv in render_host_config(self.description, gpu).neighbours:
            if dev in argv:
                done = self.run(gpu, argv)
                assert done.ok, f"{gpu}: {' '.join(argv)}: {done.stderr}"

    def _stop_processes(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        self._processes.clear()

    def point_switches_at(self, target: str) -> None:
        """Connect the fabric switches (not the NVLink ones) to the controller, 1 s max backoff.

        Open vSwitch 3.1 ignores ``max_backoff`` given when the Controller row is created (the
        connection keeps the default 8 s: "waiting 1, 2, 4 seconds before reconnect" in
        ovs-vswitchd.log); it applies the value when the row changes later. So: two
        transactions. Without it, each controller restart waits longer for the switches
        (1.3, 2.4, 4.5, 9 s).
        """
        switches = [self.node(s.name) for s in programmable_switches(self.description.fabric)]
        argv = ["ovs-vsctl"]
        for i, switch in enumerate(switches):
            argv += ["--", f"--id=@c{i}", "create", "Controller", f'target="{target}"']
            argv += ["--", "set", "Bridge", switch, f"controller=@c{i}"]
        result = run_local(argv, timeout=OVS_TIMEOUT)
        assert result.ok, result.stderr
        argv = ["ovs-vsctl"]
        for switch in switches:  # a Controller row is named by its (only) bridge
            argv += ["--", "set", "Controller", switch, "max_backoff=1000"]
        result = run_local(argv, timeout=OVS_TIMEOUT)
        assert result.ok, result.stderr

    # --- probes ----------------------------------------------------------------------------

    def unreachable(self, down: frozenset[str] = frozenset()) -> list[str]:
        """Every (source NIC port, destination) pair without an echo reply, as ``"PORT ->
        ADDRESS"``; the ports in ``down`` (this fabric's interface names) are skipped.

        Each GPU probes every other GPU's fabric address out of each of its NIC ports in
        turn, so both ToRs of every pair carry traffic to every destination. The probe is the
        emulation's readiness probe (orchestrator.emulation.readiness): the echo is bound to
        the port, and the reply is heard whichever port it comes back on.
        """
        addresses = self.description.addresses
        plan = {
            src.gpu: [
                Target(src.gpu, dst.gpu, dst.fabric_ip, self.intf(src.gpu, nic.port), "fabric")
                for nic in src.nics
                if self.intf(src.gpu, nic.port) not in down
                for dst in addresses.values()
                if dst is not src
            ]
            for src in addresses.values()
        }
        netns = {gpu: f"/proc/{self.host(gpu).pid}/ns/net" for gpu in plan}
        failed = probe_once(plan, netns)
        return [f"{t.dev} -> {t.address}" for targets in failed.values() for t in targets]

    def port_tx_bytes(self) -> dict[tuple[str, int], int]:
        """Transmitted bytes of every fabric switch port, by (model switch name, port)."""
        counters: dict[tuple[str, int], int] = {}
        pattern = re.compile(r"port\s+(\d+): rx .*?\n\s+tx pkts=\d+, bytes=(\d+)", re.S)
        for switch in programmable_switches(self.description.fabric):
            out = run_local(
                ["ovs-ofctl", "-O", "OpenFlow15", "dump-ports", self.node(switch.name)],
                timeout=OVS_TIMEOUT,
            )
            assert out.ok, out.stderr
            for port, tx in pattern.findall(out.stdout):
                counters[(switch.name, int(port))] = int(tx)
        return counters

    def dump_groups(self, switch: str) -> str:
        out = run_local(
            ["ovs-ofctl", "-O", "OpenFlow15", "dump-groups", self.node(switch)], timeout=OVS_TIMEOUT
        )
        assert out.ok, out.stderr
        return out.stdout

    def group_types(self, switch: str) -> dict[int, str]:
        """Type of every group of ``switch`` (``select``, ``ff``, ...), by group id."""
        found = re.findall(r"group_id=(\d+),type=(\w+)", self.dump_groups(switch))
        return {int(gid): kind for gid, kind in found}

    def group_stats(self, switch: str) -> dict[int, list[int]]:
        """Packets per bucket of every group of ``switch``, by group id."""
        out = run_local(
            ["ovs-ofctl", "-O", "OpenFlow15", "dump-group-stats", self.node(switch)],
            timeout=OVS_TIMEOUT,
        )
        assert out.ok, out.stderr
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
