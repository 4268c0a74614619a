"""The nccl-tests result table: its metrics and the text it prints, in one place.

Workers, the results bundle and ``astral compare`` all print collectives the way
``all_reduce_perf`` does, so that people who read nccl-tests output every day read ours
without a legend. Definitions (nccl-tests doc/PERFORMANCE.md; docs/astral.md, "Metrics")::

    algbw = S / t                      S bytes per operation, t seconds per operation
    busbw = algbw * factor(op, n)      all-reduce 2(n-1)/n; all-gather, reduce-scatter and
                                       all-to-all (n-1)/n; broadcast and reduce 1

``t`` is the time of one operation: the timed iterations run back to back after one
barrier, all ranks starting at the same instant; a rank's time is its whole batch (until
its last byte has arrived at its peers and its last expected byte at itself) divided by the
iterations; then the mean across ranks (nccl-tests' default ``-a 1``).

Rates are measured on emulated links that run ``scale`` times the real speed
(``emulation.scale`` of the fabric, e.g. 1e-4: 200G -> 20 Mbit/s). The table prints the
emulated values in the usual columns (GB/s, with enough decimals to be readable at
megabit rates) and two extra, labelled columns scaled back to real link speeds
(``emulated / scale``), comparable to what nccl-tests reports on the real fabric::

    # real-speed columns: emulated / 0.0001 (the fabric's emulation scale)
    #       size  ...  root        time       algbw       busbw  #wrong     algbw     busbw
    #        (B)  ...              (us)      (GB/s)      (GB/s)            (GB/s)    (GB/s)
         1048576  ...    -1    386317.5    0.002714    0.004750       0     27.14     47.50
    # Out of bounds values : 0 OK
    # Avg bus bandwidth at real speed : 47.50
    # Avg bus bandwidth    : 0.004750

(``...`` stands for the count, type and redop columns, as in nccl-tests.)

A size whose data was not checked (verification off) has no #wrong (``NcclRow.wrong`` is
None): its column says ``N/A``, as nccl-tests prints it with ``-c 0``, and the line below
the table says ``not verified`` instead of ``0 OK``, which would claim a check that never
ran.

A size that was not measured (no timed iteration: its time is nan, and the results summary
marks it ``NOT MEASURED``) prints ``-`` in its time and bandwidth columns, right-aligned like
the figures: ``nan`` there reads as a measurement that came out as not-a-number, and ``-`` is
what the run's summary prints for a figure it does not have.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.collectives.operations import operation

# How a size's time is measured and reduced over ranks, wherever astral prints numbers (the
# launcher's rows, the results summary, ``astral run``): as nccl-tests does, the timed
# iterations run back to back after one barrier, each rank's time is its batch (from the
# common start to its last byte delivered) / iterations, then the mean over ranks (``-a 1``).
TIME_DEFINITION = (
    "time: per rank, one back-to-back batch of the timed iterations from a common start to "
    "its last byte delivered, / iterations; mean over ranks (nccl-tests -a 1)"
)

# Element sizes of the nccl-tests type names (``-d``).
ELEMENT_SIZES = {
    "int8": 1,
    "uint8": 1,
    "half": 2,
    "bfloat16": 2,
    "float": 4,
    "int32": 4,
    "uint32": 4,
    "double": 8,
    "int64": 8,
    "uint64": 8,
}
DEFAULT_DTYPE = "float"


def buffer_bytes(op: str, size: int, dtype: str, ranks: int) -> int:
    """The size nccl-tests actually runs for a requested ``size``: whole elements, and whole
    elements per rank for the per-rank operations (its getCollByteCount)."""
    element = ELEMENT_SIZES[dtype]
    return operation(op).elements(size, element, ranks) * element


def count_column(op: str, size: int, dtype: str, ranks: int) -> int:
    """nccl-tests' "count (elements)": per rank where the buffer is per rank, else all."""
    described = operation(op)
    return described.table_count(described.elements(size, ELEMENT_SIZES[dtype], ranks), ranks)


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw factor for ``op`` over ``ranks`` ranks."""
    factor = operation(op).factor
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    return factor(ranks)


def algbw_gbps(size_bytes: float, time_us: float) -> float:
    """S / t in GB/s (10**9 bytes per second), nccl-tests' unit."""
    if time_us <= 0:
        return math.nan
    return size_bytes / (time_us * 1e-6) / 1e9


@dataclass(frozen=True)
class NcclRow:
    """One line of an nccl-tests table (one message size). Bandwidths in GB/s, emulated."""

    size: int
    count: int
    dtype: str
    redop: str
    root: int
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None  # elements that failed verification; None: not verified

    @classmethod
    def of(
        cls,
        op: str,
        *,
        size: int,
        count: int,
        dtype: str,
        ranks: int,
        time_us: float,
        wrong: int | None,
        root: int | None = None,
    ) -> NcclRow:
        """Compute algbw and busbw from the size and the time of one operation."""
        described = operation(op)
        algbw = algbw_gbps(size, time_us)
        return cls(
            size=size,
            count=count,
            dtype=dtype,
            redop=described.redop,
            root=(0 if root is None else root) if described.rooted else -1,
            time_us=time_us,
            algbw=algbw,
            busbw=algbw * bus_factor(op, ranks),
            wrong=wrong,
        )

    def real(self, scale: float) -> tuple[float, float]:
        """(algbw, busbw) scaled back to real link speeds: emulated / scale."""
        return self.algbw / scale, self.busbw / scale


