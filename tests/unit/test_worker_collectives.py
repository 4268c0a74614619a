"""Collective plans, without sockets: every algorithm is executed in memory for all ranks
(``simulate``) and must produce exactly the expected buffers, move exactly the bytes its
formula prescribes, and keep its fabric traffic where the algorithm promises."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from orchestrator.collectives.nccl import buffer_bytes, count_column
from orchestrator.collectives.operations import (
    OPERATIONS,
    Expected,
    UnknownOperation,
    operation,
)
from orchestrator.collectives.plans import (
    COLLECTIVES,
    ELEMENT_BYTES,
    Layout,
    Plan,
    PlanError,
    PlanStep,
    Region,
    RingAllReduce,
    Transfer,
    UnknownAlgorithm,
    default_registry,
    element_count,
    split,
)
from tests.unit.simulation import simulate

REGISTRY = default_registry()
ALL = [tuple(name.split("/")) for name in REGISTRY.names()]


def plans_for(collective: str, algorithm: str, layout: Layout, count: int) -> list[Plan]:
    algo = REGISTRY.get(collective, algorithm)
    return [algo.plan(layout, rank, count) for rank in range(layout.size)]


LAYOUTS = {
    "2x1": Layout.regular(2, 1),
    "1x2": Layout.regular(2, 1 * 2),
    "3x1": Layout.regular(3, 1),
    "1x3": Layout.regular(3, 3),
    "2x2": Layout.regular(4, 2),
    "4x1": Layout.regular(4, 1),
    "3x2": Layout.regular(6, 2),
    "2x4": Layout.regular(8, 4),
    "8x1": Layout.regular(8, 1),
}


@pytest.mark.parametrize("collective, algorithm", ALL)
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_every_algorithm_computes_the_collective(
    collective: str, algorithm: str, layout_name: str
) -> None:
    layout = LAYOUTS[layout_name]
    for size in (4096, 1000 * ELEMENT_BYTES + 4 * 7):  # even, and not divisible by n
        count = element_count(collective, size, layout.size)
        plans = plans_for(collective, algorithm, layout, count)
        assert simulate(plans, test=3, iteration=1) == [0] * layout.size


@pytest.mark.parametrize("collective, algorithm", [a for a in ALL if a[0] != "p2p"])
def test_a_corrupted_chunk_is_counted(collective: str, algorithm: str) -> None:
    layout = LAYOUTS["2x2"]
    count = element_count(collective, 4096, layout.size)
    plans = plans_for(collective, algorithm, layout, count)
    assert sum(simulate(plans, corrupt=1)) > 0


def test_p2p_corruption_is_counted() -> None:
    plans = plans_for("p2p", "direct", LAYOUTS["2x1"], 1024)
    assert simulate(plans, corrupt=0) == [0, 1]


def test_split_is_contiguous_and_balanced() -> None:
    for count, parts in itertools.product(range(0, 40), range(1, 9)):
        pieces = split(count, parts)
        assert sum(length for _, length in pieces) == count
        assert all(o == sum(length for _, length in pieces[:i]) for i, (o, _) in enumerate(pieces))
        assert max(length for _, length in pieces) - min(length for _, length in pieces) <= 1


def sent(plans: list[Plan]) -> list[int]:
    return [sum(p.bytes_sent().values()) for p in plans]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_bytes_per_rank(n: int) -> None:
    layout = Layout.regular(n, 1)
    size = 1 << 20
    count = size // ELEMENT_BYTES // n * n
    s = count * ELEMENT_BYTES
    assert sent(plans_for("all-reduce", "ring", layout, count)) == [2 * (n - 1) * s // n] * n
    assert sent(plans_for("all-gather", "ring", layout, count)) == [(n - 1) * s // n] * n
    assert sent(plans_for("reduce-scatter", "ring", layout, count)) == [(n - 1) * s // n] * n
    for algorithm in ("direct", "shifted"):
        assert sent(plans_for("all-to-all", algorithm, layout, count)) == [(n - 1) * s // n] * n


def test_ring_all_reduce_total_bytes_with_uneven_chunks() -> None:
    n, count = 3, 1001
    plans = plans_for("all-reduce", "ring", Layout.regular(n, 1), count)
    assert sum(sent(plans)) == 2 * (n - 1) * count * ELEMENT_BYTES


def split_by_link(plan: Plan, layout: Layout) -> tuple[int, int]:
    nv = sum(b for peer, b in plan.bytes_sent().items() if layout.same_server(plan.rank, peer))
    return nv, sum(plan.bytes_sent().values()) - nv


@pytest.mark.parametrize("servers, gpus", [(2, 2), (3, 2), (2, 4), (4, 1), (1, 4)])
def test_hierarchical_all_reduce_is_same_rail(servers: int, gpus: int) -> None:
    layout = Layout.regular(servers * gpus, gpus)
    count = servers * gpus * 4096  # chunks divide evenly: the formulas are exact
    s = count * ELEMENT_BYTES
    for plan in plans_for("all-reduce", "hierarchical", layout, count):
        nv, fabric = split_by_link(plan, layout)
        assert nv == 2 * (gpus - 1) * s // gpus
        assert fabric == 2 * (servers - 1) * (s // gpus) // servers
        for peer in plan.send_peers() | plan.recv_peers():
            if not layout.same_server(plan.rank, peer):
                assert layout.local_ranks[peer] == layout.local_ranks[plan.rank]


@pytest.mark.parametrize("servers, gpus", [(2, 2), (3, 2), (2, 4), (4, 1), (1, 4)])
def test_pxn_all_to_all_keeps_fabric_traffic_on_the_rail(servers: int, gpus: int) -> None:
    n = servers * gpus
    layout = Layout.regular(n, gpus)
    count = (1 << 20) // ELEMENT_BYTES // n * n
    block = count // n * ELEMENT_BYTES
    for plan in plans_for("all-to-all", "pxn", layout, count):
        nv, fabric = split_by_link(plan, layout)
        assert nv == (gpus - 1) * servers * block
        assert fabric == (servers - 1) * gpus * block
        for peer in plan.send_peers():
            if not layout.same_server(plan.rank, peer):
                assert layout.local_ranks[peer] == layout.local_ranks[plan.rank]


def test_rail_algorithms_need_the_same_rails_on_every_server() -> None:
    layout = Layout(("a", "a", "b"), (0, 1, 0))
    with pytest.raises(PlanError, match="same rails"):
        REGISTRY.get("all-reduce", "hierarchical").plan(layout, 0, 100)
    with pytest.raises(PlanError, match="same rails"):
        REGISTRY.get("all-to-all", "pxn").plan(layout, 0, 99)


def test_unknown_algorithm_names_the_known_ones() -> None:
    with pytest.raises(UnknownAlgorithm, match="all-reduce/ring"):
        REGISTRY.get("all-reduce", "tree")


def test_per_rank_counts_round_down_like_nccl_tests() -> None:
    assert element_count("all-reduce", 1000, 3) == 250
    assert element_count("all-gather", 1000, 3) == 249
    assert operation("all-gather").table_count(249, 3) == 83
    assert operation("all-reduce").table_count(250, 3) == 250


def test_experiments_list_the_registered_nccl_tests_operations_default_first() -> None:
    assert REGISTRY.collectives() == dict(COLLECTIVES)
    assert dict(COLLECTIVES) == {
        "all-reduce": ("ring", "hierarchical"),
        "all-to-all": ("direct", "shifted", "pxn"),
        "all-gather": ("ring",),
        "reduce-scatter": ("ring",),
    }
    # p2p/direct is an algorithm (the iperf3 comparison), not something experiments list
    assert "p2p/direct" in REGISTRY.names()


class _ChainBroadcast:
    """A new algorithm as one would add it to plans.py: rank 0's data down the chain of
    ranks, one hop per step (steps aligned across ranks for ``simulate``)."""

    operation = OPERATIONS["broadcast"]
    name = "chain"

    def plan(self, layout: Layout, rank: int, count: int) -> Plan:
        data = Region("data", 0, count)
        steps = [PlanStep("wait")] * max(rank - 1, 0)
        if rank > 0:
            steps.append(PlanStep("chain", recvs=(Transfer(rank - 1, data),)))
        if rank < layout.size - 1:
            steps.append(PlanStep("chain", sends=(Transfer(rank + 1, data),)))
        return Plan("broadcast", self.name, rank, count, (("data", count),), tuple(steps))


def test_a_new_algorithm_is_listed_counted_and_checked_once_registered() -> None:
    registry = default_registry()
    registry.register(_ChainBroadcast())
    assert registry.collectives()["broadcast"] == ("chain",)
    algo = registry.get("broadcast", "chain")
    for layout in (LAYOUTS["2x1"], LAYOUTS["3x2"]):
        count = element_count("broadcast", 1001, layout.size)
        assert count == 250
        plans = [algo.plan(layout, rank, count) for rank in range(layout.size)]
        assert simulate(plans) == [0] * layout.size
        assert sum(simulate(plans, corrupt=0)) == layout.size - 1


def test_an_algorithm_of_a_foreign_operation_or_registered_twice_is_refused() -> None:
    registry = default_registry()

    class Elsewhere(_ChainBroadcast):
        operation = replace(OPERATIONS["broadcast"])  # equal, but not the registry's

    with pytest.raises(ValueError, match="its operation is not one of"):
        registry.register(Elsewhere())
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(RingAllReduce())


def test_reduce_is_checked_on_its_root_only() -> None:
    root, other = (operation("reduce").result(rank, 3, 12) for rank in (0, 1))
    assert root.expected == (Expected("data", 0, 12, 0, (0, 1, 2)),)
    assert (other.inputs, other.expected) == (("data",), ())


@pytest.mark.parametrize("collective", sorted(OPERATIONS))
def test_workers_and_nccl_tests_round_sizes_alike(collective: str) -> None:
    for size, ranks in itertools.product((1, 4, 1000, 1001, 4096, 65537), (1, 2, 3, 8)):
        elements = element_count(collective, size, ranks)
        assert buffer_bytes(collective, size, "uint32", ranks) == elements * ELEMENT_BYTES
        counted = count_column(collective, size, "uint32", ranks)
        assert counted == operation(collective).table_count(elements, ranks)


def test_unknown_operation_names_the_known_ones() -> None:
    with pytest.raises(UnknownOperation, match="all-reduce"):
        element_count("all-shuffle", 1024, 2)


def test_layout_rejects_two_ranks_in_one_place() -> None:
    with pytest.raises(PlanError):
        Layout(("a", "a"), (0, 0))
