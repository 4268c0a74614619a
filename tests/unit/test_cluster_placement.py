"""Placing one fabric over several machines (orchestrator.cluster.placement): invariants on
the presets and on fabrics built inline, not hard-coded placements, so that a better method
may change which node goes where without touching these tests."""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from functools import cache
from typing import Any

import pytest

from orchestrator.cluster.placement import (
    LOAD_TOLERANCE,
    Placement,
    hop_loads,
    place,
)
from tests.helpers import preset_description
from topologies.catalog import preset_names
from topologies.description import FabricDescription
from topologies.generators import build_fabric
from topologies.model import Fabric, Link, LinkKind, Tier
from topologies.spec import parse_fabric_spec

INLINE: dict[str, dict[str, Any]] = {
    # 2 pods x 4 servers x 2 GPUs, one dual-ToR group per rail plane, 4 aggregation
    # switches per plane and core groups of 2.
    "astral-2x4x2": {
        "kind": "astral",
        "pods": 2,
        "servers_per_pod": 4,
        "gpus_per_server": 2,
        "switch": {"radix": 8, "down_ports": 4},
    },
    # The classic k = 4 fat-tree: 4 pods of 4 one-GPU servers, 4 cores.
    "fat-tree-k4": {
        "kind": "fat-tree",
        "pods": 4,
        "gpus_per_server": 1,
        "switch": {"radix": 4, "down_ports": 2},
    },
    # One pod, two ToR groups per rail plane: every split is inside the pod.
    "astral-1pod": {
        "kind": "astral",
        "pods": 1,
        "servers_per_pod": 8,
        "gpus_per_server": 2,
        "switch": {"radix": 8, "down_ports": 4},
    },
    # A rail-optimized fabric of 3 pods (not a multiple of 2 machines).
    "rail-optimized-3pods": {
        "kind": "rail-optimized",
        "pods": 3,
        "servers_per_pod": 2,
        "gpus_per_server": 2,
        "nic_ports": 1,
        "switch": {"radix": 16, "down_ports": 8},
    },
}
FABRICS = [*preset_names(), *INLINE]
MACHINE_COUNTS = [2, 3, 4]


@cache
def description(name: str) -> FabricDescription:
    if name in INLINE:
        spec = parse_fabric_spec({"name": name, **INLINE[name]}, "test")
        return FabricDescription.of(build_fabric(spec))
    return preset_description(name)


def machines(n: int) -> list[str]:
    return [f"host{i}" for i in range(n)]


@cache
def placed(name: str, n: int) -> Placement:
    return place(description(name), machines(n))


def cases() -> list[tuple[str, int]]:
    return [
        (name, n)
        for name in FABRICS
        for n in MACHINE_COUNTS
        if n <= len(description(name).fabric.servers)
    ]


def pod_of(fabric: Fabric, node: str) -> int | None:
    if node in fabric.gpus:
        return fabric.gpus[node].pod
    return fabric.switches[node].pod


def inside_a_pod(fabric: Fabric, link: Link) -> bool:
    pod = pod_of(fabric, link.a)
    return pod is not None and pod == pod_of(fabric, link.b)


def round_robin(fabric: Fabric, names: list[str]) -> dict[str, str]:
    """The naive placement the method must beat: servers dealt in turn, then the switches
    dealt in turn in datapath-id order."""
    where: dict[str, str] = {}
    servers = sorted(fabric.servers.values(), key=lambda s: (s.pod, s.index))
    for i, server in enumerate(servers):
        for node in (server.nvswitch, *server.gpus):
            where[node] = names[i % len(names)]
    others = [
        s for s in sorted(fabric.switches.values(), key=lambda s: s.dpid) if s.name not in where
    ]
    for i, switch in enumerate(others):
        where[switch.name] = names[i % len(names)]
    return where


# --- invariants ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "n"), cases())
def test_every_node_is_placed_exactly_once(name: str, n: int) -> None:
    placement = placed(name, n)
    fabric = description(name).fabric
    assert set(placement.where) == set(fabric.nodes())
    held = [node for share in placement.shares() for node in (*share.gpus, *share.switches)]
    assert sorted(held) == sorted(fabric.nodes())
    assert set(placement.where.values()) == set(machines(n))  # every machine holds something
    for share in placement.shares():
        assert all(placement.machine_of(node) == share.machine for node in share.gpus)
        assert all(placement.machine_of(node) == share.machine for node in share.switches)
        # Shares keep the fabric's orders: GPUs by rank, switches by datapath id.
        assert [fabric.gpus[g].rank for g in share.gpus] == sorted(
            fabric.gpus[g].rank for g in share.gpus
        )
        assert [fabric.switches[s].dpid for s in share.switches] == sorted(
            fabric.switches[s].dpid for s in share.switches
        )


