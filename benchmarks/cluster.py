"""One machine against two: the same experiment side by side, and how far each goes.

    sudo .venv/bin/python benchmarks/cluster.py [--experiment FILE] [--reach] [--gpus 8,16,24]

The second machine is made on this host (orchestrator.cluster.nsmachine: its own network
and mount namespaces, sshd and Open vSwitch, reached over a veth), so the two machines
share this host's cores: the comparison measures what spreading a fabric costs or changes
(tunnels, a controller reached over the underlay, workers attached over SSH), not what a
second machine's CPU buys. On real machines run the same experiment with a ``cluster:``
key (docs/cluster.md).

1. **Side by side** (always): the experiment (default experiments/default.yaml) once here
   and once over ``[localhost, m2]``; per configuration the busbw at real speed of each and
   their ratio (two machines / one), with the saturation flag of each; bring-up and
   teardown of each; the tunnel probe's measured rate against what the cut links may
   offer; #wrong of every cell.
2. **Reach** (``--reach``): astral fabrics of growing GPU count at 12 Mbit/s per NIC port
   (scale 0.6e-4), each carrying a direct all-to-all (1 MiB, the collective with the most
   switch hops) under path-pinned, on one machine and over two: the largest that runs
   without the emulator-saturated flag, for each.

Printed with the machine's conditions (cores, load average, kernel, Open vSwitch).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from orchestrator import REPO
from orchestrator.cluster.nsmachine import NamespaceMachine

FLAGS = ["--no-calibrate", "--no-plots", "--force", "--quiet"]
REACH_SCALE = 0.6e-4  # 200G -> 12 Mbit/s
BUSY = 5  # astral run: another run holds the lock


def conditions() -> str:
    load = os.getloadavg()
    ovs = subprocess.run(["ovs-vswitchd", "--version"], capture_output=True, text=True)
    version = ovs.stdout.split("\n", 1)[0].split()[-1] if ovs.returncode == 0 else "?"
    return (
        f"{os.cpu_count()} cores, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, "
        f"kernel {platform.release()}, Open vSwitch {version}"
    )


def run(
    experiment: dict[str, Any],
    where: Path,
    inventory: Path | None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``astral run`` of ``experiment`` (with ``inventory``'s machines, and ``extra_env``
    on top of this process's environment); its summary and run record."""
    path = where / "experiment.yaml"
    path.write_text(yaml.safe_dump(experiment), encoding="utf-8")
    out = where / "bundle"
    env = dict(os.environ, **(extra_env or {}))
    if inventory is not None:
        env["ASTRAL_INVENTORY"] = str(inventory)
    while True:
        began = time.monotonic()
        done = _run_to_its_end(
            [sys.executable, "-m", "orchestrator.cli", "run", str(path), *FLAGS, "--out", str(out)],
            env,
        )
        if done.returncode != BUSY:
            break
        time.sleep(5)  # another run holds the machine's lock: not ours to measure beside
    if done.returncode != 0:
        raise SystemExit(f"astral run exited {done.returncode}:\n{done.stderr[-3000:]}")
    return {
        "summary": json.loads((out / "summary.json").read_text()),
        "run": json.loads((out / "run.json").read_text()),
        "wall_s": time.monotonic() - began,
    }


