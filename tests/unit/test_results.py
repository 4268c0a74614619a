"""The results bundle: write one from synthetic but realistic measurements, read it back,
render it through the real CLI (``astral report``, ``astral compare``) and check the numbers
against values worked out by hand from the inputs.

The synthetic run: astral-small (8 GPUs, scale 1e-4), policies ecmp and path-pinned,
all-reduce (ring) and all-to-all (direct) at 64K, 256K and 1M, 3 timed iterations and 1
warm-up. Rank r's time in timed iteration i is ``ideal * (1 + 0.01 r + 0.02 i)`` where
``ideal = size * busbw_factor / (4.75 MB/s * efficiency)``, efficiency 0.65 for ecmp and 0.88
for path-pinned. So the nccl-tests time (mean over ranks of each rank's mean) is
``ideal * (1 + 0.01 * 3.5 + 0.02 * 1) = ideal * 1.055`` and busbw is
``4.75e6 * efficiency / 1.055`` bytes/s whatever the size.
"""

from __future__ import annotations

import csv
import json
import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.collectives.nccl import TIME_DEFINITION, bus_factor, count_column
from orchestrator.results import (
    ConnectionSample,
    IterationRecord,
    Phase,
    PortCounter,
    ResultsBundle,
    ResultsWriter,
    Versions,
)
from orchestrator.results.plots import link_utilization, nic_ceiling_real_gbps
from orchestrator.results.report import render_bundle
from orchestrator.results.store import (
    DATABASE,
    FABRIC,
    SCHEMA_VERSION,
    ControllerRestart,
    QueueCounter,
)
from orchestrator.results.summary import OLD_TIME_DEFINITION, operation_time_us
from tests.helpers import preset_description
from topologies.description import FabricDescription
from topologies.errors import ResultsError
from topologies.fivetuple import FiveTuple

T0 = 1_750_000_000.0
RANKS = 8
CEILING = 4.75e6  # bytes/s: 2 ports x 20 Mbit/s x 0.95 / 8
EFFICIENCY = {"ecmp": 0.65, "path-pinned": 0.88}
COLLECTIVES = (("all-reduce", "ring"), ("all-to-all", "direct"))
SIZES = (65536, 262144, 1048576)
ITERATIONS, WARMUP = 3, 1
SAMPLE_PERIOD = 0.01
COUNTER_PERIOD = 0.5
WRONG = ("ecmp", "all-to-all", 262144)  # rank 3 finds 5 wrong elements in iteration 1
DESCRIPTION = preset_description("astral-small")
IPS = {a.rank: a.fabric_ip for a in DESCRIPTION.addresses.values()}


def ideal_us(policy: str, op: str, size: int) -> float:
    return size * bus_factor(op, RANKS) / (CEILING * EFFICIENCY[policy]) * 1e6


def rank_time_us(policy: str, op: str, size: int, rank: int, iteration: int) -> float:
    return ideal_us(policy, op, size) * (1 + 0.01 * rank + 0.02 * iteration)


def peers(op: str, rank: int) -> list[int]:
    """Connections a rank opens: the ring's next rank twice (two channels, one per NIC port,
    as one TCP connection stays on one path), or every other rank once for all-to-all."""
    if op == "all-reduce":
        return [(rank + 1) % RANKS] * 2
    return [peer for peer in range(RANKS) if peer != rank]


def one_operation(
    policy: str, op: str, size: int, iteration: int, warmup: bool, now: float
) -> tuple[list[IterationRecord], list[ConnectionSample], list[Phase], float]:
    """All ranks' records of one iteration starting at ``now``; returns its end too."""
    records, samples, phases = [], [], []
    times = [
        2 * ideal_us(policy, op, size) if warmup else rank_time_us(policy, op, size, r, iteration)
        for r in range(RANKS)
    ]
    sent = int(size * bus_factor(op, RANKS))
    for rank, time_us in enumerate(times):
        wrong = (policy, op, size) == WRONG and (rank, iteration, warmup) == (3, 1, False)
        records.append(IterationRecord(iteration, rank, time_us, sent, 5 * wrong, warmup))
        end = now + time_us / 1e6
        if op == "all-reduce":
            middle = (now + end) / 2
            phases.append(Phase(iteration, rank, "reduce-scatter", now, middle))
            phases.append(Phase(iteration, rank, "all-gather", middle, end))
        else:
            phases.append(Phase(iteration, rank, "exchange", now, end))
        for channel, peer in enumerate(peers(op, rank)):
            five = FiveTuple(IPS[rank], 40000 + 10 * rank + channel, IPS[peer], 5000)
            per_sample = sent / len(peers(op, rank)) * SAMPLE_PERIOD / (time_us / 1e6)
            # under ecmp every third connection collides with another and runs slower
            share = 0.6 if policy == "ecmp" and (rank + channel) % 3 == 0 else 1.1
            t = now
            while t < end:
                t = min(t + SAMPLE_PERIOD, end)
                samples.append(ConnectionSample(rank, five, t, int(per_sample * share)))
    return records, samples, phases, now + max(times) / 1e6


