"""Signals a run took for itself, on record for whoever called it.

While a run goes, its own handlers take SIGINT, SIGTERM and SIGHUP: the run unwinds, tears
its fabric down and reports how it ended (``interrupted``, exit 130 or 128 + the signal),
and a teardown under way defers a second one. A program that called the run in-process
never sees the signal: a test session given Ctrl-C (or ``.ci/run``'s timeout) went on to
its next test, each signal failing only the test whose run took it. Every handler of ours
notes the signal here, so a caller can ask what arrived while it waited
(orchestrator.pytest_plugin stops the session so).
"""

from __future__ import annotations

_taken: list[int] = []


def note(signum: int) -> None:
    """Record that one of our handlers took ``signum``."""
    _taken.append(signum)


def mark() -> int:
    """A mark to ask :func:`since` about later."""
    return len(_taken)


def since(mark: int) -> list[int]:
    """The signals taken since ``mark``, oldest first."""
    return _taken[mark:]


def forget(mark: int) -> None:
    """Take the signals since ``mark`` off the record: for a caller that sent them to
    itself and has dealt with what they did (a test of a run's Ctrl-C)."""
    del _taken[mark:]
