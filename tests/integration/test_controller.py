"""The controller programs a real (emulated) astral-small fabric: all pairs reach each other,
also after a NIC link failure and after a controller restart.

The fabric is built with Mininet's Python API, apart from the emulation module
(tests/integration/prefixed_net.py), its bridges speaking OpenFlow 1.3 only, and each GPU
host configured as ``astral up`` configures it (orchestrator.emulation.hostconfig: the
controller's contract): NIC ports carry the fabric address /32, a permanent neighbour entry
for the gateway and one multipath route over all NIC ports.

Every node name gets the prefix ``q7`` so that bridges and interfaces cannot collide with
another run or experiment on the machine; leftovers of a crashed run of this test (and only
those names) are removed before building.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controllers.routing import programmable_switches
from orchestrator.emulation.controller import ControllerProcess
from orchestrator.emulation.executor import run_local
from orchestrator.emulation.wiring import intf_name
from tests.helpers import preset_description
from tests.integration.prefixed_net import OVS_TIMEOUT, PrefixedFabric
from topologies.addressing import GATEWAY_IP, GATEWAY_MAC
from topologies.description import FabricDescription

pytestmark = pytest.mark.integration

PREFIX = "q7"  # unique to this test's nodes
PROTOCOLS = "OpenFlow13"
PROGRAM_TIMEOUT = 90.0


def wait_failed_links(controller: ControllerProcess, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = controller.status()
        if status is not None and len(status.failed_links) == count and status.programmed():
            return
        time.sleep(0.05)
    raise AssertionError(
        f"controller did not settle on {count} failed link(s): {controller.status()}\n"
        + controller.log_tail()
    )


def route_entry_ages(bridge: str) -> dict[str, float]:
    """Seconds since each route entry (priority 100) of ``bridge`` was installed, by address."""
    out = run_local(
        ["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge, "ip"], timeout=OVS_TIMEOUT
    )
    assert out.ok, out.stderr
    ages = {}
    for line in out.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.replace(",", " ").split() if "=" in f)
        if fields.get("priority") == "100" and "nw_dst" in fields:
            ages[fields["nw_dst"]] = float(fields["duration"].rstrip("s"))
    return ages


@pytest.fixture
def description() -> FabricDescription:
    return preset_description("astral-small")


@pytest.fixture
def fabric(description: FabricDescription) -> Iterator[PrefixedFabric]:
    with PrefixedFabric(description, PREFIX, protocols=PROTOCOLS).running() as running:
        yield running


def test_controller_routes_all_pairs_and_survives_failure_and_restart(
    description: FabricDescription, fabric: PrefixedFabric, tmp_path: Path
) -> None:
    fabric_json = description.write(tmp_path / "fabric.json")
    with ControllerProcess(fabric_json, tmp_path / "run") as controller:
        started = time.monotonic()
        fabric.point_switches_at(controller.target)
        status = controller.wait_programmed(timeout=PROGRAM_TIMEOUT)
        connect_to_programmed = time.monotonic() - started
        assert status.missing() == []
        assert {s.dpid for s in status.switches.values()} == set(status.expected_dpids)
        assert all(s.errors == 0 for s in status.switches.values())
        assert fabric.unreachable() == []

        # A NIC link of a dual-ToR GPU fails: its traffic must come in over the other ToR.
        gpu = "p1s0g1"
        dead = next(x for x in description.fabric.nic_links(gpu) if x.port_of(gpu) == 1)
        fabric.faults.set_link_state(dead, up=False)
        wait_failed_links(controller, 1)
        status = controller.status()
        assert status is not None
        assert status.failed_links == [(dead.a, dead.a_port, dead.b, dead.b_port)]
        assert fabric.unreachable(down=frozenset({fabric.intf(gpu, 1)})) == []

        # Back up. Taking a device down flushed its permanent gateway neighbour entry, so the
        # GPU ARPs for the gateway on that port: the controller answers.
        fabric.faults.set_link_state(dead, up=True)
        wait_failed_links(controller, 0)
        assert fabric.unreachable() == []

        # Without its static neighbour entry a GPU ARPs for the gateway: the controller answers.
        port = intf_name("p0s0g0", 2)  # the model's name: the fabric runs it as its own
        fabric.run("p0s0g0", ["ip", "neigh", "del", GATEWAY_IP, "dev", port])
        assert fabric.unreachable() == []
        neigh = fabric.run("p0s0g0", ["ip", "neigh", "show", GATEWAY_IP, "dev", port]).stdout
        assert GATEWAY_MAC in neigh and "PERMANENT" not in neigh, neigh

        # A restarted controller (same port) reads each switch's table and sends only the
        # difference: nothing here, so every route entry survives (the data plane is left
        # alone), while a foreign entry is removed.
        foreign = ["ovs-ofctl", "-O", "OpenFlow13", "add-flow", fabric.node("c0")]
        assert run_local([*foreign, "priority=100,ip,nw_dst=10.9.9.9,actions=drop"]).ok
        restart_began = time.monotonic()
        controller.restart()
        controller.wait_programmed(timeout=PROGRAM_TIMEOUT)
        restart_to_programmed = time.monotonic() - restart_began
        for switch in programmable_switches(description.fabric):
            ages = route_entry_ages(fabric.node(switch.name))
            assert len(ages) == status.switches[switch.dpid].rules
            assert min(ages.values()) > time.monotonic() - restart_began, switch.name
        assert (
            "10.9.9.9"
            not in run_local(
                ["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", fabric.node("c0")]
            ).stdout
        )
        assert fabric.unreachable() == []

    print(
        f"\nastral-small: {len(status.expected_dpids)} switches programmed "
        f"{connect_to_programmed:.2f} s after set-controller; "
        f"{restart_to_programmed:.2f} s from restart() to programmed again"
    )
