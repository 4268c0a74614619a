"""The project's exception hierarchy, in one place.

Every error a user can cause or meet derives from :class:`AstralError`; the CLI catches
that one class, prints ``str(error)`` (one sentence, no traceback) and exits with the
error's ``exit_status``. Library code never calls ``exit()``.

It lives in ``topologies/`` because that package imports nothing else of ours, so both
``orchestrator/`` and ``controllers/`` can import it without breaking the layering::

    AstralError                  base: message + exit status
    +-- ConfigError              a file the user wrote is wrong (exit 2)
    |   +-- FabricSpecError      ... a fabric description
    |   +-- ExperimentError      ... an experiment description
    |   +-- InventoryError       ... the inventory of remote machines
    |   +-- WorkloadError        ... a training workload (model, parallelism, batch, GPU)
    +-- EnvironmentProblem       the machine cannot do what was asked (exit 3)
    +-- EmulationError           bringing a fabric up or down failed (exit 4)
    +-- ConcurrentRunError       another run holds the lock (exit 5)
    +-- ResultsError             a results bundle is missing, damaged or foreign (exit 6)
    +-- WrongResultsError        a run completed, but a collective delivered wrong data (exit 7)
    +-- RemoteError              a remote machine unreachable, refused, or lost (exit 8)
"""

from __future__ import annotations

from pathlib import Path


class AstralError(Exception):
    """Base of every error the CLI reports as a sentence instead of a traceback."""

    exit_status: int = 1


class ConfigError(AstralError):
    """A user-written file is wrong: names the file, the key path, expected and found.

    ``key`` is a dotted path into the document (``speeds.nic``, ``pods``); empty for
    problems with the file as a whole (unreadable, not YAML, not a mapping).
    """

    exit_status = 2

    def __init__(
        self,
        file: str | Path | None,
        key: str,
        expected: str,
        found: object = None,
        *,
        detail: str = "",
    ) -> None:
        self.file = str(file) if file is not None else "<inline>"
        self.key = key
        self.expected = expected
        self.found = found
        self.detail = detail
        super().__init__(self._sentence())

    def _sentence(self) -> str:
        where = f"{self.file}: " + (f"key '{self.key}': " if self.key else "")
        found = "" if self.found is None else f", found {self.found!r}"
        detail = f" ({self.detail})" if self.detail else ""
        return f"{where}expected {self.expected}{found}{detail}"


class FabricSpecError(ConfigError):
    """A fabric description is malformed or describes a fabric that cannot be wired."""


class ExperimentError(ConfigError):
    """An experiment description is malformed."""


class InventoryError(ConfigError):
    """The inventory of remote machines (``astral ... --on MACHINE``) is malformed."""


class WorkloadError(ConfigError):
    """A training workload description is malformed, or its parallel layout does not divide
    the model, the batch or the GPUs it is given."""


class EnvironmentProblem(AstralError):
    """The machine lacks something a run needs (root, Open vSwitch, mnexec, ...)."""

    exit_status = 3


class EmulationError(AstralError):
    """Bringing the emulated fabric up, checking it, or tearing it down failed."""

    exit_status = 4


class ConcurrentRunError(AstralError):
    """Another astral run holds the lock; two runs would fight over OVS and names."""

    exit_status = 5


class ResultsError(AstralError):
    """A results bundle cannot be read: no such directory, a missing or damaged database,
    or one written by an incompatible version. Names the bundle, what was expected and
    what was found."""

    exit_status = 6

    def __init__(self, bundle: str | Path, expected: str, found: object = None) -> None:
        self.bundle = str(bundle)
        self.expected = expected
        self.found = found
        found_text = "" if found is None else f", found {found}"
        super().__init__(f"results bundle {self.bundle}: expected {expected}{found_text}")


class WrongResultsError(AstralError):
    """A run completed, but data failed verification (nccl-tests' #wrong > 0) in the
    configurations named, each as a phrase (policy, collective, size, count). Like
    nccl-tests, which exits non-zero when a check fails, ``astral run`` then exits 7; the
    bundle is written and says the same."""

    exit_status = 7

    def __init__(self, configurations: list[str]) -> None:
        self.configurations = configurations
        n = len(configurations)
        super().__init__(
            f"{n} configuration{'s' if n != 1 else ''} delivered wrong data (#wrong > 0): "
            + "; ".join(configurations)
        )


class RemoteError(AstralError):
    """A machine of the inventory could not be reached, refused the connection (its host
    key, the user, the key), did not answer in time, or the connection to it was lost. The
    sentence names the machine and says what to do; a command that ran there and failed is
    not this error: its own exit status is passed on instead."""

    exit_status = 8
