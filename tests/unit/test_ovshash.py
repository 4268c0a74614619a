"""Open vSwitch's select-group choice computed outside the switch (controllers.ovshash),
checked against choices real switches made: paths that Open vSwitch 3.1.0 forwarded
connections of a fat-tree-small run by under ``ecmp`` (traced with ``ofproto/trace``, kept
in the run's bundle). tests/integration/test_path_trace.py checks it against the live
switches of every suite run."""

from __future__ import annotations

import pytest

from controllers.ovshash import hash_bytes, hash_int, pick, reproducible
from controllers.plan import Bucket, GroupEntry, GroupType, Packet, SelectionMethod
from controllers.tracer import follow
from orchestrator.forecast.paths import PolicyRouter
from tests.helpers import preset_description

# (source address, source port, destination address, destination port): the path the
# switches took, from a run of 2026-12-04 (five-tuples with five different core paths)
TRACED = {
    ("10.1.0.1", 16448, "10.0.1.1", 47000): "p0s0g1 p0t0 p0a0 c0 p1a0 p1t0 p1s0g0",
    ("10.1.0.1", 16480, "10.1.1.1", 47000): "p0s0g1 p0t0 p0a0 c1 p1a0 p1t0 p1s0g1",
    ("10.1.0.1", 16544, "10.1.1.2", 47000): "p0s0g1 p0t0 p0a1 c2 p1a1 p1t1 p1s1g1",
    ("10.1.0.1", 16576, "10.0.2.1", 47000): "p0s0g1 p0t0 p0a0 c0 p2a0 p2t0 p2s0g0",
    ("10.1.0.1", 16608, "10.1.2.1", 47000): "p0s0g1 p0t0 p0a0 c1 p2a0 p2t0 p2s0g1",
}


def test_the_paths_computed_are_those_the_switches_took() -> None:
    description = preset_description("fat-tree-small")
    plan = PolicyRouter(description, "ecmp").plan
    for (src_ip, sport, dst_ip, dport), nodes in TRACED.items():
        path = tuple(nodes.split())
        packet = Packet.tcp(src_ip, dst_ip, sport, dport)

        def choose(
            switch: str, group: GroupEntry, live: list[Bucket], p: Packet = packet
        ) -> Bucket:
            picked = pick(group, live, p)
            assert picked is not None
            return picked

        assert (path[0], *follow(description, plan, path[1], packet, choose=choose)) == path


def test_every_byte_counts_zeros_and_order_too() -> None:
    # a zero word still turns the state, and hash_bytes finishes with the length: the
    # fields with value 0 (ip_dscp) change the hash, as they do in the switch
    assert hash_bytes(b"", 0) == 0
    assert hash_bytes(b"\0", 0) != hash_bytes(b"", 0)
    assert hash_bytes(b"\x08\x00", 0) != hash_bytes(b"\x00\x08", 0)
    assert hash_int(1, 0) != hash_int(0, 1)


def test_a_choice_it_cannot_compute_is_left_to_the_caller() -> None:
    buckets = (Bucket((), watch_port=1), Bucket((), watch_port=2))
    packet = Packet.tcp("10.0.0.1", "10.0.1.1", 16384, 47000)
    dp_hash = GroupEntry(1, "s", 7, GroupType.SELECT, buckets, SelectionMethod("dp_hash", ()))
    by_port = GroupEntry(1, "s", 7, GroupType.SELECT, buckets, SelectionMethod(fields=("in_port",)))
    for group in (dp_hash, by_port):
        assert not reproducible(group)
        assert pick(group, list(buckets), packet) is None


@pytest.mark.parametrize("down", [0, 1])
def test_a_dead_bucket_moves_only_its_own_flows(down: int) -> None:
    """Rendezvous hashing: the flows of the surviving bucket stay where they were."""
    buckets = (Bucket((), watch_port=1), Bucket((), watch_port=2), Bucket((), watch_port=3))
    group = GroupEntry(1, "s", 7, GroupType.SELECT, buckets, SelectionMethod(basis=12345))
    packets = [Packet.tcp("10.0.0.1", "10.0.1.1", 16384 + k, 47000) for k in range(200)]
    before = [pick(group, list(buckets), p) for p in packets]
    live = [b for i, b in enumerate(buckets) if i != down]
    after = [pick(group, live, p) for p in packets]
    assert {b for b in before} == set(buckets)  # every bucket takes some
    for was, now in zip(before, after, strict=True):
        assert now == was or was == buckets[down]
