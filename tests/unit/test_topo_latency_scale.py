"""Routes and latencies by the fabric's structure (topologies/routetable.py): the same as a
search from every GPU on small fabrics of every kind, seconds on large ones; and a fabric
too large to build is a sentence naming the key, not a hang (``astral topo show``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from tests.helpers import within
from topologies.catalog import preset_names, preset_path
from topologies.errors import FabricSpecError
from topologies.generators import MAX_LINKS, MAX_RADIX, build_fabric
from topologies.latency import (
    PathLatency,
    fabric_latency,
    latency_record,
    nvlink_latency,
    pair_latencies,
)
from topologies.model import Fabric
from topologies.properties import all_routes
from topologies.routetable import RouteTable
from topologies.spec import load_fabric_spec, parse_fabric_spec


def fabric_doc(name: str, kind: str, **keys: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, **keys}


#: fabrics no preset is: every kind, single- and dual-ToR, partial ToR groups, an Astral
#: core that does not divide the uplinks, a fat-tree whose servers span edges, rail-only
#: rails with and without spines, and latencies under which two kinds of path tie
VARIANTS = [
    fabric_doc("a-1pod", "astral", pods=1, servers_per_pod=3, gpus_per_server=2,
               switch={"radix": 8, "down_ports": 4}),
    fabric_doc("a-3pod", "astral", pods=3, servers_per_pod=2, gpus_per_server=2,
               switch={"radix": 6, "down_ports": 2}),
    fabric_doc("a-single", "astral", pods=2, servers_per_pod=4, gpus_per_server=2, nic_ports=1,
               switch={"radix": 6, "down_ports": 2}),
    fabric_doc("a-groups", "astral", pods=2, servers_per_pod=5, gpus_per_server=3,
               switch={"radix": 8, "down_ports": 4}),
    fabric_doc("a-nonuniform", "astral", pods=3, servers_per_pod=3, gpus_per_server=2,
               switch={"radix": 8, "down_ports": 4}),
    fabric_doc("a-one-rail", "astral", pods=1, servers_per_pod=4, gpus_per_server=1,
               switch={"radix": 6, "down_ports": 4}),
    fabric_doc("a-one-server", "astral", pods=1, servers_per_pod=1, gpus_per_server=4,
               switch={"radix": 4}),
    fabric_doc("ft-6", "fat-tree", pods=3, gpus_per_server=3, switch={"radix": 6}),
    fabric_doc("ft-span", "fat-tree", pods=2, servers_per_pod=4, gpus_per_server=2,
               switch={"radix": 6}),
    fabric_doc("ft-1pod", "fat-tree", pods=1, gpus_per_server=2, switch={"radix": 4}),
    fabric_doc("ft-8", "fat-tree", pods=5, servers_per_pod=3, gpus_per_server=4,
               switch={"radix": 8}),
    fabric_doc("ro-single", "rail-optimized", pods=2, servers_per_pod=3, gpus_per_server=2,
               nic_ports=1, switch={"radix": 8, "down_ports": 2}),
    fabric_doc("ro-dual", "rail-optimized", pods=1, servers_per_pod=5, gpus_per_server=2,
               nic_ports=2, switch={"radix": 12, "down_ports": 4}),
    fabric_doc("ro-parallel", "rail-optimized", pods=1, servers_per_pod=4, gpus_per_server=2,
               nic_ports=1, switch={"radix": 8, "down_ports": 4},
               oversubscription={"tor": 2, "agg": 1}),
    fabric_doc("rl-no-spine", "rail-only", pods=1, servers_per_pod=3, gpus_per_server=3,
               nic_ports=2, switch={"radix": 8, "down_ports": 4}),
    fabric_doc("rl-spines", "rail-only", pods=2, servers_per_pod=5, gpus_per_server=3,
               nic_ports=1, switch={"radix": 8, "down_ports": 2}),
    fabric_doc("rl-dual", "rail-only", pods=2, servers_per_pod=3, gpus_per_server=2,
               nic_ports=2, switch={"radix": 8, "down_ports": 2}),
    # 1 switch + NVLink costs what 3 switches do: the record lists ties by first pair
    fabric_doc("rl-tie", "rail-only", pods=2, servers_per_pod=3, gpus_per_server=2,
               nic_ports=2, switch={"radix": 8, "down_ports": 2},
               latency={"switch_hop": "0.3us", "nvlink": "0.6us"}),
    fabric_doc("a-zero", "astral", pods=2, servers_per_pod=2, gpus_per_server=2,
               switch={"radix": 4},
               latency={"switch_hop": 0, "nic": 0, "library": 0, "nvlink": 0}),
    fabric_doc("ft-zero", "fat-tree", pods=2, gpus_per_server=2, switch={"radix": 4},
               latency={"switch_hop": 0, "nic": 0, "library": 0, "nvlink": 0}),
    fabric_doc("a-off", "astral", pods=2, servers_per_pod=2, gpus_per_server=2,
               switch={"radix": 4}, latency="off"),
]  # fmt: skip
SMALL = [*preset_names(), *(doc["name"] for doc in VARIANTS)]


def small_fabric(name: str) -> Fabric:
    if name in preset_names():
        return build_fabric(load_fabric_spec(preset_path(name)))
    doc = next(d for d in VARIANTS if d["name"] == name)
    return build_fabric(parse_fabric_spec(doc, name))


def record_pair_by_pair(fabric: Fabric, gpus: Sequence[str] | None = None) -> dict[str, Any]:
    """What latency_record gave before the route table: a search from every GPU
    (all_routes), every ordered pair's latency, sorted by latency and grouped by kind."""
    spec, scale = fabric.spec.latency, fabric.spec.emulation.scale
    names = list(gpus) if gpus is not None else [g.name for g in fabric.gpus_by_rank()]
    routes = all_routes(fabric)
    latencies: dict[tuple[str, str], PathLatency] = {}
    for src in names:
        for dst in names:
            if src == dst:
                continue
            if fabric.gpus[src].server == fabric.gpus[dst].server:
                latencies[(src, dst)] = nvlink_latency(spec)
            else:
                latencies[(src, dst)] = fabric_latency(spec, routes[(src, dst)])
    paths: dict[str, dict[str, Any]] = {}
    for path in sorted(latencies.values(), key=lambda p: p.seconds):
        entry = paths.setdefault(
            path.label,
            {
                "path": path.label,
                "pairs": 0,
                "one_way_real_us": round(path.seconds * 1e6, 6),
                "one_way_emulated_ms": round(path.seconds / scale * 1e3, 6),
            },
        )
        entry["pairs"] += 1
    return {
        "enabled": spec.enabled,
        "scale": scale,
        "components_real_us": {k: round(v * 1e6, 6) for k, v in spec.components().items()},
        "operation": {
            "real_us": round(spec.operation * 1e6, 6),
            "emulated_ms": round(spec.operation / scale * 1e3, 6),
        },
        "paths": list(paths.values()),
    }


