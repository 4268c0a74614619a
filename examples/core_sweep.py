"""A study built in Python: all-reduce against the core's oversubscription, with a check.

    sudo .venv/bin/python examples/core_sweep.py [--out DIR]

Sweeps `oversubscription.agg` over 1 and 4 on astral-small (each fabric brought up once),
states what first principles expect (a 4:1 core cuts a ring that crosses pods), and prints
the measured ratio with the study's verdict: the same study machinery as `astral run` on
a study file (docs/studies.md), in about a minute and a half.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator import api
from orchestrator.study.runner import StudyOutcome
from topologies.errors import AstralError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the study bundle's directory")
    args = parser.parse_args()
    study = api.study(
        name="core-sweep",
        fabric="astral-small",
        sweep={"oversubscription.agg": [1, 4]},
        policies=["path-pinned"],
        collectives=["all-reduce"],
        sizes={"min": "1M", "max": "1M"},
        iterations=2,
        warmup=1,
        scale=0.6e-4,
        study={
            "question": "what does a 4:1 core cost a ring all-reduce that crosses pods?",
            "expected": "a large cut: the ring paces at its cross-pod edge",
            "checks": [
                {
                    "name": "a 4:1 core slows the ring",
                    "of": {"oversubscription.agg": 4},
                    "to": {"oversubscription.agg": 1},
                    "ratio": [0.1, 0.8],
                }
            ],
        },
    )
    try:
        outcome = api.run(study, out=args.out)
    except AstralError as error:
        print(f"core_sweep: {error}", file=sys.stderr)
        return error.exit_status
    assert isinstance(outcome, StudyOutcome) and outcome.bundle is not None
    results = api.results(outcome.bundle)
    for variant in results.variants():
        print(f"{variant}: all-reduce {results.average(variant=variant):.2f} GB/s at real speed")
    for verdict in outcome.verdicts:
        print(f"verdict: {verdict.outcome}: {verdict.text}")
    return outcome.exit_status


if __name__ == "__main__":
    sys.exit(main())
