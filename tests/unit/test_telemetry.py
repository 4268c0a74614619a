"""Telemetry without a switch: counters to rates, the file format, rotation, the reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controllers.counters import (
    FlowRoute,
    FlowSample,
    GroupSample,
    PortSample,
    StatsRound,
    SwitchSample,
    decode_round,
    dumps,
    encode_round,
    encode_route,
    flow_rates,
    header_record,
    link_load,
    match_of,
    port_capacities,
    port_rates,
)
from controllers.telemetry import TelemetryLog
from orchestrator.testbed.telemetry import (
    Telemetry,
    link_rates,
    mean_rate,
    mean_utilization,
    parse_line,
    polling_periods,
    read_telemetry,
    summarize_periods,
    telemetry_files,
)
from tests.helpers import preset_description
from topologies.description import FabricDescription
from topologies.fivetuple import FiveTuple

MBIT = 1e6


@pytest.fixture(scope="module")
def description() -> FabricDescription:
    return preset_description("astral-small")


def port(
    number: int, tx_bytes: int, rx_bytes: int = 0, duration: float = 10.0, **kw: int
) -> PortSample:
    fields = {
        "rx_packets": rx_bytes // 1000,
        "tx_packets": tx_bytes // 1000,
        "rx_dropped": 0,
        "tx_dropped": 0,
        "rx_errors": 0,
        "tx_errors": 0,
        **kw,
    }
    return PortSample(
        port=number, rx_bytes=rx_bytes, tx_bytes=tx_bytes, duration=duration, **fields
    )


def switch(
    name: str, t: float, ports: list[PortSample], flows: tuple[FlowSample, ...] = ()
) -> SwitchSample:
    return SwitchSample(name, 5, t, tuple(ports), (), flows)


def test_port_rates_divide_by_the_switch_clock_and_skip_counters_that_went_back() -> None:
    before = switch("s", 100.0, [port(1, 0, duration=10.0), port(2, 5000), port(3, 1000)])
    # Our clock says 0.7 s passed, the switch's says 0.5 s: the switch's wins.
    after = switch(
        "s",
        100.7,
        [
            port(1, 1_250_000, rx_bytes=125_000, duration=10.5, tx_dropped=3),
            port(2, 100, duration=10.5),  # counters went back: port re-created
            port(3, 2000, duration=0.2),  # duration went back: port re-created
            port(4, 10, duration=10.5),  # new port: no previous sample
        ],
    )
    rates = port_rates(before, after, {("s", 1): 20 * MBIT})
    assert set(rates) == {1}
    r = rates[1]
    assert r.dt == pytest.approx(0.5)
    assert r.tx_bps == pytest.approx(20 * MBIT)
    assert r.rx_bps == pytest.approx(2 * MBIT)
    assert r.tx_utilization == pytest.approx(1.0)
    assert r.tx_dropped == 3
    # Without a usable switch clock (same duration), our clock is the divisor.
    same = switch("s", 101.0, [port(1, 2_500_000, rx_bytes=125_000, duration=10.5)])
    assert port_rates(after, same)[1].dt == pytest.approx(0.3)
    assert port_rates(after, same)[1].tx_utilization is None


def test_flow_rates_average_a_new_entry_over_its_life_and_follow_an_old_one() -> None:
    match = match_of([("eth_type", 2048), ("ipv4_dst", "10.1.0.1")])
    old = FlowSample(0, 100, match, 10, 1_000_000, 4.0)
    before = switch("s", 0.0, [], (old,))
    grown = FlowSample(0, 100, match, 20, 1_250_000, 4.5)
    fresh = FlowSample(0, 200, match, 5, 500_000, 2.0)
    rates = {r.priority: r for r in flow_rates(before, switch("s", 0.5, [], (grown, fresh)))}
    assert rates[100].bps == pytest.approx(8 * 250_000 / 0.5)
    assert rates[100].bytes == 250_000
    assert rates[200].bps == pytest.approx(8 * 500_000 / 2.0)
    # Replaced between samples (counters back): new again.
    replaced = FlowSample(0, 100, match, 1, 100, 0.1)
    (rate,) = flow_rates(before, switch("s", 0.5, [], (replaced,)))
    assert rate.bytes == 100 and rate.dt == pytest.approx(0.1)


def test_match_of_canonical_order_and_masks() -> None:
    assert match_of([("tcp_src", (0x100, 0xFF00)), ("eth_type", 2048)]) == (
        ("eth_type", 2048),
        ("tcp_src", "256/65280"),
    )


def test_link_load_uses_the_last_sample_and_the_description_capacities(
    description: FabricDescription,
) -> None:
    capacities = port_capacities(description)
    tor = "p0r0t0"
    assert capacities[(tor, 1)] == pytest.approx(20 * MBIT)  # 200G x 1e-4
    assert all(
        name in {s.name for s in description.fabric.switches.values()} for name, _ in capacities
    )
    prev = StatsRound(0, 0.0, {tor: switch(tor, 0.0, [port(3, 0, duration=1.0)])})
    cur = StatsRound(1, 0.5, {tor: switch(tor, 0.5, [port(3, 625_000, duration=1.5)])})
    load = link_load(prev, cur, capacities)
    assert load.tx_utilization(tor, 3) == pytest.approx(0.5)
    assert load.tx_utilization(tor, 9) is None
    assert link_load(None, cur, capacities).ports == {}


def test_stats_round_survives_the_file_format() -> None:
    match = match_of([("eth_type", 2048), ("ipv4_dst", "10.1.0.1"), ("tcp_dst", (80, 0xFFF0))])
    stats = StatsRound(
        7,
        1234.5,
        {
            "p0r0t0": SwitchSample(
                "p0r0t0",
                5,
                1234.52,
                (port(1, 10, 20, tx_dropped=2),),
                (GroupSample(3, 9, 900, 1.5, ((4, 400), (5, 500))),),
                (FlowSample(0, 100, match, 9, 900, 2.25),),
            )
        },
        ("p0r0t1",),
        0.012,
    )
    line = dumps(encode_round(stats))
    assert "\n" not in line
    again = decode_round(json.loads(line))
    assert again == stats


def write_rounds(
    path: Path, rounds: list[StatsRound], pid: int = 1, max_bytes: int = 1 << 20
) -> TelemetryLog:
    log = TelemetryLog(
        path, lambda: header_record(0.0, "f", "shortest", 0.5, {"p0r0t0": 5}, pid), max_bytes, 3
    )
    for stats in rounds:
        log.write(encode_round(stats))
    return log


def tor_round(n: int, t: float, tx_bytes: int, port_no: int = 3) -> StatsRound:
    tor = "p0r0t0"
    return StatsRound(n, t, {tor: switch(tor, t + 0.01, [port(port_no, tx_bytes, duration=t + 1)])})


def test_log_rotation_bounds_the_files_and_the_reader_joins_them(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    rounds = [tor_round(i, 0.5 * i, 1_250_000 * i // 2) for i in range(400)]
    log = write_rounds(path, rounds, max_bytes=8_000)
    route = FlowRoute(
        200.0,
        "adaptive",
        "moved",
        FiveTuple("10.1.0.1", 40000, "10.1.1.1", 5201, "tcp"),
        ("p0r0t0", "p0r0a1"),
        ("p0r0t0", "p0r0a0"),
        {"hot": "p0r0t0:3"},
    )
    log.write(encode_route(route))
    log.close()
    files = telemetry_files(path)
    assert [p.name for p in files] == [f"{path.name}.{i}" for i in (3, 2, 1)] + [path.name]
    assert all(p.stat().st_size <= 8_000 for p in files)
    assert all(json.loads(p.read_text().split("\n", 1)[0])["type"] == "header" for p in files)
    tel = read_telemetry(path)
    assert tel.bad_lines == 0
    assert tel.routes == [route]
    numbers = [r.round for r in tel.rounds]
    assert numbers == list(range(numbers[0], 400)), (
        "oldest first, nothing lost within the kept files"
    )
    assert numbers[0] > 0, "the oldest rounds were rotated away"
    assert tel.segments == [0], "rotations of one process are one segment"
    assert polling_periods(tel) == pytest.approx([0.5] * (len(numbers) - 1))


def test_reader_skips_a_line_being_written_and_splits_processes(
    tmp_path: Path, description: FabricDescription
) -> None:
    path = tmp_path / "telemetry.jsonl"
    write_rounds(path, [tor_round(i, 0.5 * i, 625_000 * i) for i in range(5)]).close()
    # A restarted controller appends a header and starts counting again.
    write_rounds(path, [tor_round(i, 10 + 0.5 * i, 625_000 * i) for i in range(3)], pid=2).close()
    with open(path, "a", encoding="utf-8") as out:
        out.write('{"type":"stats","round":3,"t"')  # no newline: still being written
    tel = read_telemetry(path)
    assert [r.round for r in tel.rounds] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert tel.segments == [0, 5]
    assert tel.bad_lines == 0
    assert polling_periods(tel) == pytest.approx([0.5] * 6)
    summary = summarize_periods(tel)
    assert summary.count == 6 and summary.mean == pytest.approx(0.5)

    rates = link_rates(tel, description)
    (up,) = [d for d in rates if d.src == "p0r0t0" and d.src_port == 3]
    assert up.dst.startswith("p0r0a")
    assert len(rates[up]) == 6
    assert mean_rate(rates[up]) == pytest.approx(10 * MBIT)
    assert mean_utilization(rates[up]) == pytest.approx(0.5)
    # The other direction is p0r0t0's receive counter (zero here).
    (down,) = [d for d in rates if d.dst == "p0r0t0" and d.dst_port == 3]
    assert mean_rate(rates[down]) == 0.0
    # GPU-facing: a NIC link seen from the ToR; links of unpolled switches are absent.
    assert all("p0r0t0" in (d.src, d.dst) for d in rates)


def test_reader_rejects_an_unknown_version_and_counts_junk() -> None:
    tel = Telemetry()
    parse_line(tel, "not json")
    parse_line(tel, '{"type":"stats","round":0}')  # before any header
    assert tel.bad_lines == 2
    header = header_record(0.0, "f", "p", 0.5, {}, 1)
    with pytest.raises(ValueError, match="version"):
        parse_line(tel, json.dumps({**header, "version": 99}))
    with pytest.raises(ValueError, match="port columns"):
        parse_line(tel, json.dumps({**header, "columns": {**header["columns"], "port": ["x"]}}))


def test_stats_bodies_of_both_openflow_versions_become_the_same_samples() -> None:
    from os_ken.ofproto import ofproto_v1_3_parser as p13
    from os_ken.ofproto import ofproto_v1_5_parser as p15

    from controllers.telemetry import flow_sample, group_sample, port_sample

    port13 = p13.OFPPortStats(3, 10, 20, 1000, 2000, 1, 2, 0, 0, 0, 0, 0, 0, 5, 500_000_000)
    assert port_sample(port13, 3) == PortSample(3, 10, 20, 1000, 2000, 1, 2, 0, 0, 5.5)
    port15 = p15.OFPPortStats(None, 3, 5, 500_000_000, 10, 20, 1000, 2000, 1, 2, 0, 0, [])
    assert port_sample(port15, 3) == port_sample(port13, 3)

    match13 = p13.OFPMatch(eth_type=2048, ipv4_dst="10.1.0.1")
    flow13 = p13.OFPFlowStats(0, 2, 250_000_000, 100, 0, 0, 0, 0, 7, 700, match13, [])
    match15 = p15.OFPMatch(eth_type=2048, ipv4_dst="10.1.0.1")
    stats15 = p15.OFPStats(duration=(2, 250_000_000), packet_count=7, byte_count=700)
    flow15 = p15.OFPFlowDesc(0, 100, 0, 0, 0, 0, 0, match15, stats15, [])
    expected = FlowSample(0, 100, (("eth_type", 2048), ("ipv4_dst", "10.1.0.1")), 7, 700, 2.25)
    assert flow_sample(flow13) == expected
    assert flow_sample(flow15) == expected

    group = p13.OFPGroupStats(
        None, 17, 1, 9, 900, 1, 0, [p13.OFPBucketCounter(4, 400), p13.OFPBucketCounter(5, 500)]
    )
    assert group_sample(group) == GroupSample(17, 9, 900, 1.0, ((4, 400), (5, 500)))


def test_entries_and_buckets_say_which_model_ports_they_output_to() -> None:
    from os_ken.ofproto import ofproto_v1_3 as o13
    from os_ken.ofproto import ofproto_v1_3_parser as p13
    from os_ken.ofproto import ofproto_v1_5_parser as p15

    from controllers.telemetry import bucket_ports, flow_sample

    def model(ofport: int) -> int | None:  # OpenFlow 13 is model port 3; the controller none
        return None if ofport > o13.OFPP_MAX else {13: 3}.get(ofport, ofport)

    match13 = p13.OFPMatch(eth_type=2048, ipv4_dst="10.1.0.1")
    apply = p13.OFPInstructionActions(
        o13.OFPIT_APPLY_ACTIONS,
        [p13.OFPActionOutput(13, 0), p13.OFPActionOutput(o13.OFPP_CONTROLLER, 0)],
    )
    flow13 = p13.OFPFlowStats(0, 2, 250_000_000, 100, 0, 0, 0, 0, 7, 700, match13, [apply])
    assert flow_sample(flow13, model).ports == (3,)
    to_group = p13.OFPInstructionActions(o13.OFPIT_APPLY_ACTIONS, [p13.OFPActionGroup(9)])
    grouped = p13.OFPFlowStats(0, 2, 0, 100, 0, 0, 0, 0, 7, 700, match13, [to_group])
    assert (flow_sample(grouped, model).ports, flow_sample(grouped, model).groups) == ((), (9,))
    dropped = p13.OFPFlowStats(0, 2, 0, 900, 0, 0, 0, 0, 7, 700, match13, [])
    assert flow_sample(dropped, model).ports == () and flow_sample(dropped, model).groups == ()

    buckets13 = [
        p13.OFPBucket(1, o13.OFPP_ANY, o13.OFPG_ANY, [p13.OFPActionOutput(13, 0)]),
        p13.OFPBucket(1, o13.OFPP_ANY, o13.OFPG_ANY, [p13.OFPActionOutput(4, 0)]),
    ]
    desc13 = p13.OFPGroupDescStats(o13.OFPGT_SELECT, 9, buckets13)
    assert bucket_ports(desc13, model) == ((3,), (4,))
    buckets15 = [
        p15.OFPBucket(bucket_id=0, actions=[p15.OFPActionOutput(13, 0)], properties=[]),
        p15.OFPBucket(bucket_id=1, actions=[p15.OFPActionOutput(4, 0)], properties=[]),
    ]
    desc15 = p15.OFPGroupDescStats(type_=1, group_id=9, buckets=buckets15)
    assert bucket_ports(desc15, model) == ((3,), (4,))


def test_files_written_before_the_outputs_were_recorded_still_read() -> None:
    from controllers.counters import OLD_COLUMNS, check_columns, decode_round

    header = header_record(0.0, "f", "ecmp", 0.5, {"s": 1}, 1)
    check_columns(header)
    header["columns"].update({k: list(v) for k, v in OLD_COLUMNS.items()})
    check_columns(header)
    header["columns"]["flow"] = ["table"]
    with pytest.raises(ValueError, match="flow columns"):
        check_columns(header)
    old = {
        "round": 0,
        "t": 1.0,
        "switches": {
            "s": {
                "dpid": 1,
                "t": 1.0,
                "groups": [[3, 9, 900, 1.5, [[4, 400], [5, 500]]]],
                "flows": [[0, 100, {"ipv4_dst": "10.1.0.1"}, 9, 900, 2.25]],
            }
        },
    }
    s = decode_round(old).switches["s"]
    assert s.flows[0].ports == () and s.groups[0].bucket_ports == ()
    new = encode_round(
        StatsRound(
            0,
            1.0,
            {
                "s": SwitchSample(
                    "s",
                    1,
                    1.0,
                    (),
                    (GroupSample(3, 9, 900, 1.5, ((4, 400), (5, 500)), ((3,), (4,))),),
                    (
                        FlowSample(
                            0, 100, match_of([("ipv4_dst", "10.1.0.1")]), 9, 900, 2.25, (2,), (3,)
                        ),
                    ),
                )
            },
        )
    )
    again = decode_round(json.loads(json.dumps(new))).switches["s"]
    assert again.flows[0].ports == (2,) and again.flows[0].groups == (3,)
    assert again.groups[0].bucket_ports == ((3,), (4,))
