"""The live view: what a run is doing right now, from the files it writes as it goes.

``astral top RUN_DIR`` (another terminal) and ``astral run --live`` draw it; both read only
files, so a run is watched without being touched:

    RUN_DIR/live.json           the ranks' progress (the launcher, at most every 0.2 s)
    RUN_DIR/telemetry.jsonl     the switches' counters (the controller, every poll)
    RUN_DIR/faults.jsonl        faults applied and undone (the fault scheduler)
    RUN_DIR/events.jsonl        the controller's events (controllers/events.py)
    RUN_DIR/fabric.json         the links and their emulated capacities

:class:`LiveSource` follows them (only what was appended since the last look, complete
lines only), :func:`snapshot` turns what it read into a :class:`LiveState`, and
:func:`render` into a `rich` renderable: the current operation and each rank's progress and
lag, the busiest links, the anomalous ones (drops, errors, utilization at or above
capacity), the active faults and the last alerts. :func:`watch` redraws it
:data:`REFRESH_S` apart with ``rich.live.Live``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.counters import PortRate, StatsRound, decode_round, port_rates
from orchestrator.collectives.sizes import format_size
from orchestrator.results.plots import LinkDirection, link_directions

LIVE_NAME = "live.json"
TELEMETRY_NAME = "telemetry.jsonl"
FAULTS_NAME = "faults.jsonl"
EVENTS_NAME = "events.jsonl"
FABRIC_NAME = "fabric.json"
REFRESH_S = 0.4  # redraws per second: 2.5 (the issue asks for at least 2)
BUSIEST = 6  # links listed by utilization
ALERTS = 8  # the last alerts shown
LAG_ALERT_S = 1.0  # a rank waiting this long on its step is an alert
STALE_S = 5.0  # live.json older than this: the launch has ended (or stalled)


class Follower:
    """Reads what was appended to a file since the last call, whole lines only; starts
    over when the file is replaced or shrinks (a rotation, a new run)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._inode: int | None = None
        self._partial = b""

    def lines(self) -> list[str]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        if stat.st_ino != self._inode or stat.st_size < self._offset:
            self._inode, self._offset, self._partial = stat.st_ino, 0, b""
        if stat.st_size == self._offset:
            return []
        with open(self.path, "rb") as src:
            src.seek(self._offset)
            data = src.read()
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete if line.strip()]


@dataclass
class LinkNow:
    """One link direction over the last poll interval."""

    label: str
    utilization: float
    rate_bps: float
    drops: int  # packets dropped on its port in the interval
    errors: int


@dataclass
class FaultNow:
    id: int
    kind: str
    target: str
    since: float
    detail: str = ""


@dataclass
class LiveState:
    """What :func:`render` draws."""

    run_dir: Path
    now: float
    progress: dict[str, Any] | None  # live.json
    links: list[LinkNow] = field(default_factory=list)
    faults: list[FaultNow] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)
    polled_at: float | None = None  # the last counter poll's time
    problem: str | None = None  # what is wrong with a live.json that is not the launcher's

    @property
    def stale(self) -> bool:
        return self.progress is None or self.now - float(self.progress.get("t", 0)) > STALE_S


