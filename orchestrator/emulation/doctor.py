"""Can this machine run the testbed? Facts in, verdicts out.

``astral doctor`` works in two steps, kept apart so that the second can be tested anywhere:

1. :func:`gather_facts` looks at the machine (user id, Open vSwitch, datapath, tools on
   PATH, the Python packages, cores and memory, and, through the probe the command hands
   it, the minimum RTO a worker's socket gets). Only this step runs commands.
2. Each check in :data:`CHECKS` turns :class:`Facts` and the :class:`Demand` of the fabric
   asked for into one :class:`CheckResult`: a name, a verdict (OK, WARN, FAIL), a detail and,
   unless OK, a fix. A run cannot work while any check FAILs; WARN means it works but
   something is slower or unconfirmed.

Memory is estimated from figures measured on the project's machine (Debian 12, OVS 3.1.0,
userspace datapath with TSO, ovs-vswitchd with its default ``--mlockall``), as resident set
size (RSS) growth:

- ovs-vswitchd: +55 MB once, when the first userspace bridge creates the datapath (its
  threads' locked stacks), then +2.2 MB per bridge and +2.1 MB per port (8 and 16 extra
  bridges, 16 and 32 veth ports, measured in a private OVS instance in its own namespace).
  The kernel datapath needs less; the same figures then overestimate.
- each emulated GPU: its Mininet host shell (``bash --norc -is``: 3.3 MB) plus a Python
  worker (``python3`` with the standard library's socket/json/struct: 10.9 MB).
- once: the os-ken controller (its imports: 40 MB, rounded to 45) and the orchestrator
  (Mininet, networkx, PyYAML, paramiko imported: 65 MB).

Checked against a busier ovs-vswitchd (136 bridges, 928 ports, several runs at once): it
had 2.48 GB resident, the figures above give 2.30 GB. The total, with a 25% margin, must fit
in MemAvailable.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from orchestrator.emulation import datapath
from orchestrator.emulation.recipe import ENV_VAR as RECIPE_ENV
from orchestrator.emulation.recipe import current_recipe
from topologies.errors import ConfigError, EnvironmentProblem
from topologies.model import Fabric

MB = 1_000_000
MEMORY_DATAPATH = 55 * MB
MEMORY_PER_BRIDGE = int(2.2 * MB)
MEMORY_PER_PORT = int(2.1 * MB)
MEMORY_PER_GPU = int((3.3 + 10.9) * MB)
MEMORY_CONTROLLER = 45 * MB
MEMORY_ORCHESTRATOR = 65 * MB
MEMORY_MARGIN = 1.25
# The default fabric (8 GPUs) was measured to run on 2 cores: 4 emulated GPUs per core.
GPUS_PER_CORE = 4
MIN_CORES = 2

# Import name -> distribution name (for its version), in dependency order.
PYTHON_MODULES = {
    "mininet.net": "mininet",
    "os_ken.base.app_manager": "os-ken",
    "paramiko": "paramiko",
    "yaml": "PyYAML",
    "networkx": "networkx",
    "matplotlib": "matplotlib",
    "tqdm": "tqdm",
    "numpy": "numpy",
}
# Command -> apt package that provides it.
TOOLS = {"mnexec": "mininet", "iperf3": "iperf3", "tc": "iproute2", "nft": "nftables"}

OVS_LOG = Path(os.environ.get("OVS_LOGDIR", "/var/log/openvswitch")) / "ovs-vswitchd.log"
# ovs-vswitchd's first log line after it starts (the monitor's lines say "vlog(monitor)").
VSWITCHD_START_LINE = "|00001|vlog|INFO|opened log file"
TSO_LOG_LINE = "Userspace TCP Segmentation Offloading support enabled"
SETUP_FIX = "run `sudo ./setup.sh`"


class Verdict(str, Enum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class CheckResult:
    name: str
    verdict: Verdict
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        """False only for FAIL: a WARN does not stop a run."""
        return self.verdict is not Verdict.FAIL


@dataclass(frozen=True)
class OvsFacts:
    """What Open vSwitch looks like. ``error`` is why it is not usable, None if it is."""

    error: str | None
    version: str = ""
    kernel_datapath: bool = False
    tso_setting: bool = False  # other_config:userspace-tso-enable
    tso_logged: bool | None = None  # logged as enabled since vswitchd started; None: unknown


@dataclass(frozen=True)
class RtoMinFacts:
    """What a new TCP socket got when it asked for the workers' minimum RTO, in us
    (orchestrator.worker.rto). ``granted_us`` None: the kernel's 200 ms floor holds."""

    requested_us: int
    granted_us: int | None
    kernel: str


