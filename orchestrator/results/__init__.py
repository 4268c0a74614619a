"""The results of a run: a bundle directory around one SQLite database (``store``), the
nccl-tests figures computed from it (``summary``), its figures (``plots``) and the function
that renders all derived files again (``report``). See ``store`` for the bundle layout.

The runner needs only :class:`ResultsWriter` and the record types re-exported here.
"""

from orchestrator.results.store import (
    ConnectionSample,
    IterationRecord,
    Phase,
    PortCounter,
    ResultsBundle,
    ResultsWriter,
    Versions,
)

__all__ = [
    "ConnectionSample",
    "IterationRecord",
    "Phase",
    "PortCounter",
    "ResultsBundle",
    "ResultsWriter",
    "Versions",
]