# --- the same as a search from every GPU ---------------------------------------------------


@pytest.mark.parametrize("name", SMALL)
def test_every_route_is_the_one_a_search_from_its_source_finds(name: str) -> None:
    fabric = small_fabric(name)
    table = RouteTable(fabric)
    searched = all_routes(fabric)
    for src in fabric.gpus:
        for dst in fabric.gpus:
            if src != dst:
                assert table.route(src, dst) == searched.get((src, dst)), (src, dst)


@pytest.mark.parametrize("name", SMALL)
def test_the_latency_record_is_the_one_every_pair_gives(name: str) -> None:
    """All GPUs, some of them (one named twice), and all of them in reverse order (which
    reorders ties)."""
    fabric = small_fabric(name)
    ranked = [g.name for g in fabric.gpus_by_rank()]
    for gpus in (None, ranked[::3][:5], ranked[-1:] + ranked[:3] * 2, ranked[::-1]):
        assert latency_record(fabric, gpus) == record_pair_by_pair(fabric, gpus), gpus
    by_pair = pair_latencies(fabric)
    routes = all_routes(fabric)
    spec = fabric.spec.latency
    for (src, dst), path in by_pair.items():
        if fabric.gpus[src].server != fabric.gpus[dst].server:
            assert path == fabric_latency(spec, routes[(src, dst)])


def test_ties_are_listed_in_the_order_of_their_first_pairs() -> None:
    record = latency_record(small_fabric("rl-tie"))
    costs = {p["path"]: p["one_way_real_us"] for p in record["paths"]}
    assert costs["1 switch + NVLink"] == costs["3 switches"]
    order = [p["path"] for p in record["paths"]]
    assert order.index("1 switch + NVLink") < order.index("3 switches")


# --- large fabrics -----------------------------------------------------------------------------


def astral(radix: int, pods: int) -> Fabric:
    doc = fabric_doc("big", "astral", pods=pods, gpus_per_server=8, switch={"radix": radix})
    return build_fabric(parse_fabric_spec(doc, "big"))


