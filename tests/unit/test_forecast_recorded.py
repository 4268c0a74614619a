"""Forecasting with the paths a run recorded (orchestrator/forecast/recorded.py,
``astral forecast EXP --paths BUNDLE``). The bundles are written with the store's own
writer, their paths taken from the model's routing under one policy or salt, so that what
the forecast takes from them is known. Pure: no root, no emulation."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from orchestrator import cli
from orchestrator.forecast.configurations import Forecaster
from orchestrator.forecast.model import DEFAULT_SALTS, ConfigurationModel
from orchestrator.forecast.recorded import (
    NOT_RECORDED,
    OVER_FAILED,
    Coverage,
    RecordedPaths,
)
from orchestrator.results.store import ConnectionRecord, PathHop, ResultsWriter, Versions
from orchestrator.testbed.pinning import Flow, fabric_flows
from orchestrator.worker.spec import WorkerSpec, workers_from_description
from topologies.catalog import resolve_fabric
from topologies.description import FabricDescription
from topologies.errors import ConfigError
from topologies.fivetuple import FiveTuple
from topologies.generators import build_fabric
from topologies.spec import load_fabric_spec

RING = ("all-reduce", "ring")
SIZE = 1 << 20
WORKER_PORT = 47000


def description(name: str) -> FabricDescription:
    return FabricDescription.of(build_fabric(load_fabric_spec(resolve_fabric(name))))


ASTRAL = description("astral-small")
WORKERS = workers_from_description(ASTRAL)


def flows(model: ConfigurationModel, collective: str, algorithm: str) -> list[Flow]:
    channels = model.channels_for(collective, algorithm)
    return fabric_flows(model.workers, [(collective, algorithm)], channels)[0]


def write_bundle(
    path: Path,
    described: FabricDescription,
    workers: Sequence[WorkerSpec],
    configurations: Sequence[tuple[str, str, str, int, Mapping[Flow, Sequence[str] | None]]],
    sources: Mapping[Flow, str] | None = None,
) -> Path:
    """A bundle as the runner writes one: per configuration (policy, collective, algorithm,
    size, paths), both ends of every fabric connection and of one NVLink connection per
    server, the path on the sender's row (``traced``, or ``sources[flow]``; a flow whose
    path is None has no rows of path)."""
    fabric = described.fabric
    with ResultsWriter(path, described) as writer:
        writer.add_run(experiment="unit", host="h", versions=Versions("a", "b", "c", "d"))
        for policy, collective, algorithm, size, paths in configurations:
            config = writer.add_configuration(
                policy=policy, collective=collective, algorithm=algorithm, size=size,
                count=size // 4, dtype="uint32", ranks=len(workers), iterations=1, warmup=0,
                host_ports="balanced",
            )  # fmt: skip
            mates = [
                (a.rank, b.rank)
                for a, b in itertools.pairwise(workers)
                if fabric.gpus[a.host].server == fabric.gpus[b.host].server
            ]
            records, fives = [], {}
            for n, (src, dst, channel) in enumerate([*paths, *((s, d, 0) for s, d in mates)]):
                nvlink = (src, dst, channel) not in paths
                ip = "nvlink_ip" if nvlink else "fabric_ip"
                five = FiveTuple(
                    getattr(workers[src], ip), 16384 + n, getattr(workers[dst], ip), WORKER_PORT
                )
                fives[(src, dst, channel)] = five
                link = "nvlink" if nvlink else "fabric"
                records += [
                    ConnectionRecord(rank, five, src, dst, channel, link) for rank in (src, dst)
                ]
            writer.add_connections(config, records)
            for flow, nodes in paths.items():
                if nodes is None:
                    continue
                source = (sources or {}).get(flow, "traced")
                hops = [PathHop(i, node, None, None, source) for i, node in enumerate(nodes)]
                writer.add_path(writer.connection_id(config, flow[0], fives[flow]), hops)
    return path


def test_recorded_paths_replace_the_policys_for_exactly_those_connections(
    tmp_path: Path,
) -> None:
    """ECMP's paths under another salt, recorded for every ring connection but two: one
    traced only up to a switch that dropped it, one with no path. Those two keep the
    model's own path (and its hash draws), and are counted by reason."""
    model = ConfigurationModel(ASTRAL, WORKERS)
    own = model.routed("ecmp", *RING, 0).paths
    ring = flows(model, *RING)
    dropped, untraced = ring[0], ring[1]
    salt = next(
        s for s in range(1, 32)
        if any(model.routed("ecmp", *RING, s).paths[f] != own[f] for f in ring[2:])
    )  # fmt: skip
    other = model.routed("ecmp", *RING, salt).paths
    recorded: dict[Flow, Sequence[str] | None] = {f: other[f] for f in ring}
    recorded[dropped] = other[dropped][:3]
    recorded[untraced] = None
    bundle = write_bundle(
        tmp_path / "b", ASTRAL, WORKERS, [("ecmp", *RING, SIZE, recorded)],
        sources={dropped: "trace-dropped"},
    )  # fmt: skip

    paths = RecordedPaths.read(bundle, ASTRAL, WORKERS)
    with_recorded = ConfigurationModel(ASTRAL, WORKERS, recorded=paths.routes(SIZE))
    routed = with_recorded.routed("ecmp", *RING, 0).paths
    for f in ring:
        assert routed[f] == (own[f] if f in (dropped, untraced) else other[f])
    assert any(routed[f] != own[f] for f in ring)
    coverage = paths.coverage(("ecmp", *RING), SIZE, ring)
    assert (coverage.recorded, coverage.connections) == (len(ring) - 2, len(ring))
    assert coverage.fallbacks == {"trace-dropped": 1, NOT_RECORDED: 1}
    assert coverage.header() == (
        f"paths: recorded in {bundle}, {len(ring) - 2} of {len(ring)} connections; the rest "
        "routed by the policy (1 not recorded, 1 trace-dropped)"
    )
    # two connections are still left to the hash: drawn, as without a bundle
    assert not with_recorded.is_recorded("ecmp", *RING)
    assert with_recorded.forecast("ecmp", *RING, SIZE).salts == DEFAULT_SALTS
    # NVLink connections are the model's (source, NVLink switch, destination)
    nvlink = [f for f in paths.routes(SIZE)[("ecmp", *RING)].paths if f not in ring]
    assert nvlink
    for src, dst, _ in nvlink:
        a, b = WORKERS[src].host, WORKERS[dst].host
        server = ASTRAL.fabric.servers[ASTRAL.fabric.gpus[a].server]
        assert paths.routes(SIZE)[("ecmp", *RING)].paths[(src, dst, 0)] == (
            a,
            server.nvswitch,
            b,
        )