def _run_to_its_end(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``argv`` to completion; at Ctrl-C (which reaches it too: one process group) it is
    left to tear its fabric down, where subprocess.run would kill it at once."""
    with subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            out, err = process.communicate()
        except KeyboardInterrupt:
            process.wait()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def cells(result: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    return {
        (c["collective"] + " (" + c["algorithm"] + ")", c["policy"], c["size"]): c
        for c in result["summary"]["configurations"]
    }


def side_by_side(experiment: dict[str, Any], scratch: Path, inventory: Path) -> None:
    print("\n## The same experiment on one machine and over two\n")
    (scratch / "one").mkdir()
    (scratch / "two").mkdir()
    one = run(experiment, scratch / "one", inventory)
    two = run({**experiment, "cluster": ["localhost", "m2"]}, scratch / "two", inventory)
    a, b = cells(one), cells(two)
    print(f"{'collective':<22} {'policy':<12} {'size':>8} {'one GB/s':>9} {'two GB/s':>9} "
          f"{'two/one':>8}  saturated  #wrong")  # fmt: skip
    ratios = []
    for key in sorted(a):
        x, y = a[key], b[key]
        ratio = y["real"]["busbw_GBps"] / x["real"]["busbw_GBps"]
        ratios.append(ratio)
        saturated = (
            f"{'Y' if x['emulator_saturated'] else '-'}/{'Y' if y['emulator_saturated'] else '-'}"
        )
        print(
            f"{key[0]:<22} {key[1]:<12} {key[2]:>8} {x['real']['busbw_GBps']:>9.2f} "
            f"{y['real']['busbw_GBps']:>9.2f} {ratio:>8.3f}  {saturated:>9}  "
            f"{x['wrong']}/{y['wrong']}"
        )
    ratios.sort()
    middle = ratios[len(ratios) // 2]
    within = sum(1 for r in ratios if abs(r - 1) <= 0.05)
    print(
        f"\nbusbw two machines / one: median {middle:.3f}, range {ratios[0]:.3f}-"
        f"{ratios[-1]:.3f}, {within} of {len(ratios)} cells within 5 %"
    )
    for label, result in (("one machine", one), ("two machines", two)):
        timings = result["run"]["timings"]
        print(
            f"{label:<13} bring-up {timings.get('bring_up', 0):.1f} s, teardown "
            f"{timings.get('teardown', 0):.1f} s, whole run {result['wall_s']:.0f} s"
        )
    cluster = two["run"].get("cluster", {})
    for name, machine in cluster.get("machines", {}).items():
        tunnel = machine.get("tunnel")
        if tunnel and tunnel.get("measured_bps"):
            print(
                f"tunnel to {name}: {tunnel['measured_bps'] / 1e6:.0f} Mbit/s measured, the cut "
                f"links may offer {tunnel['load_bps'] / 1e6:.0f} Mbit/s ({tunnel['share']:.1%})"
            )
        if "clock_offset_s" in machine:
            print(f"clock offset of {name}: {machine['clock_offset_s'] * 1e3:+.3f} ms")
    for load in cluster.get("loads", []):
        print(f"load on {load['machine']}: {load['hop_bps'] / 1e6:.0f} hop-Mbit/s offered")


def reach_fabric(gpus: int) -> dict[str, Any]:
    """An astral fabric with ``gpus`` GPUs (2 per server, 2 NIC ports, 2 pods)."""
    servers = max(1, gpus // 4)
    return {
        "name": f"astral-{gpus}",
        "kind": "astral",
        "pods": 2,
        "servers_per_pod": servers,
        "gpus_per_server": 2,
        "nic_ports": 2,
        "switch": {"radix": max(4, 2 * servers), "down_ports": max(2, servers)},
        "speeds": {"nic": "200G", "tor_agg": "200G", "agg_core": "200G", "nvlink": "3.6T"},
        "emulation": {"scale": REACH_SCALE},
    }


def reach_experiment(gpus: int) -> dict[str, Any]:
    """Direct all-to-all of 1 MiB under path-pinned on :func:`reach_fabric`: what the reach
    runs (here and in benchmarks/capacity.py --reach)."""
    return {
        "name": f"reach-{gpus}",
        "fabric": reach_fabric(gpus),
        "policies": ["path-pinned"],
        "collectives": [{"op": "all-to-all", "algorithm": "direct"}],
        "sizes": {"min": "1M", "max": "1M"},
        "iterations": 1,
        "warmup": 1,
    }


def reach_row(
    label: str,
    experiment: dict[str, Any],
    where: Path,
    inventory: Path | None,
    extra_env: dict[str, str] | None = None,
) -> bool:
    """Run one reach experiment and print its row after ``label`` (busbw at real speed,
    the saturation flag, bring-up), or why it failed; whether it ran unflagged."""
    try:
        result = run(experiment, where, inventory, extra_env)
    except SystemExit as failure:
        said = [line for line in str(failure).splitlines() if line.strip()]
        print(f"{label}  failed: {said[-1] if said else '?'}")
        return False
    (cell,) = result["summary"]["configurations"]
    flagged = bool(cell["emulator_saturated"])
    print(
        f"{label} {cell['real']['busbw_GBps']:>11.2f} {'yes' if flagged else 'no':>10} "
        f"{result['run']['timings']['bring_up']:>11.1f}"
    )
    return not flagged


def reach(counts: list[int], scratch: Path, inventory: Path) -> None:
    print("\n## How far each goes: direct all-to-all of 1 MiB, path-pinned, 12 Mbit/s per port\n")
    print(f"{'GPUs':>5} {'machines':>9} {'busbw GB/s':>11} {'saturated':>10} {'bring-up s':>11}")
    largest: dict[int, int] = {}
    for gpus in counts:
        for machines in (1, 2):
            where = scratch / f"reach-{gpus}-{machines}"
            where.mkdir()
            experiment = reach_experiment(gpus)
            if machines == 2:
                experiment["cluster"] = ["localhost", "m2"]
            if reach_row(f"{gpus:>5} {machines:>9}", experiment, where, inventory):
                largest[machines] = max(largest.get(machines, 0), gpus)
    for machines in (1, 2):
        print(f"largest unflagged on {machines} machine(s): {largest.get(machines, 0)} GPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", type=Path, default=REPO / "experiments" / "default.yaml")
    parser.add_argument("--reach", action="store_true", help="also find the largest fabrics")
    parser.add_argument("--gpus", default="8,16,24,32", help="GPU counts for --reach")
    parser.add_argument("--keep", type=Path, help="copy every run's bundle into this directory")
    args = parser.parse_args()
    print(f"# benchmarks/cluster.py, {time.strftime('%Y-%m-%d %H:%M')}; {conditions()}")
    print("# the second machine is made on this host: both share its cores")
    experiment = yaml.safe_load(args.experiment.read_text())
    with tempfile.TemporaryDirectory(prefix="astral-cluster-bench-") as tmp:
        scratch = Path(tmp)
        with NamespaceMachine(scratch / "m2", name="m2") as machine:
            inventory = machine.inventory(scratch / "machines.yaml", project=REPO)
            try:
                side_by_side(experiment, scratch, inventory)
                if args.reach:
                    reach([int(n) for n in args.gpus.split(",")], scratch, inventory)
            finally:
                if args.keep is not None:
                    for bundle in scratch.glob("*/bundle"):
                        shutil.copytree(bundle, args.keep / bundle.parent.name)


if __name__ == "__main__":
    main()
