"""astral doctor: how facts about a machine become verdicts (no root, nothing probed).

The facts are given as data; what is under test is the logic that judges them. Gathering
real facts is covered by tests/integration/test_doctor_on_machine.py.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.commands import doctor as doctor_command
from orchestrator.emulation import doctor
from orchestrator.emulation.doctor import (
    CheckResult,
    Demand,
    Facts,
    OvsFacts,
    RtoMinFacts,
    Verdict,
)
from topologies.errors import FabricSpecError
from topologies.generators import build_fabric
from topologies.spec import load_fabric_spec

GIB = 2**30

HEALTHY = Facts(
    euid=0,
    ovs=OvsFacts(error=None, version="3.1.0", tso_setting=True, tso_logged=True),
    tools={
        "mnexec": "/usr/bin/mnexec",
        "iperf3": "/usr/bin/iperf3",
        "tc": "/usr/sbin/tc",
        "nft": "/usr/sbin/nft",
    },
    modules={module: "1.0" for module in doctor.PYTHON_MODULES},
    cpus=2,
    mem_available=20 * GIB,
    mem_total=24 * GIB,
    rto_min=RtoMinFacts(requested_us=5000, granted_us=8000, kernel="6.18.0"),
)
SMALL = Demand("astral-small", gpus=8, switches=24, switch_ports=88)


def verdicts(facts: Facts, demand: Demand = SMALL) -> dict[str, CheckResult]:
    return {result.name: result for result in doctor.evaluate(facts, demand)}


def test_a_healthy_machine_passes_every_check() -> None:
    results = verdicts(HEALTHY)
    assert {r.verdict for r in results.values()} == {Verdict.OK}
    assert "not checked" not in " ".join(r.detail for r in results.values())


def test_not_root_fails_and_leaves_ovs_unchecked() -> None:
    results = verdicts(replace(HEALTHY, euid=1000, ovs=None))
    assert results["root"].verdict is Verdict.FAIL
    assert "sudo" in results["root"].fix
    for name in ("open vswitch", "datapath", "userspace TSO"):
        assert results[name].verdict is Verdict.WARN
        assert "needs root" in results[name].detail


def test_ovs_not_running_fails_with_the_setup_fix() -> None:
    facts = replace(HEALTHY, ovs=OvsFacts(error="Open vSwitch is not running"))
    results = verdicts(facts)
    assert results["open vswitch"].verdict is Verdict.FAIL
    assert results["open vswitch"].detail == "Open vSwitch is not running"
    assert "setup.sh" in results["open vswitch"].fix
    assert results["userspace TSO"].verdict is Verdict.WARN


def test_tso_is_not_needed_on_the_kernel_datapath() -> None:
    ovs = OvsFacts(error=None, version="3.1.0", kernel_datapath=True, tso_setting=False)
    results = verdicts(replace(HEALTHY, ovs=ovs))
    assert results["datapath"].detail.startswith("kernel")
    assert results["userspace TSO"].verdict is Verdict.OK
    assert "not needed" in results["userspace TSO"].detail


def test_userspace_without_tso_fails_with_how_to_enable_it() -> None:
    ovs = OvsFacts(error=None, version="3.1.0", tso_setting=False, tso_logged=None)
    result = verdicts(replace(HEALTHY, ovs=ovs))["userspace TSO"]
    assert result.verdict is Verdict.FAIL
    assert "userspace-tso-enable=true" in result.fix


@pytest.mark.parametrize(
    ("logged", "verdict", "words"),
    [
        (True, Verdict.OK, "confirmed"),
        (None, Verdict.OK, "could not confirm"),
        (False, Verdict.WARN, "has not logged"),
    ],
)
def test_tso_set_is_judged_by_what_the_log_shows(
    logged: bool | None, verdict: Verdict, words: str
) -> None:
    ovs = OvsFacts(error=None, version="3.1.0", tso_setting=True, tso_logged=logged)
    result = verdicts(replace(HEALTHY, ovs=ovs))["userspace TSO"]
    assert result.verdict is verdict
    assert words in result.detail


def test_a_missing_tool_fails_naming_its_package() -> None:
    facts = replace(HEALTHY, tools={**HEALTHY.tools, "mnexec": None})
    result = verdicts(facts)["mnexec"]
    assert result.verdict is Verdict.FAIL
    assert "apt-get install mininet" in result.fix


def test_a_package_that_does_not_import_fails_with_its_error() -> None:
    modules = {**HEALTHY.modules, "os_ken.base.app_manager": "error: ImportError: eventlet"}
    result = verdicts(replace(HEALTHY, modules=modules))["python packages"]
    assert result.verdict is Verdict.FAIL
    assert "os_ken.base.app_manager: error: ImportError: eventlet" in result.detail


def test_the_minimum_rto_granted_is_ok_refused_warns_with_the_cost_and_the_fix() -> None:
    result = verdicts(HEALTHY)["minimum RTO"]
    assert result.verdict is Verdict.OK
    assert result.detail == "8 ms on a TCP socket (5 ms asked, TCP_RTO_MIN_US)"
    refused = RtoMinFacts(requested_us=5000, granted_us=None, kernel="6.1.0-28-amd64")
    result = verdicts(replace(HEALTHY, rto_min=refused))["minimum RTO"]
    assert result.verdict is Verdict.WARN and result.ok  # a run still works, slower
    assert "kernel 6.1.0-28-amd64 refuses TCP_RTO_MIN_US" in result.detail
    assert "200 ms" in result.detail and "incast" in result.detail
    assert "Linux 6.15 or later" in result.fix
    unprobed = verdicts(replace(HEALTHY, rto_min=None))["minimum RTO"]
    assert unprobed.verdict is Verdict.WARN and "not checked" in unprobed.detail


def test_the_minimum_rto_fact_comes_from_the_probe_handed_in() -> None:
    facts = doctor.gather_rto_min(lambda: (5000, None))
    assert (facts.requested_us, facts.granted_us) == (5000, None) and facts.kernel


def test_memory_verdicts_follow_the_estimate() -> None:
    need = int(SMALL.memory() * doctor.MEMORY_MARGIN)
    assert verdicts(replace(HEALTHY, mem_available=need - 1))["memory"].verdict is Verdict.FAIL
    assert verdicts(replace(HEALTHY, mem_available=need + 1))["memory"].verdict is Verdict.WARN
    assert verdicts(replace(HEALTHY, mem_available=3 * need))["memory"].verdict is Verdict.OK


def test_memory_estimate_grows_with_the_fabric() -> None:
    big = Demand("big", gpus=512, switches=600, switch_ports=3000)
    assert SMALL.memory() < 1 * GIB
    assert big.memory() > 10 * SMALL.memory()


def test_few_cores_warn_but_do_not_stop_a_run() -> None:
    result = verdicts(replace(HEALTHY, cpus=1))["cores"]
    assert result.verdict is Verdict.WARN
    assert result.ok
    many_gpus = replace(SMALL, gpus=64)
    assert verdicts(HEALTHY, many_gpus)["cores"].verdict is Verdict.WARN


def test_demand_counts_the_default_fabric() -> None:
    fabric = build_fabric(load_fabric_spec(doctor_command.fabric_path("astral-small")))
    demand = Demand.of(fabric)
    assert (demand.gpus, demand.switches) == (len(fabric.gpus), len(fabric.switches))
    # Every link has at least one switch end; GPU-to-GPU links do not exist here.
    assert len(fabric.links) <= demand.switch_ports <= 2 * len(fabric.links)


# Reading ovs-vswitchd's log (lines as OVS 3.1.0 writes them) --------------------------

START = "2026-11-29T17:01:17.528Z|00001|vlog|INFO|opened log file /var/log/x.log\n"
MONITOR = "2026-11-29T17:02:31.548Z|00003|vlog(monitor)|INFO|opened log file /var/log/x.log\n"
TSO = "2026-11-29T17:02:34.654Z|00010|userspace_tso|INFO|" + doctor.TSO_LOG_LINE + "\n"
OTHER = "2026-11-29T17:01:17.537Z|00007|bridge|INFO|ovs-vswitchd (Open vSwitch) 3.1.0\n"


def test_tso_log_after_the_last_start_counts() -> None:
    assert doctor.tso_logged(START + OTHER + TSO) is True
    assert doctor.tso_logged(START + OTHER) is False
    # Enabled by an earlier ovs-vswitchd, then restarted without it:
    assert doctor.tso_logged(START + TSO + MONITOR + START + OTHER) is False
    # A log rotated after the start does not show it: unknown.
    assert doctor.tso_logged(OTHER + TSO) is None


# Output and the command ---------------------------------------------------------------


def test_render_lists_fixes_for_what_is_not_ok() -> None:
    results = doctor.evaluate(replace(HEALTHY, tools={**HEALTHY.tools, "tc": None}), SMALL)
    text = doctor.render(results, SMALL)
    assert "FAIL  tc" in text
    assert "To fix:\n  tc: " in text
    assert text.endswith("a run cannot work here: fix the FAIL lines above")
    assert doctor.render(doctor.evaluate(HEALTHY, SMALL), SMALL).endswith(
        "ready: a run can work here"
    )


def test_render_says_a_shared_fix_once() -> None:
    facts = replace(HEALTHY, ovs=OvsFacts(error="Open vSwitch is not running"))
    text = doctor.render(doctor.evaluate(facts, SMALL), SMALL)
    assert "  open vswitch, datapath, userspace TSO: run `sudo ./setup.sh`" in text
    assert text.count("run `sudo ./setup.sh`") == 1


def test_fabric_argument_is_a_preset_or_a_path() -> None:
    assert doctor_command.fabric_path("astral-small").name == "astral-small.yaml"
    assert str(doctor_command.fabric_path("my/fabric.yaml")) == "my/fabric.yaml"
    with pytest.raises(FabricSpecError, match="a preset name"):
        doctor_command.fabric_path("no-such-preset")


def test_doctor_registers_with_a_default_fabric() -> None:
    parser = argparse.ArgumentParser()
    doctor_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor"])
    assert args.fabric == doctor_command.DEFAULT_FABRIC
    assert args.func is doctor_command.run


def test_doctor_reports_the_recipe_in_use_and_the_capacity_per_packet_size(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from orchestrator.calibration import capacity as cal
    from orchestrator.emulation.recipe import ENV_VAR

    path = tmp_path / "calibration.json"
    monkeypatch.setenv(cal.ENV_VAR, str(path))
    monkeypatch.setenv(ENV_VAR, "jumbo-packets")
    lines = doctor_command.capacity_lines()
    assert lines[0].startswith("recipe: jumbo-packets (")
    assert "not calibrated" in lines[1]

    def step(flows: int, rate: float, ratio: float, scale: int) -> cal.LoadStep:
        offered = flows * rate
        return cal.LoadStep(flows, rate, 5.0, offered, offered * 5, offered * ratio, ratio,
                            packet_scale=scale)  # fmt: skip

    steps = (step(16, 20e6, 0.97, 1), step(16, 40e6, 0.98, 2), step(16, 58.5e6, 0.95, 2))
    measured = cal.Calibration(
        capacity_bps=4680e6, bound="lower", conditions={"recipe": "jumbo-packets"}, steps=steps
    )
    cal.save_calibration(measured, path)
    lines = doctor_command.capacity_lines()
    assert "4680 hop-Mbit/s" in lines[1] and "under recipe jumbo-packets" in lines[1]
    assert any("packets x1" in line and "2340 hop-Mbit/s" in line for line in lines)  # half
    assert any("packets x2" in line and "4680 hop-Mbit/s" in line for line in lines)
    assert not any("another recipe" in line for line in lines)
    monkeypatch.setenv(ENV_VAR, "small-packets")
    assert "another recipe" in doctor_command.capacity_lines()[-1]
