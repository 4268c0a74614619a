"""What the tests share: where the repository is, fabrics built from the shipped presets,
quick launch options for workers on loopback, and a command that builds a fabric, run so
that an interrupted test lets it tear down.

Presets are found through :mod:`topologies.catalog`, as every entry point finds them, so a
test exercises the same lookup as ``astral up astral-small`` and no test knows the folder.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from orchestrator.worker.spec import LaunchOptions
from topologies.catalog import DEFAULT_PRESET, preset_path
from topologies.description import FabricDescription
from topologies.generators import build_fabric
from topologies.model import Fabric
from topologies.spec import FabricSpec, load_fabric_spec, parse_fabric_spec

#: The repository's root (the folder holding pyproject.toml).
REPO = Path(__file__).resolve().parents[1]

#: Seconds an interrupted command is given to tear its fabric down before it is killed.
TEARDOWN_WAIT = 60.0


def run_command(
    argv: Sequence[str], *, timeout: float | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=..., **kwargs)``, except
    when it is cut short. ``subprocess.run`` kills its child with SIGKILL when the test is
    interrupted (Ctrl-C, ``.ci/run``'s timeout) or the timeout expires, and an ``astral run``
    killed in the middle of its teardown leaves its bridges behind. Here the child gets
    SIGINT, as a user's Ctrl-C, and :data:`TEARDOWN_WAIT` seconds to end before it is
    killed; then the interruption or the timeout goes on as before."""
    process = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=TEARDOWN_WAIT)
        except BaseException:
            process.kill()
            process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def preset_spec(name: str = DEFAULT_PRESET) -> FabricSpec:
    """The fabric spec of preset ``name``."""
    return load_fabric_spec(preset_path(name))


def preset_fabric(name: str = DEFAULT_PRESET) -> Fabric:
    """The fabric model of preset ``name``."""
    return build_fabric(preset_spec(name))


def preset_description(name: str = DEFAULT_PRESET) -> FabricDescription:
    """The fabric description (model and addressing plan) of preset ``name``."""
    return FabricDescription.of(preset_fabric(name))


#: one pod of 4 servers x 2 GPUs on 2 rail leaves, one spine joined to each leaf by 4
#: parallel links at half the NIC rate (a ToR oversubscription of 2 at radix 8): what a
#: generated fabric can be, and no preset is
PARALLEL_LINKS: dict[str, Any] = {
    "name": "rail-twins",
    "kind": "rail-optimized",
    "pods": 1,
    "servers_per_pod": 4,
    "gpus_per_server": 2,
    "nic_ports": 1,
    "switch": {"radix": 8, "down_ports": 4},
    "oversubscription": {"tor": 2, "agg": 1},
}


def parallel_links_description() -> FabricDescription:
    """The description of :data:`PARALLEL_LINKS`."""
    return FabricDescription.of(build_fabric(parse_fabric_spec(PARALLEL_LINKS, "test")))


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (benchmarks are scripts, not a package), for
    tests of their pure parts."""
    spec = importlib.util.spec_from_file_location(
        f"benchmark_{name}", REPO / "benchmarks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def fast_options(**overrides: object) -> LaunchOptions:
    """Launch options for workers on loopback: few iterations, failures detected fast."""
    defaults: dict[str, object] = {
        "warmup": 1,
        "iterations": 2,
        "heartbeat_interval": 0.1,
        "heartbeat_timeout": 1.5,
        "step_deadline": 1.5,
        "settle_time": 0.3,
    }
    defaults.update(overrides)
    return LaunchOptions(**defaults)  # type: ignore[arg-type]


def dump_ports(bridge: str) -> str:
    """``ovs-ofctl dump-ports`` of ``bridge`` (OpenFlow 1.3, as the controller speaks it):
    each port's receive and transmit counters as Open vSwitch keeps them."""
    argv = ["ovs-ofctl", "-O", "OpenFlow13", "dump-ports", bridge]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail the block (TimeoutError) if it takes longer than ``seconds``: what used to hang
    then fails instead of stalling the suite. A guard against hangs, not a speed test:
    give it ten times what the block takes on a busy machine."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def nft_dropped(table: str, netns_pid: int | None = None) -> int:
    """Packets the nftables table's drop rules counted (a loss fault's own count: ground
    truth for the tests; in a GPU's namespace when a pid is given)."""
    argv = ["nft", "-j", "list", "table", "netdev", table]
    if netns_pid is not None:
        argv = ["nsenter", "-t", str(netns_pid), "-n", "--", *argv]
    document = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return sum(
        expr["counter"]["packets"]
        for item in document["nftables"]
        if "rule" in item
        for expr in item["rule"]["expr"]
        if "counter" in expr
    )