# how the synthetic run's hosts picked NIC ports, per policy (the two settings)
HOST_PORTS = {"ecmp": "hash", "path-pinned": "balanced"}


def write_synthetic_bundle(path: Path, policies: tuple[str, ...] = ("ecmp", "path-pinned")) -> Path:
    """A bundle shaped like what the runner will write, with known numbers."""
    versions = Versions(python="3.11.2", mininet="2.3.0.dev6", os_ken="4.2.2", ovs="3.1.0")
    spans: list[tuple[float, float, str]] = []  # (start, end, policy) of each configuration
    now = T0 + 1.0
    with ResultsWriter(path, DESCRIPTION, experiment_text="name: synthetic\n") as results:
        results.add_run(
            experiment="synthetic", host="testhost", versions=versions, seed=1, started=T0
        )
        for policy in policies:
            for op, algorithm in COLLECTIVES:
                for size in SIZES:
                    config = results.add_configuration(
                        policy=policy,
                        collective=op,
                        algorithm=algorithm,
                        size=size,
                        count=count_column(op, size, "uint32", RANKS),
                        dtype="uint32",
                        ranks=RANKS,
                        iterations=ITERATIONS,
                        warmup=WARMUP,
                        host_ports=HOST_PORTS[policy],
                    )
                    start = now
                    runs = [(i, True) for i in range(WARMUP)]
                    runs += [(i, False) for i in range(ITERATIONS)]
                    for iteration, warmup in runs:
                        records, samples, phases, now = one_operation(
                            policy, op, size, iteration, warmup, now
                        )
                        results.add_iterations(config, records)
                        results.add_samples(config, samples)
                        results.add_timelines(config, phases)
                    spans.append((start, now, policy))
                    now += 0.3  # set-up between configurations
        results.add_port_counters(port_counters(DESCRIPTION, spans, now + 1.0))
        results.finish(finished=now + 1.0)
    return path


def utilization(kind: str, index: int, policy: str | None) -> float:
    """Synthetic load: idle between configurations; ecmp polarizes the ToR uplinks."""
    if policy is None:
        return 0.02
    if kind == "nic":
        return 0.6 if policy == "ecmp" else 0.85
    if kind == "tor_agg":
        return (0.95 if index % 2 else 0.3) if policy == "ecmp" else 0.6
    if kind == "agg_core":
        return (0.5 if index % 3 else 0.1) if policy == "ecmp" else 0.4
    return 0.05