#: What measures RtoMinFacts: (requested us, granted us or None). The worker's own code
#: (orchestrator.worker.rto.probe), handed in by ``astral doctor``: this layer does not
#: import the workers.
RtoMinProbe = Callable[[], tuple[int, int | None]]


@dataclass(frozen=True)
class Facts:
    euid: int
    ovs: OvsFacts | None  # None: not looked at (needs root)
    tools: Mapping[str, str | None]  # command -> path, None if missing
    modules: Mapping[str, str]  # import name -> version, or "error: ..." if the import failed
    cpus: int
    mem_available: int  # bytes
    mem_total: int
    rto_min: RtoMinFacts | None = None  # None: not probed


@dataclass(frozen=True)
class Demand:
    """What the fabric asked for needs from the machine."""

    fabric: str
    gpus: int
    switches: int
    switch_ports: int

    @classmethod
    def of(cls, fabric: Fabric, nodes: Collection[str] | None = None, name: str = "") -> Demand:
        """What ``fabric`` needs, or the share of it made of ``nodes`` (one machine's part of
        a fabric over several: orchestrator.cluster)."""
        held = set(fabric.nodes()) if nodes is None else set(nodes)
        switches = [s for s in fabric.switches if s in held]
        ports = sum(
            (link.a in fabric.switches and link.a in held)
            + (link.b in fabric.switches and link.b in held)
            for link in fabric.links
        )
        gpus = [g for g in fabric.gpus if g in held]
        return cls(name or fabric.name, len(gpus), len(switches), ports)

    def memory(self) -> int:
        """Estimated bytes for a run, without the margin (module docstring)."""
        return (
            MEMORY_DATAPATH
            + MEMORY_CONTROLLER
            + MEMORY_ORCHESTRATOR
            + self.switches * MEMORY_PER_BRIDGE
            + self.switch_ports * MEMORY_PER_PORT
            + self.gpus * MEMORY_PER_GPU
        )

    def describe(self) -> str:
        return (
            f"fabric {self.fabric}: {self.gpus} GPUs, {self.switches} switches, "
            f"{self.switch_ports} switch ports"
        )


# Checks: facts -> verdict ------------------------------------------------------------

Check = Callable[[Facts, Demand], CheckResult]


def check_root(facts: Facts, demand: Demand) -> CheckResult:
    if facts.euid == 0:
        return CheckResult("root", Verdict.OK, "running as root")
    return CheckResult(
        "root",
        Verdict.FAIL,
        f"running as uid {facts.euid}; Mininet and Open vSwitch need root",
        "run it with sudo (`sudo .venv/bin/astral ...`)",
    )


def _not_checked(name: str, facts: Facts) -> CheckResult | None:
    """The verdict for an OVS-dependent check when OVS could not be looked at."""
    if facts.ovs is None:
        return CheckResult(name, Verdict.WARN, "not checked: needs root", "run it as root")
    if facts.ovs.error is not None:
        return CheckResult(name, Verdict.WARN, "not checked: Open vSwitch is not usable", SETUP_FIX)
    return None


def check_ovs(facts: Facts, demand: Demand) -> CheckResult:
    name = "open vswitch"
    if facts.ovs is None:
        return CheckResult(name, Verdict.WARN, "not checked: needs root", "run it as root")
    if facts.ovs.error is not None:
        return CheckResult(name, Verdict.FAIL, facts.ovs.error, SETUP_FIX)
    return CheckResult(
        name, Verdict.OK, f"ovsdb-server and ovs-vswitchd answer (OVS {facts.ovs.version})"
    )


def check_datapath(facts: Facts, demand: Demand) -> CheckResult:
    name = "datapath"
    skipped = _not_checked(name, facts)
    if skipped:
        return skipped
    assert facts.ovs is not None
    if facts.ovs.kernel_datapath:
        return CheckResult(name, Verdict.OK, "kernel (openvswitch module usable)")
    return CheckResult(
        name, Verdict.OK, "userspace (no openvswitch kernel module; slower, needs TSO)"
    )


