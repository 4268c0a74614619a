"""The pure parts of a cluster run (orchestrator/cluster): each machine's wiring, the
tunnels of the cut links, the share's round trip to a part, the path trace's port spaces,
the tunnel probe's verdict, the SSH command lines. The machines themselves:
tests/integration/test_cluster.py."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cluster.emulation import MachineLoad, tunnels_of
from orchestrator.cluster.placement import place
from orchestrator.cluster.ssh import SshMachine
from orchestrator.cluster.trace import ClusterControl, shift_actions, shift_port_table
from orchestrator.cluster.tunnelprobe import TUNNEL_SHARE, TunnelProbe
from orchestrator.emulation.pathtrace import PortTable, datapath_actions
from orchestrator.emulation.share import Share
from orchestrator.emulation.wiring import plan_wiring
from orchestrator.remote.inventory import Endpoint, Machine, Timeouts
from topologies.catalog import resolve_fabric
from topologies.description import FabricDescription
from topologies.generators import build_fabric
from topologies.spec import load_fabric_spec

ADDRESSES = {"a": "192.0.2.1", "b": "192.0.2.2"}


def small() -> FabricDescription:
    return FabricDescription.of(build_fabric(load_fabric_spec(resolve_fabric("astral-small"))))


def test_every_link_is_a_veth_on_one_machine_or_a_tunnel_end_on_each() -> None:
    description = small()
    wiring = plan_wiring(description)
    placement = place(description, ["a", "b"])
    ends = tunnels_of(placement, wiring.veths, ADDRESSES, vni_base=1000)
    parts = {
        m: wiring.restricted(placement.share(m).gpus + placement.share(m).switches, ends[m])
        for m in ("a", "b")
    }
    veths = sum(len(p.veths) for p in parts.values())
    assert veths + len(placement.cut_links()) == len(wiring.veths)
    assert len(ends["a"]) == len(ends["b"]) == len(placement.cut_links())
    # both ends of a tunnel: one VNI, the same names as the veth ends they replace
    by_vni = {t.vni: t for t in ends["a"]}
    for far in ends["b"]:
        near = by_vni[far.vni]
        assert (
            (near.local, near.remote) == (far.remote, far.local) == (ADDRESSES["a"], ADDRESSES["b"])
        )
        assert near.rate_bps == far.rate_bps
    assert len(by_vni) == len(ends["a"])  # one VNI per cut link
    every_bridge = {b.name for b in wiring.bridges}
    assert {b.name for p in parts.values() for b in p.bridges} == every_bridge
    for machine, part in parts.items():
        # each bridge has every port it has on one machine, tunnels included
        for bridge in part.bridges:
            assert part.bridge_ports(bridge.name) == wiring.bridge_ports(bridge.name)
        # a switch-side tunnel end is shaped like the veth end it stands for
        shaped = {s.intf: s.rate_bps for s in part.shapers}
        for tunnel in part.tunnels:
            if tunnel.host is None:
                assert shaped[tunnel.intf] == tunnel.rate_bps
        assert set(part.root_interfaces()) <= set(wiring.root_interfaces())
        assert all(t.intf in part.root_interfaces() for t in part.tunnels if t.host is None)
        assert machine in placement.machines


def test_a_tunnel_is_a_vxlan_device_with_its_own_vni() -> None:
    description = small()
    wiring = plan_wiring(description)
    ends = tunnels_of(place(description, ["a", "b"]), wiring.veths, ADDRESSES, vni_base=7)
    argv = ends["a"][0].create_command("42")
    assert argv[:7] == ["ip", "link", "add", "name", ends["a"][0].intf, "group", "42"]
    assert argv[argv.index("type") + 1] == "vxlan" and argv[argv.index("id") + 1] == "7"
    assert argv[argv.index("mtu") + 1] == "1500"
    assert argv[argv.index("dstport") + 1] == "4789"


def test_a_share_survives_its_trip_to_a_part() -> None:
    description = small()
    wiring = plan_wiring(description)
    placement = place(description, ["a", "b"])
    ends = tunnels_of(placement, wiring.veths, ADDRESSES, vni_base=1)
    share = Share("b", frozenset(placement.share("b").gpus), tuple(ends["b"]), ("192.0.2.1", 6653))
    assert Share.from_dict(share.to_dict()) == share


DPIF = """\
netdev@ovs-netdev: hit:0 missed:0
  s1:
    s1 65534/1: (tap)
    s1-eth1 1/2: (system)
    s1-eth2 2/3: (system)