def port_counters(
    description: FabricDescription, spans: list[tuple[float, float, str]], stop: float
) -> list[PortCounter]:
    switches = set(description.fabric.switches)
    totals: dict[tuple[str, int], list[float]] = {}
    ports: list[tuple[str, int, str, int, float]] = []  # switch, port, kind, index, capacity
    for index, link in enumerate(description.fabric.links):
        capacity = description.emulated_rate(link)
        for node, port in ((link.a, link.a_port), (link.b, link.b_port)):
            if node in switches:
                ports.append((node, port, link.kind.value, index, capacity))
                totals[(node, port)] = [0.0, 0.0]
    counters = []
    t = T0
    while t <= stop:
        policy = next((p for start, end, p in spans if start <= t < end), None)
        for switch, port, kind, index, capacity in ports:
            total = totals[(switch, port)]
            rate = utilization(kind, index, policy) * capacity / 8
            total[0] += rate * COUNTER_PERIOD * 0.97
            total[1] += rate * COUNTER_PERIOD
            rx, tx = int(total[0]), int(total[1])
            counters.append(PortCounter(t, switch, port, rx, tx, rx // 1500, tx // 1500, 0))
        t += COUNTER_PERIOD
    return counters


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_bundle(tmp_path_factory.mktemp("results") / "run-a")


@pytest.fixture(scope="module")
def reported(bundle: Path) -> Iterator[Path]:
    assert main(["report", str(bundle)]) == 0
    yield bundle


def expected_busbw_gbps(policy: str) -> float:
    """busbw = size * factor / (ideal * 1.055) = CEILING * efficiency / 1.055, in GB/s."""
    return CEILING * EFFICIENCY[policy] / 1.055 / 1e9


# --- store round trip ------------------------------------------------------------------------


def test_round_trip_returns_what_was_written(bundle: Path) -> None:
    with ResultsBundle.open(bundle) as results:
        assert results.run.experiment == "synthetic"
        assert results.run.status == "ok"
        assert results.run.versions.ovs == "3.1.0"
        assert results.run.emulation_scale == pytest.approx(1e-4)
        configurations = results.configurations()
        assert len(configurations) == 2 * 2 * 3
        first = configurations[0]
        assert (first.policy, first.collective, first.algorithm, first.size) == (
            "ecmp",
            "all-reduce",
            "ring",
            65536,
        )
        assert {(c.policy, c.host_ports) for c in configurations} == set(HOST_PORTS.items())
        records = results.iterations(first.id)
        assert len(records) == RANKS * (ITERATIONS + WARMUP)
        timed = [r for r in records if not r.warmup]
        assert timed[0].time_us == pytest.approx(rank_time_us("ecmp", "all-reduce", 65536, 0, 0))
        samples = results.samples(first.id)
        assert {s.rank for s in samples} == set(range(RANKS))
        assert len({s.five_tuple for s in samples}) == 2 * RANKS  # two channels per rank
        phases = results.timelines(first.id)
        assert {p.phase for p in phases} == {"reduce-scatter", "all-gather"}
        counters = list(results.port_counters())
        assert counters and all(c.tx_bytes >= 0 for c in counters)


def test_operation_time_is_the_mean_over_ranks_of_each_ranks_mean() -> None:
    records = [
        IterationRecord(0, 0, 100.0, 0),
        IterationRecord(1, 0, 300.0, 0),  # rank 0: mean 200
        IterationRecord(0, 1, 500.0, 0),  # rank 1: mean 500 (one iteration only)
        IterationRecord(0, 1, 9999.0, 0, warmup=True),  # not timed
    ]
    assert operation_time_us(records) == pytest.approx(350.0)
    assert math.isnan(operation_time_us([]))


def test_database_has_schema_version_and_flat_samples_view(bundle: Path) -> None:
    db = sqlite3.connect(bundle / DATABASE)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
        columns = [d[0] for d in db.execute("SELECT * FROM connection_samples_flat").description]
        assert " ".join(columns) == (
            "config_id rank protocol src_ip src_port dst_ip dst_port t bytes"
        )
    finally:
        db.close()


def test_the_runs_own_controller_restarts_read_back_and_are_unknown_before(
    tmp_path: Path,
) -> None:
    made = [
        ControllerRestart(T0 - 3.0, T0 - 2.2, "ecmp", "monitor"),
        ControllerRestart(T0 + 40.0, T0 + 41.8, "path-pinned", "policy"),
        ControllerRestart(T0 + 90.0, None, "shortest", "policy"),  # never programmed
    ]
    with ResultsWriter(tmp_path / "b", DESCRIPTION) as writer:
        writer.add_run(experiment="x", host="h", versions=Versions("a", "b", "c", "d"))
        writer.add_controller_restarts(made)
    with ResultsBundle.open(tmp_path / "b") as results:
        assert results.controller_restarts() == made
    with sqlite3.connect(tmp_path / "b" / DATABASE) as db:  # as astral wrote it before
        db.execute("DROP TABLE controller_restarts")
        db.execute("PRAGMA user_version = 3")
    with ResultsBundle.open(tmp_path / "b") as results:
        assert results.controller_restarts() is None  # not recorded, not "none made"


def test_queue_counters_round_trip_and_an_older_bundle_has_none(tmp_path: Path) -> None:
    sampled = [
        QueueCounter(T0, "p0r0t0", 1, 10, 0, 0),
        QueueCounter(T0 + 0.5, "p0r0t0", 1, 900, 12, 6_110),
    ]
    with ResultsWriter(tmp_path / "b", DESCRIPTION) as writer:
        writer.add_run(experiment="x", host="h", versions=Versions("a", "b", "c", "d"))
        assert writer.add_queue_counters(sampled) == 2
    with ResultsBundle.open(tmp_path / "b") as results:
        assert results.queue_counters() == sampled
    with sqlite3.connect(tmp_path / "b" / DATABASE) as db:  # as astral wrote it before
        db.execute("DROP TABLE queue_counters")
        db.execute("PRAGMA user_version = 4")
    with ResultsBundle.open(tmp_path / "b") as results:
        assert results.queue_counters() == []


TINY: dict[str, Any] = {
    "policy": "ecmp",
    "collective": "all-reduce",
    "algorithm": "ring",
    "size": 64,
    "count": 16,
    "dtype": "float",
    "ranks": 8,
    "iterations": 1,
    "warmup": 0,
    "host_ports": "balanced",
}


def test_writer_refuses_a_used_directory_and_a_second_run(tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "something").write_text("x")
    with pytest.raises(ResultsError, match="a new or empty directory"):
        ResultsWriter(tmp_path / "used", DESCRIPTION)
    versions = Versions("3.11", "2.3", "4.2", "3.1")
    with ResultsWriter(tmp_path / "new", DESCRIPTION) as writer:
        with pytest.raises(RuntimeError, match="add_run"):
            writer.add_configuration(**TINY)
        writer.add_run(experiment="x", host="h", versions=versions)
        with pytest.raises(RuntimeError, match="one run"):
            writer.add_run(experiment="x", host="h", versions=versions)


def test_a_run_that_raises_is_marked_failed_and_keeps_its_data(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), ResultsWriter(tmp_path / "b", DESCRIPTION) as writer:
        writer.add_run(experiment="x", host="h", versions=Versions("a", "b", "c", "d"))
        config = writer.add_configuration(**TINY)
        writer.add_iterations(config, [IterationRecord(0, r, 10.0, 112) for r in range(8)])
        _ = 1 / 0
    with ResultsBundle.open(tmp_path / "b") as results:
        assert results.run.status == "failed"
        assert results.run.finished is not None
        assert len(results.iterations(results.configurations()[0].id)) == 8


def test_unpinned_connections_are_kept_per_configuration(tmp_path: Path) -> None:
    with ResultsWriter(tmp_path / "b", DESCRIPTION) as writer:
        writer.add_run(experiment="x", host="h", versions=Versions("a", "b", "c", "d"))
        for policy, unpinned in (("ecmp", None), ("path-pinned", 3)):
            config = writer.add_configuration(**{**TINY, "policy": policy}, unpinned=unpinned)
            writer.add_iterations(config, [IterationRecord(0, r, 10.0, 112) for r in range(8)])
    render_bundle(tmp_path / "b", plots=False)
    with ResultsBundle.open(tmp_path / "b") as results:
        assert [c.unpinned for c in results.configurations()] == [None, 3]
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert [c["unpinned_connections"] for c in summary["configurations"]] == [None, 3]


def test_a_version_1_bundle_still_reads_without_unpinned_counts(tmp_path: Path) -> None:
    with ResultsWriter(tmp_path / "old", DESCRIPTION) as writer:
        writer.add_run(experiment="x", host="h", versions=Versions("a", "b", "c", "d"))
        config = writer.add_configuration(**TINY, unpinned=2)
        writer.add_iterations(config, [IterationRecord(0, r, 10.0, 112) for r in range(8)])
    with sqlite3.connect(tmp_path / "old" / DATABASE) as db:  # as astral wrote it before
        db.execute("ALTER TABLE configurations DROP COLUMN unpinned")
        db.execute("PRAGMA user_version = 1")
    with ResultsBundle.open(tmp_path / "old") as results:
        assert results.version == 1
        assert [c.unpinned for c in results.configurations()] == [None]
        assert [c.host_ports for c in results.configurations()] == ["unknown"]
    # re-rendered, its tables say how such a bundle was timed, not the batch rule of today
    render_bundle(tmp_path / "old", plots=False)
    (table,) = (tmp_path / "old" / "tables").glob("*.txt")
    text = table.read_text()
    assert f"# {OLD_TIME_DEFINITION}" in text and TIME_DEFINITION not in text
    assert "busbw ceiling: not recorded" in text
    with sqlite3.connect(tmp_path / "old" / DATABASE) as db:
        db.execute("PRAGMA user_version = 7")
    with pytest.raises(
        ResultsError, match=r"schema version 1 or 2 or 3 or 4 or 5 or 6 .* found version 7"
    ):
        ResultsBundle.open(tmp_path / "old")


# --- report: summary, tables, plots ----------------------------------------------------------


def test_report_writes_summary_tables_and_plots(reported: Path) -> None:
    names = {p.relative_to(reported).as_posix() for p in reported.rglob("*") if p.is_file()}
    for policy in ("ecmp", "path-pinned"):
        for op, algorithm in COLLECTIVES:
            assert f"tables/{policy}__{op}-{algorithm}.txt" in names
            assert f"tables/{policy}__{op}-{algorithm}.csv" in names
            assert f"plots/connections/{policy}__{op}-{algorithm}__1M.png" in names
    assert {"plots/busbw-all-reduce-ring.png", "plots/busbw-all-to-all-direct.png"} <= names
    assert {"plots/link-utilization.png", "summary.json", FABRIC, DATABASE} <= names
    assert "experiment.yaml" in names
    for png in reported.rglob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_numbers_equal_the_hand_computed_ones(reported: Path) -> None:
    summary = json.loads((reported / "summary.json").read_text())
    assert len(summary["configurations"]) == 12
    for entry in summary["configurations"]:
        policy, op, size = entry["policy"], entry["collective"], entry["size"]
        time_us = ideal_us(policy, op, size) * 1.055
        assert entry["time_us"] == pytest.approx(time_us, rel=1e-9)
        assert entry["algbw_GBps"] == pytest.approx(size / (time_us * 1e-6) / 1e9, rel=1e-9)
        busbw = expected_busbw_gbps(policy)
        assert entry["busbw_GBps"] == pytest.approx(busbw, rel=1e-9)
        assert entry["real"]["busbw_GBps"] == pytest.approx(busbw / 1e-4, rel=1e-9)
        # slowest timed iteration is the last one: ranks average 1 + 0.035 + 0.04
        assert entry["busbw_min_GBps"] == pytest.approx(busbw * 1.055 / 1.075, rel=1e-9)
        assert entry["busbw_max_GBps"] == pytest.approx(busbw * 1.055 / 1.035, rel=1e-9)
        assert entry["wrong"] == (5 if (policy, op, size) == WRONG else 0)
        assert entry["host_ports"] == HOST_PORTS[policy]
    averages = {(a["policy"], a["collective"]): a for a in summary["averages"]}
    assert all(a["host_ports"] == HOST_PORTS[a["policy"]] for a in summary["averages"])
    assert averages[("path-pinned", "all-to-all")]["real_busbw_GBps"] == pytest.approx(
        expected_busbw_gbps("path-pinned") / 1e-4
    )


def test_csv_and_text_tables_carry_the_same_numbers(reported: Path) -> None:
    with (reported / "tables" / "path-pinned__all-reduce-ring.csv").open() as source:
        rows = list(csv.DictReader(source))
    assert [int(r["size_B"]) for r in rows] == list(SIZES)
    busbw = expected_busbw_gbps("path-pinned")
    for row in rows:
        assert (row["type"], row["redop"], row["root"]) == ("uint32", "sum", "-1")
        assert int(row["count"]) == int(row["size_B"]) // 4
        assert float(row["busbw_GBps"]) == pytest.approx(busbw, rel=1e-9)
        assert float(row["busbw_real_GBps"]) == pytest.approx(busbw / 1e-4, rel=1e-9)
        time_us = ideal_us("path-pinned", "all-reduce", int(row["size_B"])) * 1.055
        assert float(row["time_us"]) == pytest.approx(time_us, abs=1e-3)
    text = (reported / "tables" / "ecmp__all-to-all-direct.txt").read_text().splitlines()
    assert text[-1] == f"# Avg bus bandwidth    : {expected_busbw_gbps('ecmp'):.6f}"
    assert "# Out of bounds values : 5 FAILED" in text
    line = next(x for x in text if x.split() and x.split()[0] == "262144")
    fields = line.split()
    assert fields[1:5] == ["8192", "uint32", "none", "-1"]  # count per rank, as nccl-tests
    assert float(fields[7]) == pytest.approx(expected_busbw_gbps("ecmp"), abs=1e-6)
    assert fields[8] == "5"
    assert float(fields[10]) == pytest.approx(expected_busbw_gbps("ecmp") / 1e-4, abs=0.01)


def test_report_prints_the_tables(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(bundle), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert out.count("# Avg bus bandwidth    :") == 4
    assert "all-reduce (ring), policy path-pinned, host ports balanced, 8 ranks" in out
    assert "all-to-all (direct), policy ecmp, host ports hash, 8 ranks" in out


def test_link_utilization_matches_the_synthetic_load(bundle: Path) -> None:
    with ResultsBundle.open(bundle) as results:
        computed = link_utilization(results)
    assert computed is not None
    labels, kinds, _, matrix = computed
    assert kinds[0] == "nic" and "nvlink" in kinds
    assert len(labels) == 2 * 56  # every direction of every link has a switch end
    row = labels.index("p0r0t0 > p0r0a0")  # tor_agg link index 24: even, 0.3 under ecmp
    values = matrix[row][~(matrix[row] != matrix[row])]
    assert max(values) == pytest.approx(0.6, rel=0.02)  # path-pinned
    assert min(values) == pytest.approx(0.02, rel=0.1)  # idle between configurations


def test_nic_ceiling_is_two_ports_at_tcp_payload_share(bundle: Path) -> None:
    # 2 x 200G x 1460/1514 (1500-byte frames, no TCP timestamps) = 48.2 GB/s
    with ResultsBundle.open(bundle) as results:
        assert nic_ceiling_real_gbps(results.fabric) == pytest.approx(50 * 1460 / 1514)


# --- compare ---------------------------------------------------------------------------------


def test_compare_prints_ratios_per_matching_configuration(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_synthetic_bundle(tmp_path / "run-b", policies=("path-pinned",))
    assert main(["compare", str(bundle), str(other)]) == 0
    out = capsys.readouterr().out
    # Only path-pinned matches; identical synthetic data, so every ratio is 1.00.
    ratios = [line.split()[-1] for line in out.splitlines() if line.strip() and line[0] != "#"]
    assert ratios and set(ratios) == {"1.000"}
    assert "only in A: 6 configuration(s) (policy ecmp" in out
    header = [line for line in out.splitlines() if line.startswith(("# A:", "# B:"))]
    assert header[0].endswith(", host ports balanced+hash)")  # ecmp's and path-pinned's
    assert header[1].endswith(", host ports balanced)")


def test_compare_across_policies_in_one_bundle(
    bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        ["compare", str(bundle), str(bundle), "--a-policy", "ecmp", "--b-policy", "path-pinned"]
    )
    assert status == 0
    out = capsys.readouterr().out
    ratios = [float(x.split()[-1]) for x in out.splitlines() if x.strip() and x[0] != "#"]
    assert len(ratios) == 6
    assert ratios == pytest.approx([0.88 / 0.65] * 6, abs=1e-3)


def test_compare_with_nothing_in_common_says_so(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_synthetic_bundle(tmp_path / "run-c", policies=("path-pinned",))
    # one policy given picks it on both sides: B never ran it, which is said as a mistake
    # naming B and what it ran (tests/unit/test_cli_mistakes.py), not as an empty match
    assert main(["compare", str(bundle), str(other), "--a-policy", "ecmp"]) == 2
    err = capsys.readouterr().err
    assert "a policy that bundle B" in err and "ran: path-pinned, found 'ecmp'" in err


# --- bad bundles -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["report", "compare"])
def test_bad_bundle_paths_are_clear_errors(
    command: str, tmp_path: Path, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_bundle = tmp_path / "empty"
    not_a_bundle.mkdir()
    a_file = tmp_path / "file.txt"
    a_file.write_text("hello")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / DATABASE).write_text("not a database at all" * 100)
    (garbage / FABRIC).write_text((bundle / FABRIC).read_text())
    cases = {
        tmp_path / "missing": "no such file or directory",
        a_file: "a results bundle directory, found a file",
        not_a_bundle: "a results.sqlite database in it, found none",
        garbage: "an SQLite database in results.sqlite",
    }
    for path, message in cases.items():
        argv = [command, str(path)] + ([str(bundle)] if command == "compare" else [])
        assert main(argv) == ResultsError.exit_status == 6
        err = capsys.readouterr().err
        assert f"results bundle {path}" in err and message in err, err


def _damaged(bundle: Path, where: Path, damage: str) -> Path:
    """A copy of ``bundle`` whose database lost a table, or whose pages after the first
    (which holds the header and the schema, so that it still opens) are garbage."""
    where.mkdir()
    (where / FABRIC).write_text((bundle / FABRIC).read_text())
    data = (bundle / DATABASE).read_bytes()
    if damage == "rot":
        page, size = int.from_bytes(data[16:18], "big"), len(data)  # the header's page size
        garbage = bytes(range(251)) * (size // 251 + 1)
        (where / DATABASE).write_bytes((data[:page] + garbage)[:size])
    else:
        (where / DATABASE).write_bytes(data)
        db = sqlite3.connect(where / DATABASE)
        db.execute(f"DROP TABLE {damage}")
        db.commit()
        db.close()
    return where


@pytest.mark.parametrize("damage", ["runs", "configurations", "iterations", "rot"])
@pytest.mark.parametrize("command", ["report", "compare", "diagnose"])
def test_a_damaged_database_is_a_clear_error(
    command: str, damage: str, tmp_path: Path, bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Damage past the header reaches the readers' queries: still one sentence and exit 6
    (for diagnose not 1, its "suspects found"), never an sqlite3 traceback."""
    damaged = _damaged(bundle, tmp_path / "damaged", damage)
    argv = {
        "report": ["report", "--no-plots", "-q", str(damaged)],
        "compare": ["compare", str(bundle), str(damaged)],
        "diagnose": ["diagnose", str(damaged)],
    }[command]
    assert main(argv) == ResultsError.exit_status == 6
    err = capsys.readouterr().err
    assert f"{damaged}: expected an intact results.sqlite database" in err, err


def test_bundle_without_fabric_json_or_with_foreign_database(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    sqlite3.connect(tmp_path / "a" / DATABASE).execute("CREATE TABLE x (y)").connection.close()
    with pytest.raises(ResultsError, match=r"a fabric\.json fabric description in it"):
        ResultsBundle.open(tmp_path / "a")
    (tmp_path / "a" / FABRIC).write_text('{"spec": {"emulation": {"scale": 1e-4}}}')
    with pytest.raises(ResultsError, match="an astral results database"):
        ResultsBundle.open(tmp_path / "a")
    (tmp_path / "a" / FABRIC).write_text("{")
    with pytest.raises(ResultsError, match=r"a readable fabric\.json"):
        render_bundle(tmp_path / "a")


def test_an_unverified_configuration_is_not_verified_in_the_summary_and_tables(
    tmp_path: Path,
) -> None:
    versions = Versions(python="3.11.2", mininet="2.3.0", os_ken="4.2.2", ovs="3.1.0")
    path = tmp_path / "unverified"
    with ResultsWriter(path, DESCRIPTION) as results:
        results.add_run(experiment="unverified", host="h", versions=versions, started=T0)
        for size, wrong in ((65536, -1), (262144, 0)):
            config = results.add_configuration(
                policy="ecmp", collective="all-reduce", algorithm="ring", size=size,
                count=count_column("all-reduce", size, "uint32", RANKS), dtype="uint32",
                ranks=RANKS, iterations=1, warmup=0, host_ports="balanced",
            )  # fmt: skip
            results.add_iterations(
                config, [IterationRecord(0, r, 1000.0, size, wrong) for r in range(RANKS)]
            )
    render_bundle(path, plots=False)
    summary = json.loads((path / "summary.json").read_text())
    first, second = summary["configurations"]
    assert (first["wrong"], first["verified"]) == (None, False)
    assert (second["wrong"], second["verified"]) == (0, True)
    table = (path / "tables" / "ecmp__all-reduce-ring.txt").read_text()
    assert "# Out of bounds values : 0 OK (1 of 2 sizes not verified)" in table
    assert [line.split()[8] for line in table.splitlines() if line[:1] != "#"] == ["N/A", "0"]
    with (path / "tables" / "ecmp__all-reduce-ring.csv").open() as source:
        assert [row["wrong"] for row in csv.DictReader(source)] == ["", "0"]