def test_a_size_the_bundle_did_not_run_takes_another_sizes_paths(tmp_path: Path) -> None:
    model = ConfigurationModel(ASTRAL, WORKERS)
    ring = flows(model, *RING)
    own = model.routed("ecmp", *RING, 0).paths
    bundle = write_bundle(
        tmp_path / "b", ASTRAL, WORKERS, [("ecmp", *RING, SIZE, {f: own[f] for f in ring})]
    )
    paths = RecordedPaths.read(bundle, ASTRAL, WORKERS)
    assert paths.routes(4 * SIZE) == paths.routes(SIZE)
    missing = paths.coverage(("ecmp", "all-to-all", "direct"), SIZE, ring)
    assert missing == Coverage(bundle, 0, len(ring), {NOT_RECORDED: len(ring)})
    assert "recorded no configuration of it" in missing.header()


def test_a_recorded_path_over_a_failed_link_falls_back(tmp_path: Path) -> None:
    model = ConfigurationModel(ASTRAL, WORKERS)
    ring = flows(model, *RING)
    own = model.routed("ecmp", *RING, 0).paths
    bundle = write_bundle(
        tmp_path / "b", ASTRAL, WORKERS, [("ecmp", *RING, SIZE, {f: own[f] for f in ring})]
    )
    a, b = own[ring[0]][1:3]  # the first connection's ToR and aggregation switch
    link = next(x for x in ASTRAL.fabric.links if {x.a, x.b} == {a, b})
    paths = RecordedPaths.read(bundle, ASTRAL, WORKERS, failed=[link])
    crossing = [f for f in ring if {(a, b), (b, a)} & set(itertools.pairwise(own[f]))]
    coverage = paths.coverage(("ecmp", *RING), SIZE, ring)
    assert coverage.fallbacks == {OVER_FAILED: len(crossing)}


def test_a_bundle_of_another_fabric_is_a_config_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = description("rail-optimized-small")
    workers = workers_from_description(other)
    model = ConfigurationModel(other, workers)
    own = model.routed("ecmp", *RING, 0).paths
    bundle = write_bundle(tmp_path / "rail", other, workers, [("ecmp", *RING, SIZE, own)])
    with pytest.raises(ConfigError) as raised:
        RecordedPaths.read(bundle, ASTRAL, WORKERS)
    assert str(bundle) in str(raised.value)
    assert "rail-optimized-small" in str(raised.value)
    # on the command line: a sentence and exit status 2, no traceback
    assert cli.main(["forecast", "--paths", str(bundle), "--calibration", "none"]) == 2
    err = capsys.readouterr().err
    assert str(bundle) in err and "Traceback" not in err


def test_a_bundle_whose_ranks_ran_elsewhere_is_a_config_error(tmp_path: Path) -> None:
    model = ConfigurationModel(ASTRAL, WORKERS)
    own = model.routed("ecmp", *RING, 0).paths
    bundle = write_bundle(tmp_path / "b", ASTRAL, WORKERS, [("ecmp", *RING, SIZE, own)])
    reversed_placement = workers_from_description(ASTRAL, [w.host for w in reversed(WORKERS)])
    with pytest.raises(ConfigError, match=r"placement.*rank 0 on"):
        RecordedPaths.read(bundle, ASTRAL, reversed_placement)