"""
TRACE = 'Flow: ...\nbridge("s1")\n output:2\n\nFinal flow: unchanged\nDatapath actions: 3\n'


def test_two_machines_datapath_ports_are_kept_apart() -> None:
    class Fake:
        name = "fake"

        def __init__(self, text: str) -> None:
            self.text = text

        def call(self, method: str, params: object) -> str:
            return DPIF.replace("s1", self.text) if method == "dpif/show" else TRACE

        def close(self) -> None:
            pass

    control = ClusterControl(
        ["a", "b"], lambda m: Fake("s1" if m == "a" else "s2"), lambda n: "a" if n == "s1" else "b"
    )
    table = PortTable.parse(control.call("dpif/show", []))
    assert table.datapath[3] == "s1-eth2" and table.datapath[1_000_003] == "s2-eth2"
    assert datapath_actions(control.call("ofproto/trace", ["s2", "flow"])) == ["1000003"]
    assert datapath_actions(control.call("ofproto/trace", ["s1", "flow"])) == ["3"]
    assert shift_port_table(DPIF, 0) == DPIF and shift_actions(TRACE, 0) == TRACE
    kept = shift_actions("Datapath actions: set(tunnel(tun_id=0x5)),hash(l4(0)),4\n", 10)
    assert kept.strip() == "Datapath actions: set(tunnel(tun_id=0x5)),hash(l4(0)),14"


def test_the_probe_says_whether_the_tunnel_carries_the_cut_links() -> None:
    enough = TunnelProbe("b", 1e9, TUNNEL_SHARE * 1e9)
    assert enough.enough and "enough" in enough.line() and enough.share == TUNNEL_SHARE
    short = TunnelProbe("b", 1e8, 1e8)
    assert not short.enough and "NOT enough" in short.line()
    failed = TunnelProbe("b", None, 1e6, "iperf3 failed")
    assert not failed.enough and "not measured (iperf3 failed)" in failed.line()


def test_a_machines_load_is_judged_by_its_own_calibration() -> None:
    assert "within" in MachineLoad("b", 5e8, 1e8, 1e9).line()
    assert "ABOVE" in MachineLoad("b", 2e9, 1e8, 1e9).line()
    assert "not calibrated" in MachineLoad("b", 2e9, 1e8, None).line()


def test_ssh_command_lines_check_the_host_key_and_quote_the_command(tmp_path: Path) -> None:
    machine = Machine(
        name="lab2", source=tmp_path / "machines.yaml", project="astral-testbed",
        known_hosts=tmp_path / "known_hosts", timeouts=Timeouts(), host="192.0.2.9",
        user="astral", key_file=tmp_path / "key",
    )  # fmt: skip
    ssh = SshMachine(machine, Endpoint("192.0.2.9", 22, "astral", tmp_path / "key"))
    argv = ssh.argv(["echo", "a b; rm -rf /"], forwards=[("/tmp/x.sock", "/run/y.sock")])
    assert "StrictHostKeyChecking=yes" in argv and "BatchMode=yes" in argv
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in argv
    assert argv[argv.index("-R") + 1] == "/tmp/x.sock:/run/y.sock"
    # not root: sudo -n, and the command one quoted string for the far side's shell
    assert argv[-1] == "sudo -n -- echo 'a b; rm -rf /'"
    assert ssh.python == "astral-testbed/.venv/bin/python"


def test_a_workers_times_are_moved_onto_the_launchers_clock() -> None:
    from orchestrator.worker import protocol

    start = protocol.start(1, 0, 2, at=100.0)
    assert protocol.shift_clock(start, 0.25)["at"] == 100.25  # into the worker's clock
    done = protocol.done(
        0, 1, 0, start=100.25, time_us=5.0, phases=[["send", 0, 100.3, 100.4]], traffic=[], wrong=0
    )
    back = protocol.shift_clock(done, -0.25)
    assert back["start"] == 100.0 and back["phases"] == [["send", 0, 100.05, 100.15]]
    samples = protocol.samples(0, [[100.5, 3, 1000]], tcp=[[100.5, 3, 1, 2, 3, 4, 5, 6, 7]])
    moved = protocol.shift_clock(samples, -0.25)
    assert moved["samples"] == [[100.25, 3, 1000]] and moved["tcp"][0][0] == 100.25
    assert protocol.shift_clock(done, 0.0) is done
    assert protocol.shift_clock(protocol.late(2.0), 1.0) == protocol.late(2.0)


def test_a_workers_login_is_awaited_through_a_local_command(tmp_path: Path) -> None:
    machine = Machine(
        name="lab2", source=tmp_path / "machines.yaml", project="/srv/astral",
        known_hosts=tmp_path / "known_hosts", timeouts=Timeouts(), host="192.0.2.9",
    )  # fmt: skip
    ssh = SshMachine(machine, Endpoint("192.0.2.9", 22, "root", None))
    marker = tmp_path / "ssh-p1s0g0.up"
    argv = ssh.argv(["true"], connected=marker)
    assert "PermitLocalCommand=yes" in argv
    assert f"LocalCommand=touch {marker}" in argv
    assert argv[-1] == "true"  # root: no sudo
    attach = ssh.attach(123, 456, ["python", "-m", "w"], stdin=True)
    assert attach[attach.index("--pid") + 1] == "123" and "--stdin" in attach
    assert attach[-3:] == ["python", "-m", "w"] and "/srv/astral/.venv/bin/python" in attach