@pytest.mark.parametrize(("name", "n"), cases())
def test_servers_stay_whole_and_nvlink_is_never_cut(name: str, n: int) -> None:
    placement = placed(name, n)
    fabric = description(name).fabric
    for server in fabric.servers.values():
        assert len({placement.machine_of(node) for node in (server.nvswitch, *server.gpus)}) == 1
    assert not [link for link in placement.cut_links() if link.kind is LinkKind.NVLINK]


@pytest.mark.parametrize(("name", "n"), cases())
def test_gpus_are_within_one_server_of_the_fair_share(name: str, n: int) -> None:
    placement = placed(name, n)
    fabric = description(name).fabric
    fair = len(fabric.gpus) / n
    for share in placement.shares():
        assert abs(len(share.gpus) - fair) < fabric.spec.gpus_per_server


@pytest.mark.parametrize(("name", "n"), cases())
def test_hop_load_is_switches_plus_tunnels_and_balanced(name: str, n: int) -> None:
    placement = placed(name, n)
    desc = description(name)
    loads = hop_loads(desc)
    cut_rate = sum(desc.emulated_rate(link) for link in placement.cut_links())
    shares = placement.shares()
    for share in shares:
        switches = sum(loads[s] for s in share.switches)
        assert share.hop_load_bps == pytest.approx(switches + share.tunnel_bps)
    # A tunnel loads both its machines.
    assert sum(s.tunnel_bps for s in shares) == pytest.approx(2 * cut_rate)
    assert placement.cut_rate() == pytest.approx(cut_rate)
    # Balance is reached on all of these fabrics ("where possible" in general).
    fair = sum(s.hop_load_bps for s in shares) / n
    for share in shares:
        assert abs(share.hop_load_bps / fair - 1) <= LOAD_TOLERANCE + 1e-9


@pytest.mark.parametrize(
    ("name", "n"), [(name, n) for name, n in cases() if description(name).fabric.spec.pods >= n]
)
def test_pods_stay_whole_when_there_are_enough(name: str, n: int) -> None:
    """With pods >= machines whole pods go to machines; when the GPU balance needs a pod
    split (pods not a multiple of the machines), fewer pods than machines are split."""
    placement = placed(name, n)
    fabric = description(name).fabric
    pods = fabric.spec.pods
    machines_of_pod: dict[int, set[str]] = {}
    for gpu in fabric.gpus.values():
        machines_of_pod.setdefault(gpu.pod, set()).add(placement.machine_of(gpu.name))
    split = [pod for pod, held in machines_of_pod.items() if len(held) > 1]
    assert len(split) < n
    for link in placement.cut_links():
        if inside_a_pod(fabric, link):
            assert pod_of(fabric, link.a) in split
    if pods % n == 0:
        assert not split
        assert not [link for link in placement.cut_links() if inside_a_pod(fabric, link)]


@pytest.mark.parametrize(("name", "n"), cases())
def test_cuts_no_more_than_round_robin(name: str, n: int) -> None:
    placement = placed(name, n)
    desc = description(name)
    baseline = round_robin(desc.fabric, machines(n))
    cut = [link for link in desc.fabric.links if baseline[link.a] != baseline[link.b]]
    assert len(placement.cut_links()) <= len(cut)
    assert placement.cut_rate() <= sum(desc.emulated_rate(link) for link in cut) + 1e-6


@pytest.mark.parametrize("name", FABRICS)
def test_placement_is_deterministic(name: str) -> None:
    first = place(description(name), machines(2))
    again = place(description(name), machines(2))
    assert dict(first.where) == dict(again.where)
    assert first.to_dict() == again.to_dict()
    # A fresh model of the same fabric too (nothing depends on object identity).
    fresh = FabricDescription.of(build_fabric(description(name).fabric.spec))
    assert dict(place(fresh, machines(2)).where) == dict(first.where)


@pytest.mark.parametrize("name", FABRICS)
def test_one_machine_holds_everything_and_cuts_nothing(name: str) -> None:
    desc = description(name)
    placement = place(desc, ["solo"])
    assert set(placement.where.values()) == {"solo"}
    assert placement.cut_links() == []
    assert placement.cut_between("solo", "solo") == []
    (share,) = placement.shares()
    assert len(share.gpus) == len(desc.fabric.gpus)
    assert len(share.switches) == len(desc.fabric.switches)
    assert share.tunnel_bps == 0
    assert share.hop_load_bps == pytest.approx(sum(hop_loads(desc).values()))


def test_weights_give_a_bigger_machine_a_bigger_share() -> None:
    desc = description("fat-tree-k4")  # 16 one-GPU servers in 4 pods
    placement = place(desc, ["big", "small"], weights={"big": 3})
    assert [len(s.gpus) for s in placement.shares()] == [12, 4]
    # Whole pods still: 3 to the big machine, 1 to the small one.
    assert not [link for link in placement.cut_links() if inside_a_pod(desc.fabric, link)]
    shares = {s.machine: s.hop_load_bps for s in placement.shares()}
    assert shares["big"] > shares["small"]


