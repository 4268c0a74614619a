"""The controller's events and log lines as JSON Lines: what the monitor's network layer reads.

The controller logs what it does (switches connecting, ports going down, plans re-rendered)
for people; the same records, with the event's kind and its switch and port where the log
call names them (``LOG.info(..., extra=event("connect", switch))``), are appended to an
events file one JSON object a line, so that a run's bundle can line them up with the other
layers on the one clock (``t``: the log record's creation time, Unix epoch seconds)::

    {"t": 1795974249.45, "level": "INFO", "logger": "controllers.app",
     "event": "port-down", "switch": "p0r0t0", "port": 3, "message": "p0r0t0 port 3 down"}

``event`` is null for a plain log line. Kinds: connect, disconnect, port-up, port-down,
reprogram, programmed, error. The file is ``events.jsonl`` next to the status file unless
``--events`` says otherwise; a restarted controller appends to it. Pure logging, no os-ken.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, TextIO

EVENTS_NAME = "events.jsonl"
KINDS = ("connect", "disconnect", "port-up", "port-down", "reprogram", "programmed", "error")


def event(kind: str, switch: str | None = None, port: int | None = None) -> dict[str, Any]:
    """The ``extra`` of a log call that is also an event."""
    return {"astral_event": kind, "astral_switch": switch, "astral_port": port}


def record_document(record: logging.LogRecord) -> dict[str, Any]:
    """One log record as the events file's line (see the module docstring)."""
    return {
        "t": record.created,
        "level": record.levelname,
        "logger": record.name,
        "event": getattr(record, "astral_event", None),
        "switch": getattr(record, "astral_switch", None),
        "port": getattr(record, "astral_port", None),
        "message": record.getMessage(),
    }


class EventsHandler(logging.Handler):
    """Appends every record to ``path`` as one JSON line, flushed at once (a reader may
    follow the file while the controller runs; a last line without its newline is being
    written)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._write_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = json.dumps(record_document(record), default=str)
        except (TypeError, ValueError):
            self.handleError(record)
            return
        with self._write_lock:
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._write_lock:
            if self._file is not None:
                self._file.close()
                self._file = None
        super().close()


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The events file's records in order (lines that do not parse are skipped: the last
    one may be half written); empty if there is no file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("t"), (int, float)):
            records.append(record)
    return records
