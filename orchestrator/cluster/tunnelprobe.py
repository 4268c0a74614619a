"""How much a tunnel between two machines carries: measured once per run, at bring-up.

The links a placement cuts are VXLAN tunnels over the network between the machines
(orchestrator.emulation.wiring.Tunnel); each is shaped to its link's emulated rate like any
other, but all of a machine pair's tunnels share that network and the kernels' VXLAN
code. So before the fabric carries traffic, one probe tunnel between the pair (the same
kind of device, another VNI, its own /30 of 169.254.199.0/24) carries one second of TCP
(iperf3), and the run compares the rate it got with what the pair's cut links may carry at
once (the sum of their emulated rates, both directions): a pair whose tunnels would need
more than :data:`TUNNEL_SHARE` of the probe's rate is named in the run's warnings, as an
emulator that cannot keep up is (docs/cluster.md).

Both ends are recorded before they are made: this machine's in the run's own record, the
other's by its part there (orchestrator.commands.cluster_part), so ``astral clean`` finds
them after a kill.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

from orchestrator.emulation.executor import Completed, run_local

PROBE_DEVICE = "astprobe0"
PROBE_NETWORK = "169.254.199.{}/30"
PROBE_SECONDS = 1.0
# The cut links' total rate may use this share of what the probe measured: the same
# headroom the calibration leaves (docs/calibration.md).
TUNNEL_SHARE = 0.7


@dataclass(frozen=True)
class TunnelProbe:
    """One pair's probe: the rate it measured and the traffic the cut links may offer."""

    machine: str
    measured_bps: float | None  # None: the probe failed (``problem`` says why)
    load_bps: float
    problem: str = ""

    @property
    def share(self) -> float | None:
        return self.load_bps / self.measured_bps if self.measured_bps else None

    @property
    def enough(self) -> bool:
        return self.measured_bps is not None and self.load_bps <= TUNNEL_SHARE * self.measured_bps

    def line(self) -> str:
        if self.measured_bps is None:
            return f"tunnel to {self.machine}: not measured ({self.problem})"
        verdict = "enough" if self.enough else "NOT enough: the tunnels may limit the links"
        return (
            f"tunnel to {self.machine}: {self.measured_bps / 1e6:.0f} Mbit/s measured (1 s of "
            f"TCP); its cut links may offer {self.load_bps / 1e6:.0f} Mbit/s = "
            f"{self.share:.0%}: {verdict}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "measured_bps": self.measured_bps,
            "load_bps": self.load_bps,
            "share": self.share,
            "enough": self.enough,
            "problem": self.problem,
        }


def device_commands(
    group: int, vni: int, local: str, remote: str, address: str, udp_port: int
) -> list[list[str]]:
    """One probe end: a VXLAN device in the root namespace with its /30 address, up."""
    return [
        ["ip", "link", "add", "name", PROBE_DEVICE, "group", str(group), "type", "vxlan",
         "id", str(vni), "local", local, "remote", remote, "dstport", str(udp_port)],
        ["ip", "addr", "add", address, "dev", PROBE_DEVICE],
        ["ip", "link", "set", "dev", PROBE_DEVICE, "up"],
    ]  # fmt: skip


def run_all(commands: list[list[str]]) -> Completed | None:
    """The first command that failed, or None."""
    for argv in commands:
        done = run_local(argv, timeout=15)
        if not done.ok:
            return done
    return None


def iperf3_rate(server: str, client: str, seconds: float = PROBE_SECONDS) -> float:
    """bit/s one TCP connection from ``client`` to ``server`` (an iperf3 server there)
    carried; raises OSError when iperf3 fails."""
    result = subprocess.run(
        ["iperf3", "-c", server, "-B", client, "-t", f"{seconds:g}", "-J"],
        capture_output=True, text=True, timeout=seconds + 20, check=False,
    )  # fmt: skip
    try:
        report = json.loads(result.stdout)
        return float(report["end"]["sum_received"]["bits_per_second"])
    except (ValueError, KeyError, TypeError):
        raise OSError(f"iperf3 failed: {(result.stderr or result.stdout).strip()[-200:]}") from None