def check_tso(facts: Facts, demand: Demand) -> CheckResult:
    name = "userspace TSO"
    skipped = _not_checked(name, facts)
    if skipped:
        return skipped
    assert facts.ovs is not None
    ovs = facts.ovs
    if ovs.kernel_datapath:
        return CheckResult(name, Verdict.OK, "not needed: kernel datapath")
    if not ovs.tso_setting:
        return CheckResult(
            name,
            Verdict.FAIL,
            "other_config:userspace-tso-enable is not true: TCP about 9x slower",
            datapath.TSO_FIX,
        )
    if ovs.tso_logged is False:
        return CheckResult(
            name,
            Verdict.WARN,
            "set, but ovs-vswitchd has not logged enabling it since it started",
            "restart ovs-vswitchd: "
            "`/usr/share/openvswitch/scripts/ovs-ctl --no-ovsdb-server restart`",
        )
    how = "confirmed in the log" if ovs.tso_logged else "set; the log could not confirm it"
    return CheckResult(name, Verdict.OK, f"enabled ({how})")


def check_recipe(facts: Facts, demand: Demand) -> CheckResult:
    """The emulator recipe runs will use (orchestrator.emulation.recipe): named, so that a
    capacity or fidelity figure can be matched with the recipe it was measured under."""
    name = "emulator recipe"
    try:
        recipe = current_recipe()
    except ConfigError as err:
        return CheckResult(name, Verdict.FAIL, str(err), f"unset ${RECIPE_ENV} or fix it")
    return CheckResult(name, Verdict.OK, recipe.describe())


def _tool_check(command: str, package: str) -> Check:
    def check(facts: Facts, demand: Demand) -> CheckResult:
        path = facts.tools.get(command)
        if path:
            return CheckResult(command, Verdict.OK, path)
        return CheckResult(
            command,
            Verdict.FAIL,
            "not found on PATH",
            f"{SETUP_FIX} (or `apt-get install {package}`)",
        )

    check.__name__ = f"check_{command}"
    return check


def check_python(facts: Facts, demand: Demand) -> CheckResult:
    name = "python packages"
    broken = {module: v for module, v in facts.modules.items() if v.startswith("error")}
    versions = ", ".join(
        f"{PYTHON_MODULES.get(module, module)} {v}"
        for module, v in facts.modules.items()
        if module not in broken
    )
    if broken:
        detail = "; ".join(f"{module}: {v}" for module, v in broken.items())
        return CheckResult(name, Verdict.FAIL, detail, f"{SETUP_FIX} (it installs .venv)")
    return CheckResult(name, Verdict.OK, versions)


def check_cpus(facts: Facts, demand: Demand) -> CheckResult:
    name = "cores"
    wanted = max(MIN_CORES, -(-demand.gpus // GPUS_PER_CORE))
    detail = f"{facts.cpus} for {demand.gpus} emulated GPUs (suggested: {wanted})"
    if facts.cpus >= wanted:
        return CheckResult(name, Verdict.OK, detail)
    return CheckResult(
        name,
        Verdict.WARN,
        detail + "; the emulator forwards less, so runs scale their load down",
        "more cores, or a smaller fabric",
    )


def check_memory(facts: Facts, demand: Demand) -> CheckResult:
    name = "memory"
    need = int(demand.memory() * MEMORY_MARGIN)
    detail = (
        f"~{_mib(need)} needed (estimate incl. 25% margin), "
        f"{_mib(facts.mem_available)} available of {_mib(facts.mem_total)}"
    )
    if need > facts.mem_available:
        return CheckResult(name, Verdict.FAIL, detail, "free memory, or use a smaller fabric")
    if need > facts.mem_available // 2:
        return CheckResult(
            name, Verdict.WARN, detail + "; over half of what is free", "free some memory"
        )
    return CheckResult(name, Verdict.OK, detail)


def check_rto_min(facts: Facts, demand: Demand) -> CheckResult:
    name = "minimum RTO"
    found = facts.rto_min
    if found is None:
        return CheckResult(name, Verdict.WARN, "not checked (no probe given)")
    asked = f"{found.requested_us / 1000:g} ms"
    if found.granted_us is not None:
        return CheckResult(
            name,
            Verdict.OK,
            f"{found.granted_us / 1000:g} ms on a TCP socket ({asked} asked, TCP_RTO_MIN_US)",
        )
    return CheckResult(
        name,
        Verdict.WARN,
        f"kernel {found.kernel} refuses TCP_RTO_MIN_US ({asked} asked): the workers' "
        "connections keep Linux's 200 ms floor, so a transfer whose tail an incast drops "
        "waits 200 ms for its retransmission and small all-to-all sizes measure that timer; "
        "runs warn and record it",
        "a kernel with TCP_RTO_MIN_US (Linux 6.15 or later; docs/environment.md, "
        '"The minimum RTO")',
    )


CHECKS: tuple[Check, ...] = (
    check_root,
    check_ovs,
    check_datapath,
    check_tso,
    check_recipe,
    *(_tool_check(command, package) for command, package in TOOLS.items()),
    check_python,
    check_cpus,
    check_memory,
    check_rto_min,
)


def evaluate(facts: Facts, demand: Demand, checks: Sequence[Check] = CHECKS) -> list[CheckResult]:
    return [check(facts, demand) for check in checks]


def render(results: Sequence[CheckResult], demand: Demand) -> str:
    """The table, then the fix for each check that is not OK."""
    width = max(len(result.name) for result in results)
    lines = [f"astral doctor: {demand.describe()}", ""]
    lines += [f"{r.verdict.value:<4}  {r.name:<{width}}  {r.detail}" for r in results]
    fixes: dict[str, list[str]] = {}  # fix -> the checks it fixes, each fix said once
    for r in results:
        if r.verdict is not Verdict.OK and r.fix:
            fixes.setdefault(r.fix, []).append(r.name)
    if fixes:
        lines += ["", "To fix:"]
        lines += [f"  {', '.join(names)}: {fix}" for fix, names in fixes.items()]
    failed = sum(not r.ok for r in results)
    lines += [
        "",
        "a run cannot work here: fix the FAIL lines above"
        if failed
        else "ready: a run can work here",
    ]
    return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


# Facts: the only part that looks at the machine ------------------------------------


def tso_logged(log_text: str) -> bool | None:
    """Whether ovs-vswitchd logged enabling userspace TSO since it last started.

    None when the log does not show the start (rotated away, or another log).
    """
    start = log_text.rfind(VSWITCHD_START_LINE)
    if start < 0:
        return None
    return TSO_LOG_LINE in log_text[start:]


def _read_log_tail(path: Path, limit: int = 8 * MB) -> str | None:
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - limit))
            return log.read().decode("utf-8", "replace")
    except OSError:
        return None


