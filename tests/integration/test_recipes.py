"""The ``jumbo-packets`` emulator recipe on a real fabric (orchestrator/emulation/recipe.py):
at 4x the reference rate every link carries frames of 4 x 1500 bytes, its queues hold the
reference's packets, and TCP between pods gets through with them, within what a frame of
that size lets TCP carry. Speeds are not asserted beyond physics (docs/capacity.md has the
measurements); that the big frames really cross Open vSwitch is: a datapath that dropped
them would carry nothing.

Needs root and Open vSwitch (tests/conftest.py); waits for the run lock.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace

import pytest

from orchestrator.calibration.measure import start_emulation
from orchestrator.emulation.recipe import RECIPES
from orchestrator.testbed.traffic import Flow, run_flows
from topologies.catalog import resolve_fabric
from topologies.spec import load_fabric_spec

pytestmark = pytest.mark.integration


def test_jumbo_frames_cross_the_fabric_at_four_times_the_rate() -> None:
    spec = load_fabric_spec(resolve_fabric("astral-small"))
    fast = replace(spec, emulation=replace(spec.emulation, scale=spec.emulation.scale * 4))
    recipe = RECIPES["jumbo-packets"]
    emu = start_emulation(fast, 900.0, lambda _: None, recipe=recipe)
    try:
        assert emu.description is not None and emu.wiring is not None
        fitted = recipe.fitted(emu.description)
        assert (fitted.packet_scale, fitted.mtu) == (4, 6000)
        # every switch-side end and every GPU port carries the larger frames
        links = json.loads(
            subprocess.run(
                ["ip", "-j", "link", "show"], capture_output=True, text=True, check=True
            ).stdout
        )
        mtus = {link["ifname"]: link["mtu"] for link in links}
        veth = emu.wiring.veths[0]
        assert mtus[veth.a_intf] == 6000
        host = veth.b_host or "p0s0g0"
        shown = emu.cmd(host, ["ip", "-j", "link", "show"])
        assert {link["mtu"] for link in json.loads(shown) if link["ifname"] != "lo"} == {6000}
        # one flow from pod 0 to pod 1 over five switches
        result = run_flows(emu, [Flow("p0s0g0", "p1s0g0")], duration=2.0, omit=1.0)
        rate = 80e6
        goodput = result.aggregate_bps
        assert 0.5 * rate * fitted.payload_share < goodput <= 1.02 * rate * fitted.payload_share
    finally:
        emu.stop()
