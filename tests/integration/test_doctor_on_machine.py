"""The real `astral doctor` on this machine (root and Open vSwitch: see tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from orchestrator.emulation import doctor
from orchestrator.worker import rto

ASTRAL = Path(sys.executable).parent / "astral"


def test_facts_are_gathered_from_the_machine() -> None:
    facts = doctor.gather_facts()
    assert facts.euid == 0
    assert facts.ovs is not None and facts.ovs.error is None, facts.ovs
    assert facts.ovs.version
    assert all(not v.startswith("error") for v in facts.modules.values()), facts.modules
    assert facts.cpus >= 1 and 0 < facts.mem_available <= facts.mem_total
    assert facts.rto_min is None  # no probe handed in
    with_probe = doctor.gather_facts(rto.probe)
    assert with_probe.rto_min is not None
    assert with_probe.rto_min.granted_us == rto.probe()[1]


def test_doctor_says_a_run_can_work_on_a_set_up_machine() -> None:
    # setup.sh (run before the tests) installs and starts everything doctor checks for.
    result = subprocess.run(
        [str(ASTRAL), "doctor"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ready: a run can work here" in result.stdout
    assert "FAIL" not in result.stdout
    granted = rto.probe()[1]  # this kernel's answer, as the check must report it
    line = next(x for x in result.stdout.splitlines() if "minimum RTO" in x)
    if granted is None:
        assert line.startswith("WARN") and "refuses TCP_RTO_MIN_US" in line
    else:
        assert line.startswith("OK") and f"{granted / 1000:g} ms on a TCP socket" in line


def test_doctor_rejects_an_unknown_fabric_in_one_sentence() -> None:
    result = subprocess.run(
        [str(ASTRAL), "doctor", "no-such-preset"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert result.stderr.startswith("astral: error: ")
    assert "Traceback" not in result.stderr