def test_a_fabric_of_32768_gpus_is_summed_in_seconds_and_exactly() -> None:
    """8 pods of 512 servers: a search from every GPU would take about half an hour. The
    pairs of each kind, worked out: NVLink within a server, 1 switch within a ToR group
    (32 servers) of a rail plane, 3 within the plane, 5 across planes."""
    fabric = astral(64, 8)
    with within(60.0):  # a search from every GPU: half an hour
        record = latency_record(fabric)
    servers, rails, group, planes = 512, 8, 32, 8 * 8
    n = len(fabric.gpus)
    same_group = planes * (servers // group) * group * (group - 1)
    same_plane = planes * servers * (servers - 1)
    nvlink = 8 * servers * rails * (rails - 1)
    pairs = {p["path"]: p["pairs"] for p in record["paths"]}
    assert pairs == {
        "NVLink": nvlink,
        "1 switch": same_group,
        "3 switches": same_plane - same_group,
        "5 switches": n * (n - 1) - nvlink - same_plane,
    }


@pytest.mark.parametrize(
    "doc",
    [
        fabric_doc("rl-big", "rail-only", pods=1, gpus_per_server=8, nic_ports=2,
                   switch={"radix": 64}),
        fabric_doc("ft-big", "fat-tree", pods=32, gpus_per_server=4, switch={"radix": 32}),
    ],
    ids=["rail-only", "fat-tree"],
)  # fmt: skip
def test_other_kinds_at_thousands_of_gpus_are_summed_in_seconds(doc: dict[str, Any]) -> None:
    """Every ordered pair is counted once; a server's pairs are NVLink's."""
    fabric = build_fabric(parse_fabric_spec(doc, doc["name"]))
    n = len(fabric.gpus)
    assert n == 8192
    with within(60.0):
        record = latency_record(fabric)
    pairs = Counter({p["path"]: p["pairs"] for p in record["paths"]})
    assert sum(pairs.values()) == n * (n - 1)
    per_server = fabric.spec.gpus_per_server
    assert pairs["NVLink"] == len(fabric.servers) * per_server * (per_server - 1)


def test_a_route_on_a_large_fabric_needs_no_search_from_every_gpu() -> None:
    fabric = astral(64, 8)
    with within(60.0):
        table = RouteTable(fabric)
        last = fabric.gpus_by_rank()[-1].name
        assert table.route("p0s0g0", last) is not None
        assert table.route("p0s0g0", "p0s1g0") == table.route("p7s0g7", "p7s1g7")


# --- too large to build --------------------------------------------------------------------


def radix_doc(radix: int, **keys: Any) -> dict[str, Any]:
    return fabric_doc("absurd", "astral", pods=1, gpus_per_server=2, switch={"radix": radix},
                      **keys)  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "key", "words"),
    [
        (radix_doc(100_000), "switch.radix", "2,500,000,000 GPUs"),
        (radix_doc(100_000, servers_per_pod=2), "switch.radix", "4 GPUs"),
        (fabric_doc("s", "astral", pods=1, servers_per_pod=1_000_000, gpus_per_server=2,
                    switch={"radix": 3_000, "down_ports": 2_990}),
         "servers_per_pod", "2,000,000 GPUs"),
        (radix_doc(2_000_000_000), "switch.radix", f"at most {MAX_RADIX:,} ports"),
        (fabric_doc("ft", "fat-tree", pods=2, gpus_per_server=2, switch={"radix": 100_000}),
         "switch.radix", "5,000,000,000 GPUs"),
    ],
    ids=["astral", "astral-few-servers", "servers", "radix", "fat-tree"],
)  # fmt: skip
def test_a_fabric_too_large_to_build_is_a_sentence_naming_the_key(
    doc: dict[str, Any], key: str, words: str
) -> None:
    spec = parse_fabric_spec(doc, "absurd.yaml")
    with within(60.0), pytest.raises(FabricSpecError) as info:
        build_fabric(spec)
    assert info.value.key == key
    text = str(info.value)
    assert text.startswith(f"absurd.yaml: key '{key}': expected ")
    assert words in text
    if "links" in text:
        assert f"at most {MAX_LINKS:,} links" in text


def test_the_full_size_fabric_is_not_too_large_to_build() -> None:
    """The paper's 524,288 GPUs (3,670,016 links) stay within the limit: counted, not
    built here."""
    from topologies.generators import check_buildable, default_registry

    doc = fabric_doc("full", "astral", pods=8, gpus_per_server=8, switch={"radix": 256})
    spec = parse_fabric_spec(doc, "full")
    check_buildable(default_registry().get("astral"), spec)


def test_topo_show_of_an_absurd_radix_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "absurd.yaml"
    path.write_text("name: absurd\nkind: astral\ngpus_per_server: 2\nswitch: {radix: 100000}\n")
    with within(60.0):
        assert main(["topo", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: key 'switch.radix': expected a fabric small enough to build" in err


def test_topo_plan_takes_any_radix_up_to_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    """A radix of 100,000 plans in closed form (a fat-tree's cuts counted a pod's billions
    of GPU slots one by one); one beyond the limit is a sentence."""
    with within(60.0):
        assert main(["topo", "plan", "--radix", "100000", "--json"]) == 0
    assert '"radix": 100000' in capsys.readouterr().out
    assert main(["topo", "plan", "--radix", str(MAX_RADIX + 1)]) == 2
    assert "key '--radix': expected at most" in capsys.readouterr().err
