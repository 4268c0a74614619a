"""The nccl-tests table: metrics and format."""

from __future__ import annotations

import re

import pytest

from orchestrator.collectives.nccl import (
    NcclRow,
    average_busbw,
    buffer_bytes,
    bus_factor,
    count_column,
    csv_record,
    format_table,
)


@pytest.mark.parametrize(
    ("op", "factor"),
    [
        ("all-reduce", 2 * 7 / 8),
        ("all-gather", 7 / 8),
        ("reduce-scatter", 7 / 8),
        ("all-to-all", 7 / 8),
        ("broadcast", 1.0),
        ("reduce", 1.0),
    ],
)
def test_bus_factors_are_nccl_tests_ones(op: str, factor: float) -> None:
    assert bus_factor(op, 8) == pytest.approx(factor)


def test_unknown_operation_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown collective 'all-shuffle'"):
        bus_factor("all-shuffle", 8)


def test_row_computes_algbw_and_busbw_in_gb_per_s() -> None:
    # 1 MiB in 1000 us: algbw = 1048576 / 1e-3 / 1e9 = 1.048576 GB/s
    row = NcclRow.of(
        "all-reduce", size=1048576, count=262144, dtype="float", ranks=8, time_us=1000, wrong=0
    )
    assert row.algbw == pytest.approx(1.048576)
    assert row.busbw == pytest.approx(1.048576 * 1.75)
    assert (row.redop, row.root) == ("sum", -1)
    assert row.real(1e-4) == pytest.approx((10485.76, 18350.08))


def test_p2p_row_has_busbw_equal_to_algbw() -> None:
    # p2p is not an nccl-tests operation: no redop, no root, bus bandwidth = algbw
    row = NcclRow.of("p2p", size=4096, count=1024, dtype="uint32", ranks=2, time_us=10, wrong=0)
    assert (row.redop, row.root, row.busbw) == ("none", -1, row.algbw)


def test_counts_and_sizes_follow_nccl_tests() -> None:
    assert buffer_bytes("all-reduce", 1001, "float", 8) == 1000
    assert buffer_bytes("all-to-all", 1001, "float", 8) == 992
    assert count_column("all-reduce", 1024, "float", 8) == 256
    assert count_column("all-to-all", 1024, "float", 8) == 32
    assert count_column("all-gather", 1024, "half", 4) == 128


def test_table_ends_with_the_average_bus_bandwidth_and_labels_real_columns() -> None:
    rows = [
        NcclRow.of("all-to-all", size=s, count=s // 32, dtype="uint32", ranks=8, time_us=t, wrong=w)
        for s, t, w in ((65536, 20000.0, 0), (262144, 60000.0, 3))
    ]
    text = format_table(rows, title=["probe"], scale=1e-4)
    lines = text.splitlines()
    assert lines[0] == "# probe"
    assert "real speed" in lines[2] and "emulated" in lines[2]
    assert lines[-1] == f"# Avg bus bandwidth    : {average_busbw(rows):.6f}"
    assert lines[-2] == f"# Avg bus bandwidth at real speed : {average_busbw(rows) / 1e-4:.2f}"
    assert "# Out of bounds values : 3 FAILED" in lines
    first = lines[5].split()
    assert first[:5] == ["65536", "2048", "uint32", "none", "-1"]
    assert float(first[7]) == pytest.approx(65536 / 0.02 / 1e9 * 7 / 8, abs=1e-6)
    assert float(first[10]) == pytest.approx(65536 / 0.02 / 1e9 * 7 / 8 / 1e-4, abs=0.01)
    plain = format_table(rows).splitlines()
    assert len(plain[2].split()) == 9  # the nccl-tests columns only


def _rows(*wrongs: int | None) -> list[NcclRow]:
    return [
        NcclRow.of("all-reduce", size=4096 << i, count=1024 << i, dtype="uint32", ranks=4,
                   time_us=100.0 * (i + 1), wrong=w)
        for i, w in enumerate(wrongs)
    ]  # fmt: skip


def test_unverified_sizes_say_not_verified_never_ok() -> None:
    text = format_table(_rows(None, None), scale=1e-4)
    lines = text.splitlines()
    assert "# Out of bounds values : not verified" in lines
    assert "OK" not in text and "FAILED" not in text
    for line in lines[4:6]:
        assert line.split()[8] == "N/A"  # the #wrong column, as nccl-tests -c 0 prints it
    assert csv_record(_rows(None)[0], 1e-4)[8] == ""


def test_a_table_with_some_sizes_unverified_says_how_many() -> None:
    lines = format_table(_rows(0, None, 0)).splitlines()
    assert "# Out of bounds values : 0 OK (1 of 3 sizes not verified)" in lines
    lines = format_table(_rows(2, None)).splitlines()
    assert "# Out of bounds values : 2 FAILED (1 of 2 sizes not verified)" in lines
    assert "# Out of bounds values : 0 OK" in format_table(_rows(0, 0)).splitlines()
    assert "# Out of bounds values : 0 OK" in format_table([]).splitlines()


def test_a_size_that_was_not_measured_prints_a_dash_for_its_figures_not_nan() -> None:
    """A configuration without a timed iteration (summary.json's ``not_measured``, the
    table's ``NOT MEASURED``) has nan for its time and bandwidths; its columns say ``-``,
    aligned like the figures, and a measured row beside it keeps its exact text."""
    measured = _rows(0)[0]
    unmeasured = NcclRow.of(
        "all-reduce", size=8192, count=2048, dtype="uint32", ranks=4, time_us=float("nan"),
        wrong=None,
    )  # fmt: skip
    for scale in (None, 1e-4):
        alone = format_table([measured], scale=scale).splitlines()
        text = format_table([measured, unmeasured], scale=scale, notes=["", "NOT MEASURED"])
        first, row = [line for line in text.splitlines() if not line.startswith("#")]
        assert first in alone  # the measured row, byte for byte
        assert "nan" not in row and row.endswith("  NOT MEASURED")
        columns = [5, 6, 7] + ([9, 10] if scale else [])
        assert [row.split()[i] for i in columns] == ["-"] * len(columns)
        assert row.split()[8] == "N/A"
        for end in _token_ends(first, columns):  # right-aligned like the figures above
            assert row[end - 2 : end] == " -"


def _token_ends(line: str, which: list[int]) -> list[int]:
    """Where the ``which``-th whitespace-separated fields of ``line`` end."""
    ends = [match.end() for match in re.finditer(r"\S+", line)]
    return [ends[i] for i in which]