def test_a_512_gpu_fabric_is_placed_fast() -> None:
    spec = parse_fabric_spec(
        {
            "name": "big",
            "kind": "astral",
            "pods": 2,
            "servers_per_pod": 32,
            "gpus_per_server": 8,
            "switch": {"radix": 16, "down_ports": 8},
        },
        "test",
    )
    desc = FabricDescription.of(build_fabric(spec))
    assert len(desc.fabric.gpus) == 512
    for n in (2, 3):
        start = time.perf_counter()
        placement = place(desc, machines(n))
        assert time.perf_counter() - start < 1.0
        assert not [link for link in placement.cut_links() if link.kind is LinkKind.NVLINK]
        for share in placement.shares():
            assert abs(len(share.gpus) - 512 / n) < 8


# --- the report and the record ---------------------------------------------------------


def test_cut_between_partitions_the_cut() -> None:
    placement = placed("astral-small", 3)
    names = machines(3)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    between = [link for a, b in pairs for link in placement.cut_between(a, b)]
    assert sorted(between, key=placement.fabric.links.index) == placement.cut_links()
    for a, b in pairs:
        assert placement.cut_between(a, b) == placement.cut_between(b, a)
        for link in placement.cut_between(a, b):
            assert {placement.machine_of(link.a), placement.machine_of(link.b)} == {a, b}


def test_report_and_record() -> None:
    placement = placed("astral-small", 2)
    cut = placement.cut_links()
    assert cut  # two machines always cut something here
    text = "\n".join(placement.lines())
    for name in machines(2):
        assert name in text
    assert f"cut links ({len(cut)})" in text
    for link in cut:
        assert f"{link.a}-{link.b}" in text
    assert "hop load" in text

    record = json.loads(json.dumps(placement.to_dict()))
    assert record["machines"] == machines(2)
    assert record["where"] == dict(placement.where)
    assert record["cut_count"] == len(cut)
    assert [(c["a"], c["b"]) for c in record["cut_links"]] == [(x.a, x.b) for x in cut]
    assert [s["machine"] for s in record["shares"]] == machines(2)
    assert math.isclose(record["cut_bps"], placement.cut_rate())


def test_lookups_name_what_is_unknown() -> None:
    placement = placed("astral-small", 2)
    with pytest.raises(KeyError, match="nosuch"):
        placement.machine_of("nosuch")
    with pytest.raises(KeyError, match="elsewhere"):
        placement.share("elsewhere")
    with pytest.raises(KeyError, match="elsewhere"):
        placement.cut_between("host0", "elsewhere")
    with pytest.raises(TypeError):
        placement.where["p0s0g0"] = "host1"  # type: ignore[index]


def test_hop_loads_count_every_link_once_and_nvlink_switches_not_at_all() -> None:
    desc = description("astral-small")
    fabric = desc.fabric
    loads = hop_loads(desc)
    for switch in fabric.switches.values():
        if switch.tier is Tier.NVLINK:
            assert loads[switch.name] == 0
        else:
            rates = [desc.emulated_rate(link) for link in fabric.links_of(switch.name)]
            assert loads[switch.name] == pytest.approx(sum(rates))


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "weights", "message"),
    [
        ([], None, "no machines"),
        (["a", "b", "a"], None, "'a' is listed more than once"),
        (["a", ""], None, "non-empty"),
        ("ab", None, "list of names"),
        (["a", "b", "c", "d", "e"], None, "5 machines but fabric astral-small has only 4"),
        (["a", "b"], {"c": 1.0}, "not listed: 'c'"),
        (["a", "b"], {"a": 0}, "positive"),
        (["a", "b"], {"a": -1.0}, "positive"),
        (["a", "b"], {"a": math.nan}, "positive"),
        (["a", "b"], {"a": math.inf}, "positive"),
        (["a", "b"], {"a": True}, "positive"),
        (["a", "b"], {"a": "2"}, "positive"),
        (["a", "b"], {"a": 100.0}, "leave machine 'b' no server"),
    ],
)
def test_bad_requests_are_clear_value_errors(
    names: list[str], weights: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        place(description("astral-small"), names, weights=weights)


def test_weights_are_checked_with_one_machine_too() -> None:
    with pytest.raises(ValueError, match="not listed"):
        place(description("astral-small"), ["solo"], weights={"other": 1.0})


def test_a_placement_must_cover_the_fabric() -> None:
    desc = description("astral-small")
    where = dict(placed("astral-small", 2).where)
    missing = dict(where)
    missing.pop("p0s0g0")
    with pytest.raises(ValueError, match="leaves 1 node"):
        Placement(("host0", "host1"), missing, desc)
    with pytest.raises(ValueError, match="not listed"):
        Placement(("host0",), where, desc)


def test_machine_counts_cover_the_inline_fabrics() -> None:
    """The cases really include several machines on every fabric (a guard on the table)."""
    counts = Counter(name for name, _ in cases())
    assert all(counts[name] >= 2 for name in FABRICS)
