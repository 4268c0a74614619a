"""What a launch returns: per-operation timings and traffic, throughput samples, failures.

Plain data, apart from :class:`~orchestrator.worker.launcher.Launcher` that fills it in, so
that the runner, the pytest plugin and the tests read a run without the process machinery.
A :class:`RunResult` holds what completed; when workers failed, its :class:`Failure` names
the ranks to blame first (:class:`Problem`, one per rank, of the kinds below).

Timing follows nccl-tests' default (``-a 1``), as everywhere astral prints numbers
(orchestrator.collectives.nccl.TIME_DEFINITION): an iteration's time is the mean over ranks, a
size's time the mean of that over timed iterations (= the mean over ranks of each rank's
mean when every rank reports every iteration, as orchestrator.results.summary computes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean

from orchestrator.collectives.nccl import NcclRow, format_table
from orchestrator.collectives.operations import operation
from orchestrator.collectives.plans import ELEMENT_BYTES, ELEMENT_TYPE
from orchestrator.worker.spec import CollectiveTest
from orchestrator.worker.transport import TcpView
from topologies.errors import EmulationError
from topologies.fivetuple import FiveTuple

# What went wrong with a rank (Problem.kind).
EXITED = "exited"  # the process ended, or closed its control connection
UNRESPONSIVE = "unresponsive"  # no heartbeat for heartbeat_timeout
HUNG = "hung"  # a step outlived step_deadline while waiting for nobody
STALLED = "stalled"  # a step outlived step_deadline while every late rank waited for another
ERROR = "error"  # the worker reported an error (a connection reset, a protocol error)
TIMEOUT = "timeout"  # a set-up message did not arrive in time
# Whom the launcher blames first when several ranks have problems: a rank that exited
# explains its peers' closed connections, a silent one their waiting, and so on.
BLAME_ORDER = (EXITED, UNRESPONSIVE, HUNG, STALLED, ERROR)


@dataclass(frozen=True)
class ConnectionInfo:
    """One connection: data flows src -> dst on ``channel`` over ``link``. ``rto_min_us``:
    the minimum RTO its sender's kernel granted, None if none (the 200 ms floor holds;
    orchestrator.worker.rto)."""

    src: int
    dst: int
    channel: int
    link: str
    five_tuple: FiveTuple
    rto_min_us: int | None = None


@dataclass(frozen=True)
class ThroughputSample:
    """Bytes ``connection`` carried in (that side's previous sample's t, t], epoch seconds,
    as the ``rank`` end's kernel counts them (acknowledged if it sends, else received)."""

    rank: int
    connection: ConnectionInfo
    t: float
    bytes: int


@dataclass(frozen=True)
class TcpInfoRecord:
    """The sender kernel's TCP_INFO of ``connection`` at ``t`` (epoch s), as its ``rank``
    reported it."""

    rank: int
    connection: ConnectionInfo
    t: float
    view: TcpView


@dataclass(frozen=True)
class PhaseRecord:
    phase: str
    step: int
    start: float  # epoch seconds
    end: float


@dataclass(frozen=True)
class RankIteration:
    """One operation as one rank saw it."""

    rank: int
    start: float  # epoch seconds
    time_us: float
    wrong: int  # -1: not checked
    sent: int  # bytes this rank sent in the operation
    received: int
    phases: tuple[PhaseRecord, ...]
    traffic: tuple[tuple[ConnectionInfo, int, int], ...]  # (connection, sent, received)


def phase_spans(phases: Sequence[PhaseRecord]) -> list[PhaseRecord]:
    """Consecutive steps of the same phase merged into one span (step: the first one's)."""
    spans: list[PhaseRecord] = []
    for p in phases:
        if spans and spans[-1].phase == p.phase:
            last = spans[-1]
            spans[-1] = PhaseRecord(last.phase, last.step, last.start, p.end)
        else:
            spans.append(p)
    return spans


@dataclass
class IterationResult:
    iteration: int
    warmup: bool
    ranks: dict[int, RankIteration] = field(default_factory=dict)

    @property
    def time_us(self) -> float:
        """The mean over ranks (nccl-tests ``-a 1``)."""
        return fmean(r.time_us for r in self.ranks.values())

    @property
    def wrong(self) -> int | None:
        """Wrong elements summed over ranks; None if any rank did not verify."""
        if any(r.wrong < 0 for r in self.ranks.values()):
            return None
        return sum(r.wrong for r in self.ranks.values())


@dataclass
class CollectiveResult:
    test: CollectiveTest
    ranks: int
    count: int  # elements of the full buffer
    expected_sent: dict[int, int]  # rank -> bytes its plan sends per operation
    iterations: list[IterationResult] = field(default_factory=list)

    @property
    def size(self) -> int:
        """The size the operation really moves (nccl-tests' size column)."""
        return self.count * ELEMENT_BYTES

    def timed(self) -> list[IterationResult]:
        return [i for i in self.iterations if not i.warmup]

    @property
    def time_us(self) -> float:
        timed = self.timed()
        return fmean(i.time_us for i in timed) if timed else float("nan")

    @property
    def wrong(self) -> int | None:
        """Wrong elements summed over ranks, in the worst iteration (warm-up included);
        None if an iteration was not verified."""
        counts = [i.wrong for i in self.iterations]
        if any(count is None for count in counts):
            return None
        return max((count for count in counts if count is not None), default=0)

    def row(self) -> NcclRow:
        """The nccl-tests row (not for a program, which is no nccl-tests operation: read
        its ``time_us``, ``wrong`` and iterations)."""
        if self.test.program is not None:
            raise ValueError(f"{self.test.label} has no nccl-tests row")
        collective, n = self.test.collective, self.ranks
        return NcclRow.of(
            collective,
            size=self.size,
            count=operation(collective).table_count(self.count, n),
            dtype=ELEMENT_TYPE,
            ranks=n,
            time_us=self.time_us,
            wrong=self.wrong,
        )


@dataclass(frozen=True)
class Problem:
    """What went wrong with one rank. ``kind``: one of the kinds above (EXITED, ...)."""

    rank: int
    host: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"rank {self.rank} ({self.host}) {self.detail}"


@dataclass(frozen=True)
class Failure:
    """Why a run ended early: the ranks to blame first, then what the others reported."""

    stage: str
    culprits: tuple[Problem, ...]
    others: tuple[Problem, ...] = ()

    @property
    def ranks(self) -> list[int]:
        return sorted({p.rank for p in self.culprits})

    @property
    def kind(self) -> str:
        return self.culprits[0].kind if self.culprits else "unknown"

    def __str__(self) -> str:
        text = f"workers failed during {self.stage}: " + "; ".join(map(str, self.culprits))
        if self.others:
            text += " (also: " + "; ".join(map(str, self.others[:4]))
            text += f"; {len(self.others) - 4} more)" if len(self.others) > 4 else ")"
        return text


@dataclass
class RunResult:
    tests: list[CollectiveResult] = field(default_factory=list)
    connections: list[ConnectionInfo] = field(default_factory=list)
    samples: list[ThroughputSample] = field(default_factory=list)
    tcp_info: list[TcpInfoRecord] = field(default_factory=list)
    failure: Failure | None = None

    def rows(self) -> list[NcclRow]:
        """The nccl-tests rows of the collectives (programs have none)."""
        return [t.row() for t in self.tests if t.timed() and t.test.program is None]

    def table(self, title: Sequence[str] = ()) -> str:
        return format_table(self.rows(), title=title)

    def raise_for_failure(self) -> None:
        if self.failure is not None:
            raise EmulationError(str(self.failure))
