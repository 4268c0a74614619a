"""Run many ``ip``/``tc`` argument lists as few processes: batches and namespace scripts.

Configuring a fabric is thousands of small ``ip``/``tc`` commands; one process each costs
seconds on a small machine. Both tools read commands from standard input (``-batch -``), so
consecutive commands of the same tool become one process. Everything is built from argument
lists: a batch line is ``shlex.join(argv[1:])`` (ip and tc accept shell quoting in batch
mode), a script line ``shlex.join(argv)``; every name in them has been validated
(orchestrator.emulation.wiring.check_name) beforehand anyway.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from topologies.errors import EmulationError

BATCHABLE = ("ip", "tc")


@dataclass(frozen=True)
class BatchStep:
    """One process: ``argv``, fed ``stdin`` (a batch) or nothing."""

    argv: list[str]
    stdin: str | None = None


def plan_steps(commands: Iterable[Sequence[str]]) -> list[BatchStep]:
    """Group consecutive ip/tc commands into ``<tool> -batch -`` steps, in order."""
    steps: list[BatchStep] = []
    tool: str | None = None
    lines: list[str] = []

    def flush() -> None:
        nonlocal tool, lines
        if tool is not None and lines:
            steps.append(BatchStep([tool, "-batch", "-"], "\n".join(lines) + "\n"))
        tool, lines = None, []

    for argv in commands:
        argv = list(argv)
        if not argv:
            continue
        if argv[0] in BATCHABLE and not any(a.startswith("-") for a in argv[1:2]):
            if argv[0] != tool:
                flush()
                tool = argv[0]
            lines.append(shlex.join(argv[1:]))
        else:
            flush()
            steps.append(BatchStep(argv))
    flush()
    return steps


def script(commands: Iterable[Sequence[str]]) -> str:
    """A ``sh`` script running ``commands`` in order, batched, stopping at the first error."""
    out = ["set -e"]
    for step in plan_steps(commands):
        if step.stdin is None:
            out.append(shlex.join(step.argv))
        else:
            out.append(f"{shlex.join(step.argv)} <<'ASTRAL_EOF'\n{step.stdin}ASTRAL_EOF")
    return "\n".join(out) + "\n"


def run_steps(commands: Iterable[Sequence[str]], what: str) -> None:
    """Run ``commands`` here (the root namespace), batched; EmulationError on failure."""
    for step in plan_steps(commands):
        result = subprocess.run(
            step.argv, input=step.stdin, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise EmulationError(
                f"{what}: `{shlex.join(step.argv)}` failed (exit {result.returncode}): "
                f"{_errors(result.stderr)}"
            )


def _errors(stderr: str, limit: int = 6) -> str:
    """The lines of ``stderr`` that matter (tc prints harmless HTB quantum warnings)."""
    lines = [
        line
        for line in stderr.splitlines()
        if line.strip() and "quantum of class" not in line and "r2q" not in line
    ]
    shown = "; ".join(lines[:limit])
    return shown + (f" (and {len(lines) - limit} more lines)" if len(lines) > limit else "")


def errors_of(stderr: str) -> str:
    return _errors(stderr)
