"""A configuration's busbw ceiling: what it is made of, and how tables flag cells against it."""

from __future__ import annotations

import math

import pytest

from orchestrator.collectives.ceilings import (
    BUCKET_FLAG_SHARE,
    Ceiling,
    configuration_ceiling,
    fabric_share,
)
from orchestrator.collectives.nccl import NcclRow, format_table
from orchestrator.worker.spec import loopback_workers
from topologies.units import TCP_PAYLOAD_SHARE


def test_ceiling_is_rail_times_payload_share_over_fabric_share() -> None:
    workers = loopback_workers(8, 2)  # 4 servers of 2 GPUs
    for op, alg in [("all-reduce", "ring"), ("all-reduce", "hierarchical"), ("all-to-all", "pxn")]:
        ceiling = configuration_ceiling(workers, op, alg, 3e6, burst_s=0.01)
        share = fabric_share(workers, op, alg)
        assert ceiling.rail == pytest.approx(3e-3)
        assert ceiling.busbw == pytest.approx(3e-3 * TCP_PAYLOAD_SHARE / share)
        assert ceiling.share(ceiling.busbw) == pytest.approx(1.0)
    # hierarchical all-reduce on 4 servers of 2: NVLink carries part, the ceiling is higher
    ring = configuration_ceiling(workers, "all-reduce", "ring", 3e6)
    tree = configuration_ceiling(workers, "all-reduce", "hierarchical", 3e6)
    assert tree.busbw == pytest.approx(ring.busbw / (3 / 7))


def test_nothing_on_the_fabric_has_no_ceiling() -> None:
    ceiling = Ceiling(rail=1.0, fabric_share=0.0)
    assert math.isinf(ceiling.busbw)
    assert math.isnan(ceiling.share(1.0))
    assert ceiling.marks(1e9, 10.0) == []
    assert "none" in ceiling.describe(1e-4)
    assert ceiling.to_dict()["busbw"] is None


def test_cells_above_the_ceiling_or_short_enough_for_the_buckets_are_marked() -> None:
    ceiling = Ceiling(rail=0.003, fabric_share=1.0, burst_s=0.01)
    top = ceiling.busbw
    assert ceiling.marks(top * 0.99, 10.0) == []
    assert ceiling.marks(top * 1.02, 10.0) == ["ABOVE CEILING x1.020"]
    # a 0.5 s batch: a full 10 ms bucket is 2 % of it
    assert ceiling.bucket_share(0.5) == pytest.approx(0.02)
    assert ceiling.marks(top * 0.5, 0.5) == ["bucket <= 2%"]
    long_enough = ceiling.burst_s / BUCKET_FLAG_SHARE
    assert ceiling.marks(top * 0.5, long_enough * 1.01) == []
    line = ceiling.describe(1e-4)
    assert "busbw ceiling 0.002893 GB/s emulated (28.93 real)" in line
    assert "fabric share 1.000" in line


def test_table_prints_notes_beside_their_rows() -> None:
    rows = [
        NcclRow.of(
            "all-reduce", size=s, count=s // 4, dtype="uint32", ranks=8, time_us=1e5, wrong=0
        )
        for s in (65536, 262144)
    ]
    text = format_table(rows, scale=1e-4, notes=["", "ABOVE CEILING x1.100"])
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert not lines[0].endswith("x1.100")
    assert lines[1].endswith("  ABOVE CEILING x1.100")
