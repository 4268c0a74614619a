"""Which Open vSwitch datapath this machine can run, detected rather than assumed.

The kernel datapath is faster, but needs the ``openvswitch`` kernel module; many lab VMs and
containers lack it, and then only the userspace datapath (``datapath_type=netdev``) works.
Userspace OVS carries TCP over veth pairs about 9x faster with userspace TSO enabled
(docs/environment.md), so a userspace run without it is refused with the fix
instead of producing misleading numbers.

Detection order:

1. Open vSwitch must answer (``ovs-vsctl show`` and ``ovs-appctl version``), else
   :class:`~topologies.errors.EnvironmentProblem`.
2. ``/sys/module/openvswitch`` exists: kernel datapath.
3. Otherwise a short-lived probe bridge with ``datapath_type=system`` is created: if OVS gives
   its local port an OpenFlow port number, the module is usable (the attempt may have loaded
   it); if not, userspace.
4. Userspace needs ``other_config:userspace-tso-enable=true``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from topologies.errors import EnvironmentProblem

PROBE_BRIDGE = "astral-dpprobe"
TSO_FIX = (
    "run `sudo ./setup.sh` (it enables it), or `ovs-vsctl set Open_vSwitch . "
    "other_config:userspace-tso-enable=true` and restart ovs-vswitchd "
    "(`/usr/share/openvswitch/scripts/ovs-ctl --no-ovsdb-server restart`)"
)

# runs one argument list and returns what it printed (a caller may pass its own)
CommandRunner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)


@dataclass(frozen=True)
class Datapath:
    """The datapath a run uses. ``kind`` is ``kernel`` or ``userspace``."""

    kind: str
    ovs_version: str
    tso: bool | None = None  # userspace TSO; None where it does not apply (kernel)

    @property
    def ovs_type(self) -> str:
        """The bridge's ``datapath_type`` column."""
        return "system" if self.kind == "kernel" else "netdev"

    @property
    def mininet(self) -> str:
        """Mininet's ``OVSSwitch(datapath=...)`` spelling."""
        return "kernel" if self.kind == "kernel" else "user"

    def describe(self) -> str:
        if self.kind == "kernel":
            return f"kernel (OVS {self.ovs_version})"
        tso = "on" if self.tso else "off"
        return f"userspace, TSO {tso} (OVS {self.ovs_version})"


def check_ovs_running(run: CommandRunner = _run) -> str:
    """Return the OVS version, or raise EnvironmentProblem saying how to start it."""
    for argv in (
        ["ovs-vsctl", "--timeout=60", "show"],
        # Busy (applying a large change) it may take a while to answer; dead, it fails at
        # once (no control socket).
        ["ovs-appctl", "--timeout=60", "-t", "ovs-vswitchd", "version"],
    ):
        try:
            result = run(argv)
        except (OSError, subprocess.SubprocessError) as err:
            raise EnvironmentProblem(
                f"Open vSwitch is not usable (`{' '.join(argv)}`: {err}); run `sudo ./setup.sh`"
            ) from None
        if result.returncode != 0:
            raise EnvironmentProblem(
                f"Open vSwitch is not running (`{' '.join(argv)}` failed: "
                f"{result.stderr.strip() or result.stdout.strip()}); run `sudo ./setup.sh` or "
                "`/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random`"
            )
    version = run(["ovs-vsctl", "--version"]).stdout.split("\n", 1)[0]
    return version.rsplit(" ", 1)[-1] if version else "unknown"


def kernel_datapath_works(
    run: CommandRunner = _run,
    module_dir: Path = Path("/sys/module/openvswitch"),
    bridge: str = PROBE_BRIDGE,
    tag: dict[str, str] | None = None,
) -> bool:
    """True when the kernel datapath is available (module loaded, or a probe bridge works).

    ``tag`` goes into the probe bridge's ``external_ids`` so that a run killed while
    probing leaves a bridge ``astral clean`` recognises as its own.
    """
    if module_dir.exists():
        return True
    ids = [f"external_ids:{key}={value}" for key, value in (tag or {}).items()]
    try:
        created = run(
            [
                "ovs-vsctl",
                "--timeout=60",
                "--may-exist",
                "add-br",
                bridge,
                "--",
                "set",
                "Bridge",
                bridge,
                "datapath_type=system",
                *ids,
            ]
        )
        if created.returncode != 0 or "Error detected" in created.stderr:
            return False
        ofport = run(["ovs-vsctl", "--timeout=60", "get", "Interface", bridge, "ofport"])
        value = ofport.stdout.strip()
        return value.lstrip("-").isdigit() and int(value) >= 0
    finally:
        run(["ovs-vsctl", "--timeout=60", "--if-exists", "del-br", bridge])


def userspace_tso_enabled(run: CommandRunner = _run) -> bool:
    result = run(
        [
            "ovs-vsctl",
            "--timeout=60",
            "--if-exists",
            "get",
            "Open_vSwitch",
            ".",
            "other_config:userspace-tso-enable",
        ]
    )
    return result.stdout.strip().strip('"') == "true"


def detect_datapath(
    run: CommandRunner = _run,
    module_dir: Path = Path("/sys/module/openvswitch"),
    probe_tag: dict[str, str] | None = None,
) -> Datapath:
    """Detect the datapath (see the module docstring); raise EnvironmentProblem if unusable."""
    version = check_ovs_running(run)
    if kernel_datapath_works(run, module_dir, tag=probe_tag):
        return Datapath("kernel", version)
    if not userspace_tso_enabled(run):
        raise EnvironmentProblem(
            "Open vSwitch must use its userspace datapath here (no openvswitch kernel module) "
            "and userspace TSO is off, which makes TCP about 9x slower: " + TSO_FIX
        )
    return Datapath("userspace", version, tso=True)