def gather_ovs() -> OvsFacts:
    try:
        version = datapath.check_ovs_running()
    except EnvironmentProblem as problem:
        return OvsFacts(error=str(problem))
    log = _read_log_tail(OVS_LOG)
    return OvsFacts(
        error=None,
        version=version,
        kernel_datapath=datapath.kernel_datapath_works(bridge="astral-docprobe"),
        tso_setting=datapath.userspace_tso_enabled(),
        tso_logged=None if log is None else tso_logged(log),
    )


_IMPORT_SCRIPT = """
import importlib, importlib.metadata, json, sys
found = {}
for module, dist in json.loads(sys.argv[1]).items():
    try:
        importlib.import_module(module)
        found[module] = importlib.metadata.version(dist)
    except Exception as err:
        found[module] = f"error: {type(err).__name__}: {err}"
print(json.dumps(found))
"""


def gather_modules(python: str = sys.executable) -> dict[str, str]:
    """Import each package in a fresh interpreter (no side effects here), with versions."""
    try:
        result = subprocess.run(
            [python, "-c", _IMPORT_SCRIPT, json.dumps(PYTHON_MODULES)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        found: dict[str, str] = json.loads(result.stdout)
        return found
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        return {module: f"error: could not run {python}: {err}" for module in PYTHON_MODULES}


def _meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    values = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * 1024  # kB
    return values


def gather_rto_min(probe: RtoMinProbe) -> RtoMinFacts:
    requested, granted = probe()
    return RtoMinFacts(requested, granted, platform.release())


def gather_facts(rto_min: RtoMinProbe | None = None) -> Facts:
    """The machine's facts; ``rto_min``: the probe of the workers' minimum RTO (None: the
    check says not checked)."""
    euid = os.geteuid()
    memory = _meminfo()
    return Facts(
        euid=euid,
        ovs=gather_ovs() if euid == 0 else None,
        tools={command: shutil.which(command) for command in TOOLS},
        modules=gather_modules(),
        cpus=len(os.sched_getaffinity(0)),
        mem_available=memory.get("MemAvailable", memory.get("MemFree", 0)),
        mem_total=memory.get("MemTotal", 0),
        rto_min=gather_rto_min(rto_min) if rto_min is not None else None,
    )


@dataclass
class Report:
    demand: Demand
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(result.ok for result in self.results)


def diagnose(fabric: Fabric, rto_min: RtoMinProbe | None = None) -> Report:
    """Gather the facts (``rto_min``: see :func:`gather_facts`) and check them against
    ``fabric``."""
    demand = Demand.of(fabric)
    return Report(demand, evaluate(gather_facts(rto_min), demand))