def test_with_every_path_recorded_ecmp_is_one_draw_equal_to_the_deterministic_forecast(
    tmp_path: Path,
) -> None:
    """ECMP whose run happened to take path-pinned's paths forecasts what path-pinned
    does: one forecast, no draws."""
    model = ConfigurationModel(ASTRAL, WORKERS)
    for collective, algorithm in (RING, ("all-to-all", "direct")):
        pinned = model.routed("path-pinned", collective, algorithm, 0).paths
        recorded = {f: pinned[f] for f in flows(model, collective, algorithm)}
        bundle = write_bundle(
            tmp_path / algorithm, ASTRAL, WORKERS,
            [("ecmp", collective, algorithm, SIZE, recorded)],
        )  # fmt: skip
        paths = RecordedPaths.read(bundle, ASTRAL, WORKERS)
        with_recorded = ConfigurationModel(ASTRAL, WORKERS, recorded=paths.routes(SIZE))
        assert with_recorded.is_recorded("ecmp", collective, algorithm)
        ecmp = with_recorded.forecast("ecmp", collective, algorithm, SIZE)
        deterministic = model.forecast("path-pinned", collective, algorithm, SIZE)
        drawn = model.forecast("ecmp", collective, algorithm, SIZE)
        assert (ecmp.salts, deterministic.salts, drawn.salts) == (1, 1, DEFAULT_SALTS)
        assert ecmp.time_us == pytest.approx(deterministic.time_us, rel=1e-12)
        assert ecmp.p10_us == ecmp.p90_us == ecmp.time_us


def test_forecast_with_paths_says_so_in_each_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = ConfigurationModel(ASTRAL, WORKERS)
    ring = flows(model, *RING)
    own = model.routed("ecmp", *RING, 3).paths
    recorded: dict[Flow, Sequence[str] | None] = {f: own[f] for f in ring}
    recorded[ring[0]] = own[ring[0]][:2]
    bundle = write_bundle(
        tmp_path / "b", ASTRAL, WORKERS, [("ecmp", *RING, SIZE, recorded)],
        sources={ring[0]: "trace-unknown"},
    )  # fmt: skip
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                "name": "paths",
                "fabric": "astral-small",
                "policies": ["ecmp"],
                "collectives": [{"op": "all-reduce", "algorithm": "ring"}],
                "sizes": {"min": SIZE, "max": SIZE},
                "scale": 0.6e-4,
            }
        )
    )
    args = ["forecast", str(experiment), "--paths", str(bundle), "--calibration", "none"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert (
        f"# paths: recorded in {bundle}, {len(ring) - 1} of {len(ring)} connections; the rest "
        "routed by the policy (1 trace-unknown)"
    ) in out
    assert cli.main([*args, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)["paths"][0]
    assert record["recorded"] == len(ring) - 1
    assert record["fallbacks"] == {"trace-unknown": 1}


def test_a_bundle_measured_at_other_rates_keeps_its_paths_and_says_so(tmp_path: Path) -> None:
    """The same GPUs and links at twice the rate: the paths apply (a what-if on speeds),
    and how the rates differ is said."""
    faster = FabricDescription(
        replace(
            ASTRAL.fabric, links=[replace(x, capacity=2 * x.capacity) for x in ASTRAL.fabric.links]
        ),
        ASTRAL.addresses,
    )
    model = ConfigurationModel(ASTRAL, WORKERS)
    own = model.routed("ecmp", *RING, 0).paths
    bundle = write_bundle(tmp_path / "b", faster, WORKERS, [("ecmp", *RING, SIZE, own)])
    paths = RecordedPaths.read(bundle, ASTRAL, WORKERS)
    assert paths.routes(SIZE)[("ecmp", *RING)].paths.items() >= own.items()
    assert paths.rates.startswith(f"{len(ASTRAL.fabric.links)} of its")
    assert RecordedPaths.read(bundle, faster, WORKERS).rates == ""


def test_a_runs_planned_ports_decide_ecmps_paths_before_it_runs() -> None:
    """``astral run`` plans every fabric connection's source port and NIC port before it
    starts (orchestrator/testbed/pinning.py). On astral-small, whose GPUs have two NIC
    ports, a forecast without the run draws the port its kernel's hash accepts; with the
    plan, the switches' hash of each five-tuple is computed: one draw, and each planned
    connection's path is the one its ports take."""
    forecaster = Forecaster(ASTRAL, [w.host for w in WORKERS], host_ports="balanced")
    model = forecaster.model
    for collective, algorithm in (RING, ("all-to-all", "direct")):
        assert model.draws_for("ecmp", collective, algorithm) == DEFAULT_SALTS
        run = model.routed("ecmp", collective, algorithm, 3)  # one salt's ports: the plan
        ports = dict(run.source_ports)
        nics = {
            f: next(
                n.port for n in ASTRAL.addresses[run.paths[f][0]].nics if n.peer == run.paths[f][1]
            )
            for f in ports
        }
        assert forecaster.plan("ecmp", collective, algorithm, ports, nics) == len(ports) > 0
        assert model.draws_for("ecmp", collective, algorithm) == 1
        planned = model.routed("ecmp", collective, algorithm, 0)
        assert {f: planned.paths[f] for f in ports} == {f: run.paths[f] for f in ports}
        assert model.forecast("ecmp", collective, algorithm, SIZE).salts == 1