class LiveSource:
    """Follows a run directory's files (module docstring); :meth:`read` takes in what is new."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.telemetry = Follower(self.run_dir / TELEMETRY_NAME)
        self.faults = Follower(self.run_dir / FAULTS_NAME)
        self.events = Follower(self.run_dir / EVENTS_NAME)
        self.directions: list[LinkDirection] = []
        self.rounds: deque[StatsRound] = deque(maxlen=2)
        self.active: dict[int, FaultNow] = {}
        self.alerts: deque[tuple[float, str]] = deque(maxlen=ALERTS)
        self._alerted: set[str] = set()

    def _fabric(self) -> None:
        if self.directions:
            return
        try:
            fabric = json.loads((self.run_dir / FABRIC_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        self.directions = link_directions(fabric)

    def alert(self, t: float, text: str, key: str | None = None) -> None:
        """Add an alert once per ``key`` (default: its text) while it lasts."""
        key = key or text
        if key not in self._alerted:
            self._alerted.add(key)
            self.alerts.append((t, text))

    def read(self) -> None:
        self._fabric()
        for line in self.telemetry.lines():
            try:
                record = json.loads(line)
                if record.get("type") == "stats":
                    self.rounds.append(decode_round(record))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        for record in _records(self.faults.lines()):
            self._fault(record)
        for record in _records(self.events.lines()):
            kind = record.get("event")
            if kind in ("disconnect", "port-down", "error", "reprogram"):
                self.alert(float(record["t"]), f"controller: {record.get('message', kind)}")

    def _fault(self, record: dict[str, Any]) -> None:
        try:
            fault_id, event = int(record["id"]), str(record["event"])
        except (KeyError, TypeError, ValueError):
            return
        t = float(record.get("t", time.time()))
        kind, target = str(record.get("kind", "?")), str(record.get("target") or "-")
        if event == "applied":
            self.active[fault_id] = FaultNow(
                fault_id, kind, target, t, str(record.get("detail", ""))
            )
            self.alert(t, f"fault {fault_id} {kind} on {target} applied", f"f{fault_id}a")
        elif event in ("undone", "failed"):
            self.active.pop(fault_id, None)
            text = f"fault {fault_id} {kind} on {target} {event}"
            if event == "failed" and record.get("detail"):
                text += f": {record['detail']}"
            self.alert(t, text, f"f{fault_id}{event}")

    def links(self) -> list[LinkNow]:
        """Every measured direction over the last two polls (empty before two), its rate
        from the switch's counters as the controller's policies get it (port_rates)."""
        if len(self.rounds) < 2:
            return []
        old, new = self.rounds[0], self.rounds[1]
        rates: dict[str, dict[int, PortRate]] = {}
        for name, sample in new.switches.items():
            if name in old.switches:
                rates[name] = port_rates(old.switches[name], sample)
        out = []
        for d in self.directions:
            rate = rates.get(d.switch, {}).get(d.port)
            if rate is None:
                continue
            bps = rate.tx_bps if d.counter == "tx" else rate.rx_bps
            drops = rate.rx_dropped + rate.tx_dropped
            errors = rate.rx_errors + rate.tx_errors
            out.append(LinkNow(d.label, bps / d.capacity, bps, drops, errors))
        return out


def _records(lines: list[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def _progress(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """live.json and, when it is not what the launcher writes, what is wrong with it (the
    view then draws no progress and says so). A file that is missing or half-written (the
    launcher replaces it while it is read) is no progress yet, not a problem."""
    path = run_dir / LIVE_NAME
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    problem = progress_problem(document)
    if problem is not None:
        return None, f"{path}: {problem}"
    return document, None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def progress_problem(document: object) -> str | None:
    """What keeps ``document`` from being a live.json the view can draw (the launcher's
    shape: orchestrator/testbed/testbed.py), None when nothing does; checks what the view reads."""

    def wrong(key: str, expected: str, found: object) -> str:
        return f"key '{key}': expected {expected}, found {found!r}"

    if not isinstance(document, dict):
        return f"expected a JSON object, found {type(document).__name__}"
    if "t" in document and not _is_number(document["t"]):
        return wrong("t", "a time (seconds)", document["t"])
    operation = document.get("operation")
    if operation is not None:
        if not isinstance(operation, dict):
            return wrong("operation", "an object", operation)
        for key in ("size", "count", "first"):
            value = operation.get(key)
            if value is not None and not _is_number(value):
                return wrong(f"operation.{key}", "a number", value)
    ranks = document.get("ranks", {})
    if not isinstance(ranks, dict):
        return wrong("ranks", "an object of ranks", ranks)
    for rank, state in ranks.items():
        if not rank.isdigit():
            return wrong("ranks", "rank numbers as keys", rank)
        if not isinstance(state, dict):
            return wrong(f"ranks.{rank}", "an object", state)
        for key in ("done", "elapsed"):
            if key in state and not _is_number(state[key]):
                return wrong(f"ranks.{rank}.{key}", "a number", state[key])
        if "step" in state and state["step"] is not None and not _is_number(state["step"]):
            return wrong(f"ranks.{rank}.step", "a step number or null", state["step"])
        if not isinstance(state.get("waiting_on", []), list):
            return wrong(f"ranks.{rank}.waiting_on", "a list of ranks", state["waiting_on"])
    return None


def snapshot(source: LiveSource, now: float | None = None) -> LiveState:
    """Read what is new and put the state together, alerts included."""
    now = time.time() if now is None else now
    source.read()
    progress, problem = _progress(source.run_dir)
    links = source.links()
    polled = source.rounds[-1].t if source.rounds else None
    for link in links:
        if link.drops or link.errors:
            source.alert(
                polled or now,
                f"{link.label}: {link.drops} drops, {link.errors} errors in the last poll",
                f"drop {link.label} {polled}",
            )
        if link.utilization >= 1.0:
            source.alert(
                polled or now,
                f"{link.label} at {link.utilization:.0%} of its capacity",
                f"full {link.label} {polled}",
            )
    if progress is not None and now - float(progress.get("t", 0)) <= STALE_S:
        for rank, state in sorted(progress.get("ranks", {}).items(), key=lambda kv: int(kv[0])):
            if (
                state.get("busy")
                and state.get("waiting_on")
                and state.get("elapsed", 0) > LAG_ALERT_S
            ):
                source.alert(
                    now,
                    f"rank {rank} ({state.get('host')}) waits {state['elapsed']:.1f} s on "
                    f"{', '.join(map(str, state['waiting_on']))} in step {state.get('step')}",
                    f"lag {rank} {state.get('iteration')} {state.get('step')}",
                )
    return LiveState(
        run_dir=source.run_dir,
        now=now,
        progress=progress,
        links=links,
        faults=sorted(source.active.values(), key=lambda f: f.id),
        alerts=[text for _, text in source.alerts],
        polled_at=polled,
        problem=problem,
    )


def rank_lag(progress: dict[str, Any]) -> dict[str, int]:
    """Per rank, how many operations of the batch it is behind the furthest rank."""
    ranks = progress.get("ranks", {})
    furthest = max((int(r.get("done", 0)) for r in ranks.values()), default=0)
    return {rank: furthest - int(r.get("done", 0)) for rank, r in ranks.items()}


def render(state: LiveState) -> Any:
    """The view as a rich renderable (a group of tables)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    title = Text(f"astral top  {state.run_dir}  ", style="bold")
    title.append(time.strftime("%H:%M:%S", time.localtime(state.now)))
    parts.append(title)
    progress = state.progress
    if state.problem is not None:
        parts.append(Text(f"{state.problem} (not drawn; waiting for a valid one)", style="red"))
    elif progress is None:
        parts.append(Text("no launch yet (waiting for live.json)", style="dim"))
    else:
        op = progress.get("operation") or {}
        if op:
            kind = "warm-up" if op.get("warmup") else "timed"
            line = (
                f"operation: {op.get('collective')} ({op.get('algorithm')}) "
                f"{format_size(int(op.get('size', 0)))}, {kind} batch of {op.get('count')} "
                f"from iteration {op.get('first')}"
            )
        else:
            line = "operation: none yet (connecting)"
        if state.stale:
            line += f"   [last update {state.now - float(progress.get('t', 0)):.0f} s ago]"
        parts.append(Text(line))
        lags = rank_lag(progress)
        ranks = Table(title="ranks", title_justify="left", expand=False, pad_edge=False)
        for column in ("rank", "host", "done", "lag", "step", "phase", "in step", "waiting on"):
            ranks.add_column(
                column, justify="right" if column in ("rank", "done", "lag") else "left"
            )
        total = int(op.get("count", 0) or 0)
        for rank, r in sorted(progress.get("ranks", {}).items(), key=lambda kv: int(kv[0])):
            lag = lags.get(rank, 0)
            ranks.add_row(
                rank,
                str(r.get("host", "")),
                f"{r.get('done', 0)}/{total}",
                str(lag),
                "-" if r.get("step") in (None, -1) else str(r.get("step")),
                str(r.get("phase") or ("idle" if not r.get("busy") else "")),
                f"{float(r.get('elapsed', 0.0)):.2f} s",
                ", ".join(map(str, r.get("waiting_on", []))) or "-",
                style="red" if r.get("failed") else ("yellow" if lag else None),
            )
        parts.append(ranks)
    links = Table(title="busiest links", title_justify="left", pad_edge=False)
    for column in ("link", "utilization", "Mbit/s", "drops", "errors"):
        links.add_column(column, justify="left" if column == "link" else "right")
    for link in sorted(state.links, key=lambda x: -x.utilization)[:BUSIEST]:
        links.add_row(
            link.label,
            f"{link.utilization:.0%}",
            f"{link.rate_bps / 1e6:.2f}",
            str(link.drops),
            str(link.errors),
            style="red" if link.utilization >= 1.0 else None,
        )
    if not state.links:
        links.add_row("(waiting for two counter polls)", "", "", "", "")
    parts.append(links)
    anomalous = [x for x in state.links if x.drops or x.errors or x.utilization >= 1.0]
    text = Text("anomalous links: ", style="bold")
    text.append(
        ", ".join(
            f"{x.label} ({x.utilization:.0%}, {x.drops} drops, {x.errors} errors)"
            for x in anomalous
        )
        or "none"
    )
    parts.append(text)
    faults = Text("active faults: ", style="bold")
    faults.append(
        ", ".join(
            f"#{f.id} {f.kind} on {f.target} for {state.now - f.since:.1f} s" for f in state.faults
        )
        or "none",
        style="red" if state.faults else None,
    )
    parts.append(faults)
    parts.append(Text("last alerts:", style="bold"))
    for alert in state.alerts or ["none"]:
        parts.append(Text(f"  {alert}"))
    return Group(*parts)