def average_busbw(rows: Sequence[NcclRow]) -> float:
    """nccl-tests' "Avg bus bandwidth": the plain mean of the busbw column."""
    values = [row.busbw for row in rows if not math.isnan(row.busbw)]
    return sum(values) / len(values) if values else math.nan


_HEAD = (
    f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
    f"  {'time':>10}  {'algbw':>10}  {'busbw':>10}  {'#wrong':>6}"
)
_UNITS = (
    f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
    f"  {'(us)':>10}  {'(GB/s)':>10}  {'(GB/s)':>10}  {'':>6}"
)
_REAL_HEAD = f"  {'algbw':>8}  {'busbw':>8}"
_REAL_UNITS = f"  {'(GB/s)':>8}  {'(GB/s)':>8}"


def _number(value: float, spec: str) -> str:
    return format(value, spec) if not math.isnan(value) else "nan"


def format_wrong(wrong: int | None) -> str:
    """The #wrong column: the count, or ``N/A`` where nothing was verified (nccl-tests)."""
    return "N/A" if wrong is None else str(wrong)


def out_of_bounds(rows: Sequence[NcclRow]) -> str:
    """The verdict after ``# Out of bounds values :``: ``N OK`` or ``N FAILED`` over the
    verified rows, ``not verified`` when none was, and how many were not when some were."""
    checked = [row.wrong for row in rows if row.wrong is not None]
    if rows and not checked:
        return "not verified"
    wrong = sum(checked)
    verdict = f"{wrong} {'OK' if wrong == 0 else 'FAILED'}"
    unchecked = len(rows) - len(checked)
    return verdict + (f" ({unchecked} of {len(rows)} sizes not verified)" if unchecked else "")


#: What the time and bandwidth columns of a size that was not measured say.
NOT_MEASURED_CELL = "-"


def format_row(row: NcclRow, scale: float | None = None) -> str:
    """One line of the table; a row without a time (not measured) says ``-`` where its
    figures would be, so that nothing in it reads as a measurement."""
    measured = not math.isnan(row.time_us)

    def cell(value: float, spec: str) -> str:
        return _number(value, spec) if measured else NOT_MEASURED_CELL

    line = (
        f"{row.size:>12}  {row.count:>12}  {row.dtype:>8}  {row.redop:>6}  {row.root:>6}"
        f"  {cell(row.time_us, '10.1f'):>10}  {cell(row.algbw, '10.6f'):>10}"
        f"  {cell(row.busbw, '10.6f'):>10}  {format_wrong(row.wrong):>6}"
    )
    if scale is not None:
        algbw, busbw = row.real(scale)
        line += f"  {cell(algbw, '8.2f'):>8}  {cell(busbw, '8.2f'):>8}"
    return line


def format_table(
    rows: Iterable[NcclRow],
    *,
    title: Sequence[str] = (),
    scale: float | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The table as nccl-tests prints it, ending with ``# Avg bus bandwidth    : X``.

    ``title`` lines are printed first, each behind ``# ``. With ``scale`` (the fabric's
    emulation scale), two extra columns give algbw and busbw at real link speeds, and a line
    before the last one gives the average bus bandwidth at real speeds; the last line keeps
    nccl-tests' exact form (emulated GB/s), so tools that parse it still work. ``notes[i]``,
    where not empty, is printed after row i, two spaces apart (a flag on that cell).
    """
    rows = list(rows)
    lines = [f"# {text}" for text in title]
    head, units = _HEAD, _UNITS
    if scale is not None:
        lines.append(f"# real-speed columns: emulated / {scale:g} (the fabric's emulation scale)")
        emulated = len(_HEAD) - len(_HEAD.split("time")[0]) + 4
        group = f"#{'':>{len(_HEAD) - emulated - 1}}{'emulated':^{emulated}}"
        lines.append(f"{group}{'real speed':^{len(_REAL_HEAD)}}")
        head += _REAL_HEAD
        units += _REAL_UNITS
    lines += [head, units]
    notes = list(notes) + [""] * (len(rows) - len(notes))
    lines += [
        format_row(row, scale) + (f"  {note}" if note else "")
        for row, note in zip(rows, notes, strict=True)
    ]
    average = average_busbw(rows)
    lines.append(f"# Out of bounds values : {out_of_bounds(rows)}")
    if scale is not None:
        lines.append(f"# Avg bus bandwidth at real speed : {_number(average / scale, '.2f')}")
    lines.append(f"# Avg bus bandwidth    : {_number(average, '.6f')}")
    lines = [line.rstrip() for line in lines]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = (
    "size_B",
    "count",
    "type",
    "redop",
    "root",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
    "wrong",
    "algbw_real_GBps",
    "busbw_real_GBps",
)


def csv_record(row: NcclRow, scale: float) -> list[object]:
    """The row in :data:`CSV_COLUMNS` order (real-speed columns last); ``wrong`` empty
    where the data was not verified."""
    algbw, busbw = row.real(scale)
    return [
        row.size,
        row.count,
        row.dtype,
        row.redop,
        row.root,
        round(row.time_us, 3),
        row.algbw,
        row.busbw,
        "" if row.wrong is None else row.wrong,
        algbw,
        busbw,
    ]
