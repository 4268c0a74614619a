"""Scaled latency on a real emulated astral-small: the workers wait what the fabric says.

A 2-rank ring all-reduce is a ping-pong (two steps, a message each way in each, the second
only after the first arrived): through the real workers on the real fabric, one operation
must take at least the configured latency, the operation's plus two one-way latencies of
the pair's path, divided by the scale. That it takes about that much, not more, is a
measurement (benchmarks/latency.py, docs/latency.md), not a test: the machine is shared.

Needs root and Open vSwitch (tests/conftest.py skips or, under CI, fails without them).
"""

from __future__ import annotations

import pytest

from orchestrator.pytest_plugin import FabricFactory, FabricHandle
from topologies.latency import pair_latencies

pytestmark = pytest.mark.integration

# one pair per kind of path on astral-small: one server, one dual-ToR pair, two pods
PAIRS = [("p0s0g0", "p0s0g1", "NVLink"), ("p0s0g0", "p0s1g0", "1 switch"),
         ("p0s0g0", "p1s1g0", "5 switches")]  # fmt: skip


@pytest.fixture(scope="module")
def fabric(astral_fabric: FabricFactory) -> FabricHandle:
    return astral_fabric("astral-small", policy="shortest", telemetry_interval=None)


@pytest.mark.parametrize(("src", "dst", "path"), PAIRS)
def test_a_ping_pong_takes_at_least_the_configured_round_trip(
    fabric: FabricHandle, src: str, dst: str, path: str
) -> None:
    spec = fabric.testbed.description.fabric.spec
    assert spec.latency.enabled  # the preset keeps the published defaults
    one_way = pair_latencies(fabric.testbed.description.fabric)[(src, dst)]
    assert one_way.label == path
    configured_us = (spec.latency.operation + 2 * one_way.seconds) / spec.emulation.scale * 1e6
    # not recorded: the bundle keeps one configuration per (collective, size, ranks), and
    # each pair here is the same configuration on other GPUs
    run = fabric.run(
        "all-reduce", "ring", sizes=[1024], gpus=[src, dst], iterations=2, record=False
    )
    run.raise_for_failure()
    assert run.wrong == 0
    for iteration in run.result.tests[0].timed():
        for rank, timing in iteration.ranks.items():
            assert timing.time_us >= configured_us, (rank, timing.time_us, configured_us)
    assert f"{path} {one_way.seconds * 1e6:.1f}us" in run.table_text  # the table's header
