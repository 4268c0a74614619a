"""Compare ECMP with path pinning for an all-to-all, built and read in Python.

    sudo .venv/bin/python examples/compare_policies.py [--out DIR]

Builds the experiment in code (the keys of an experiment file), runs it on an emulated
astral-small as `astral run` would (about a minute), and prints each policy's average bus
bandwidth at real speed and their ratio. Needs what `astral run` needs: root and Open
vSwitch (./setup.sh).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator import api
from topologies.errors import AstralError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the bundle's directory")
    args = parser.parse_args()
    spec = api.experiment(
        name="compare-policies",
        fabric="astral-small",
        policies=["ecmp", "path-pinned"],
        collectives=[{"op": "all-to-all", "algorithm": "direct"}],
        sizes={"min": "256K", "max": "1M", "factor": 4},
        iterations=2,
        warmup=1,
        scale=0.6e-4,  # 12 Mbit/s per 200G port: inside a 2-core machine's safe share
    )
    try:
        outcome = api.run(spec, out=args.out)
    except AstralError as error:  # a refused load, no Open vSwitch, another run's lock
        print(f"compare_policies: {error}", file=sys.stderr)
        return error.exit_status
    if outcome.status != "ok" or outcome.bundle is None:
        print(f"compare_policies: the run {outcome.status}", file=sys.stderr)
        return outcome.exit_status or 1
    results = api.results(outcome.bundle)
    ecmp = results.average("ecmp", "all-to-all")
    pinned = results.average("path-pinned", "all-to-all")
    print(f"all-to-all average busbw at real speed: ecmp {ecmp:.2f} GB/s, "
          f"path-pinned {pinned:.2f} GB/s")  # fmt: skip
    print(f"path-pinned / ecmp = {pinned / ecmp:.3f}  (bundle {outcome.bundle})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
