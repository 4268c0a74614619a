"""Which egress of a switch lost packets, from what its entries forwarded there and what it sent.

The telemetry's flow and group samples carry the ports their actions output to; the
diagnosis sums them per egress (orchestrator/diagnosis/forwarding.py) and names the egress
that lost what its switch's balance says was lost (orchestrator/diagnosis/egress.py). The
magnitudes are those of seed 66 run 5 (docs/diagnosis.md): a 3 % loss on a ToR's egress to
a GPU under an all-to-all lost 89 of 10,296 packets there, 7 at each other egress.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controllers.counters import (
    FlowSample,
    GroupSample,
    PortSample,
    StatsRound,
    SwitchSample,
    dumps,
    encode_round,
    header_record,
    match_of,
)
from orchestrator.diagnosis.detectors import Leak
from orchestrator.diagnosis.egress import counted_egress, egress_losses
from orchestrator.diagnosis.forwarding import forwarded_series
from tests.helpers import preset_description
from tests.unit.test_diagnosis import T0, event, observations
from topologies.description import FabricDescription

SWITCH = "p0r0t0"  # on astral-small: port 1 to p0s0g0, 2 to p0s1g0, 3 and 4 up
TO = {1: "10.0.0.1", 2: "10.0.0.2"}


@pytest.fixture(scope="module")
def astral() -> FabricDescription:
    return preset_description("astral-small")


def port(number: int, tx: int) -> PortSample:
    return PortSample(number, 0, tx, 0, 0, 0, 0, 0, 0, 1.0)


def sample(
    t: float, flows: dict[int, int], buckets: tuple[int, int], tx: dict[int, int]
) -> SwitchSample:
    """p0r0t0 at ``t``: an entry per GPU port with its packets, a select group over the
    two uplinks with its buckets' packets, a drop entry, and each port's sent packets."""
    entries = [
        FlowSample(0, 100, match_of([("ipv4_dst", TO[p])]), n, 0, 1.0, (p,))
        for p, n in flows.items()
    ]
    entries.append(
        FlowSample(0, 100, match_of([("ipv4_dst", "10.1.0.0/16")]), sum(buckets), 0, 1.0, (), (7,))
    )
    entries.append(FlowSample(0, 900, match_of([("ipv4_dst", "10.0.0.9")]), 40, 0, 1.0))  # drop
    group = GroupSample(7, sum(buckets), 0, 1.0, ((buckets[0], 0), (buckets[1], 0)), ((3,), (4,)))
    ports = tuple(port(p, tx.get(p, 0)) for p in (1, 2, 3, 4))
    return SwitchSample(SWITCH, 5, t, ports, (group,), tuple(entries))


def write_telemetry(bundle: Path, samples: list[SwitchSample], old: bool = False) -> None:
    lines = [dumps(header_record(T0 - 5, "astral-small", "ecmp", 0.5, {SWITCH: 5}, 1))]
    for i, s in enumerate(samples):
        record = encode_round(StatsRound(i, s.t, {SWITCH: s}))
        if old:  # as written before the outputs were recorded
            for row in record["switches"][SWITCH]["flows"]:
                del row[6:]
            for row in record["switches"][SWITCH]["groups"]:
                del row[5:]
        lines.append(dumps(record))
    if old:
        header = json.loads(lines[0])
        header["columns"]["flow"] = header["columns"]["flow"][:6]
        header["columns"]["group"] = header["columns"]["group"][:5]
        lines[0] = dumps(header)
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "telemetry.jsonl").write_text("\n".join(lines) + "\n")


RUN_START = [
    sample(T0 - 1.0, {1: 0, 2: 0}, (0, 0), {}),
]
# a lossy egress to p0s1g0: 10,296 forwarded, 10,203 sent, 4 discarded -> 89 lost
LOSSY_END = sample(
    T0 + 21.0, {1: 10_050, 2: 10_296}, (9_040, 9_163), {1: 10_043, 2: 10_203, 3: 9_033, 4: 9_156}
)


def layers(bundle: Path, end: SwitchSample, discarded: dict[int, int]) -> dict[str, object]:
    """What observe() reads from the bundle: counters and queues at the polls' instants,
    and the forwarded series from the telemetry file."""
    write_telemetry(bundle, [*RUN_START, end])
    counters = {
        (SWITCH, p.port): [(T0 - 1.0, 0, 0, 0, 0), (end.t, 0, 0, 0, p.tx_packets)]
        for p in end.ports
    }
    queues = {
        (SWITCH, p): [(T0 - 1.0, 0, 0, 0), (end.t, 0, discarded.get(p, 0), 0)] for p in (1, 2, 3, 4)
    }
    return {
        "counters": counters,
        "queues": queues,
        "forwarded": forwarded_series(bundle / "telemetry.jsonl"),
    }


def test_the_forwarded_series_sums_entries_and_buckets_per_egress(tmp_path: Path) -> None:
    write_telemetry(tmp_path, [*RUN_START, LOSSY_END])
    series = forwarded_series(tmp_path / "telemetry.jsonl")
    assert series[(SWITCH, 2)][-1] == (T0 + 21.0, 10_296)
    assert series[(SWITCH, 3)][-1][1] == 9_040 and series[(SWITCH, 4)][-1][1] == 9_163
    # the group's entry is counted by its buckets, and the drop entry by no egress
    assert sum(rows[-1][1] for rows in series.values()) == 10_050 + 10_296 + 9_040 + 9_163


def test_an_entry_replaced_between_polls_counts_from_zero_again(tmp_path: Path) -> None:
    later = sample(T0 + 22.0, {1: 30, 2: 10_300}, (9_040, 9_163), {})  # entry 1 re-added
    write_telemetry(tmp_path, [*RUN_START, LOSSY_END, later])
    assert forwarded_series(tmp_path / "telemetry.jsonl")[(SWITCH, 1)][-1][1] == 10_050 + 30


def test_a_file_without_outputs_says_nothing_of_egresses(tmp_path: Path) -> None:
    write_telemetry(tmp_path, [*RUN_START, LOSSY_END], old=True)
    assert forwarded_series(tmp_path / "telemetry.jsonl") == {}
    assert forwarded_series(tmp_path / "none.jsonl") == {}


def test_the_egress_that_lost_is_named_by_the_counters(
    astral: FabricDescription, tmp_path: Path
) -> None:
    obs = observations(astral, **layers(tmp_path, LOSSY_END, {2: 4, 3: 0}))
    losses = {e.port: e.lost for e in egress_losses(obs, SWITCH, T0 - 0.5, T0 + 21.0)}
    assert losses == {1: 7, 2: 89, 3: 7, 4: 7}
    (suspect,) = counted_egress(obs, {SWITCH: Leak(110, 0, 4)})
    assert (suspect.component, suspect.target, suspect.fault) == ("link", "p0r0t0>p0s1g0", "lossy")
    assert "forwarded 10,296 packets to p0s1g0" in suspect.evidence[0]
    assert "89 lost at that egress" in suspect.evidence[0]


def test_losses_spread_over_egresses_name_none(astral: FabricDescription, tmp_path: Path) -> None:
    spread = sample(
        T0 + 21.0,
        {1: 10_050, 2: 10_296},
        (9_040, 9_163),
        {1: 10_010, 2: 10_256, 3: 9_033, 4: 9_156},
    )
    obs = observations(astral, **layers(tmp_path, spread, {}))
    assert counted_egress(obs, {SWITCH: Leak(94, 0, 0)}) == []


def test_a_loss_below_the_floor_or_at_a_named_link_is_left(
    astral: FabricDescription, tmp_path: Path
) -> None:
    small = sample(
        T0 + 21.0,
        {1: 10_050, 2: 10_296},
        (9_040, 9_163),
        {1: 10_050, 2: 10_281, 3: 9_040, 4: 9_163},
    )
    obs = observations(astral, **layers(tmp_path / "a", small, {}))
    assert counted_egress(obs, {SWITCH: Leak(15, 0, 0)}) == []  # 15 lost: healthy's noise
    obs = observations(astral, **layers(tmp_path / "b", LOSSY_END, {2: 4}))
    # a suspect shown calls the GPU's link down: the egress's loss is the down link's
    assert counted_egress(obs, {SWITCH: Leak(110, 0, 4)}, {"p0s1g0"}) == []
    # or the port went down while the run lasted
    went = observations(
        astral,
        **layers(tmp_path / "c", LOSSY_END, {2: 4}),
        events=[event(3.0, "port-down", SWITCH, 2)],
    )
    assert counted_egress(went, {SWITCH: Leak(110, 0, 4)}) == []
    assert counted_egress(observations(astral), {SWITCH: Leak(110, 0, 4)}) == []


def test_what_a_switch_forwarded_nowhere_is_counted_exactly(
    astral: FabricDescription, tmp_path: Path
) -> None:
    from orchestrator.diagnosis.egress import unforwarded
    from orchestrator.diagnosis.probes import _silent

    found = layers(tmp_path, LOSSY_END, {2: 4})
    # its ports received what its entries forwarded, and 40 more that the drop entry took
    received = {1: 10_000, 2: 10_000, 3: 9_000, 4: 9_549 + 40}  # 38,549 forwarded
    found["counters"] = {
        (SWITCH, p): [(T0 - 1.0, 0, 0, 0, 0), (T0 + 21.0, 0, 0, n, 0)] for p, n in received.items()
    }
    obs = observations(astral, **found)
    assert unforwarded(obs, SWITCH, T0 - 0.5, T0 + 21.0) == 40
    # what a hole's rule reads: the 40, not the balance of received and sent (nothing was
    # counted sent here) less the queues' discards
    assert _silent(obs, SWITCH, T0 - 0.5, T0 + 21.0) == 40
    assert unforwarded(observations(astral), SWITCH, T0, T0 + 1) is None


def test_the_counters_contradict_the_probes_guess_at_another_egress(
    astral: FabricDescription, tmp_path: Path
) -> None:
    from orchestrator.diagnosis.egress import contradicted
    from orchestrator.diagnosis.model import Suspect

    obs = observations(astral, **layers(tmp_path, LOSSY_END, {2: 4}))
    (placed,) = counted_egress(obs, {SWITCH: Leak(110, 0, 4)})
    guess = Suspect("link", "p0r0t0>p0r0a0", "lossy", 0.7, ["probes: ..."])
    same = Suspect("link", "p0r0t0-p0s1g0", "lossy", 0.6, ["probes: ..."])
    elsewhere = Suspect("link", "p0r1t0>p0r1a0", "lossy", 0.7, ["probes: ..."])
    contradicted([guess, same, elsewhere, placed], [placed])
    assert guess.score == pytest.approx(0.35) and "counters place" in guess.evidence[-1]
    assert same.score == 0.6 and elsewhere.score == 0.7 and placed.score == 0.8


def test_the_loss_began_where_the_count_last_rose_from_its_lowest(
    astral: FabricDescription, tmp_path: Path
) -> None:
    """The count of what an egress lost drifts below zero where entries come and go (their
    last increments are lost between polls); the loss began where it rose from there."""
    polls = [T0 - 1.0, T0 + 5.0, T0 + 10.0, T0 + 15.0, T0 + 21.0]
    forwarded = [0, 3_000, 6_000, 9_000, 10_296]
    sent = [0, 3_010, 6_030, 9_022, 10_203]  # 10 and 30 more than forwarded, then losing
    rounds = [
        sample(t, {1: 0, 2: f}, (0, 0), {2: s})
        for t, f, s in zip(polls, forwarded, sent, strict=True)
    ]
    write_telemetry(tmp_path, rounds)
    counters = {
        (SWITCH, p.port): [(r.t, 0, 0, 0, next(q.tx_packets for q in r.ports if q.port == p.port))
                           for r in rounds]
        for p in rounds[0].ports
    }  # fmt: skip
    queues = {(SWITCH, p): [(t, 0, 0, 0) for t in polls] for p in (1, 2, 3, 4)}
    obs = observations(
        astral,
        counters=counters,
        queues=queues,
        forwarded=forwarded_series(tmp_path / "telemetry.jsonl"),
    )
    (suspect,) = counted_egress(obs, {SWITCH: Leak(93, 0, 0)})
    assert suspect.onset == T0 + 15.0
    assert "93 lost at that egress from about +15.00 s" in suspect.evidence[0]


def test_a_share_every_egress_reads_lost_is_the_counters_not_a_loss(
    astral: FabricDescription, tmp_path: Path
) -> None:
    """The entries' counters run a little ahead of the ports' (seed 68 run 36, healthy:
    0.27-0.54 % at every egress of a busy switch, 71 packets at one): no egress stands
    out, none is named; a loss of 1 % more at one of them is."""
    forwarded = {1: 10_050, 2: 18_196, 3: 9_040, 4: 9_163}
    usual = {p: round(n * (1 - 0.004)) for p, n in forwarded.items()}
    even = sample(T0 + 21.0, {1: 10_050, 2: 18_196}, (9_040, 9_163), usual)
    obs = observations(astral, **layers(tmp_path / "a", even, {}))
    assert counted_egress(obs, {SWITCH: Leak(200, 0, 0)}) == []
    lossy = sample(T0 + 21.0, {1: 10_050, 2: 18_196}, (9_040, 9_163), {**usual, 2: 17_941})
    obs = observations(astral, **layers(tmp_path / "b", lossy, {}))
    (suspect,) = counted_egress(obs, {SWITCH: Leak(300, 0, 0)})
    assert suspect.target == "p0r0t0>p0s1g0"
    assert "1.40% of what it forwarded there" in suspect.evidence[1]