def watch(
    run_dir: str | Path,
    *,
    until: Callable[[], bool] | None = None,
    refresh: float = REFRESH_S,
    console: Any = None,
) -> None:
    """Redraw the view of ``run_dir`` every ``refresh`` seconds until ``until()`` says so
    (or Ctrl-C)."""
    from rich.live import Live

    source = LiveSource(run_dir)
    with Live(render(snapshot(source)), console=console, auto_refresh=False) as live:
        while until is None or not until():
            time.sleep(refresh)
            live.update(render(snapshot(source)), refresh=True)


class Updater:
    """Redraws a ``rich.live.Live`` from a thread while the caller's thread runs (``astral
    run --live``: the run keeps the main thread, its signal handlers and its prints, which
    Live shows above the view). ``run_dir()`` says where to look, None until the fabric
    is up."""

    def __init__(
        self, live: Any, run_dir: Callable[[], Path | None], refresh: float = REFRESH_S
    ) -> None:
        self.live = live
        self.run_dir = run_dir
        self.refresh = refresh
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="live-view", daemon=True)

    def __enter__(self) -> Updater:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        from rich.text import Text

        source: LiveSource | None = None
        while not self._stop.wait(self.refresh):
            directory = self.run_dir()
            if directory is None:
                self.live.update(Text("bringing the fabric up ...", style="dim"), refresh=True)
                continue
            if source is None or source.run_dir != directory:
                source = LiveSource(directory)
            self.live.update(render(snapshot(source)), refresh=True)


def newest_run_dir(base: Path) -> Path | None:
    """The most recently changed run directory under ``base`` that has a live file."""
    candidates = [p.parent for p in base.glob(f"*/{LIVE_NAME}")]
    return max(candidates, key=lambda p: os.stat(p / LIVE_NAME).st_mtime, default=None)
