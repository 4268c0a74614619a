"""orchestrator.testbed.traffic's pure parts: what ss, tc and iperf3 print, read back; Jain's index;
link chains; results' summaries. No root."""

from __future__ import annotations

import json

import pytest

from orchestrator.testbed.traffic import (
    Flow,
    FlowResult,
    LinkDirectionLoad,
    TrafficResult,
    chain,
    iperf_report,
    jain,
    parse_qdiscs,
    parse_ss,
)
from topologies.errors import EmulationError

# `ss -tinH state established` in a namespace running an iperf3 client and its server
# (abridged from this machine's output: the client's control and data connections, then the
# server's, IPv4-mapped)
SS = """\
0       0                127.0.0.1:43900          127.0.0.1:5301
\t bbr wscale:9,9 rto:204 rtt:0.018/0.013 bytes_sent:164 bytes_acked:165 bytes_received:4 segs_out:7
0       8792328          127.0.0.1:43904          127.0.0.1:5301
\t bbr wscale:9,9 rto:204 bytes_sent:834273037 bytes_acked:834000670 segs_out:13680
2933421 0       [::ffff:127.0.0.1]:5301  [::ffff:127.0.0.1]:43904
\t bbr wscale:9,9 rto:204 bytes_received:842187474 segs_out:5612 segs_in:13814
0       0       [::ffff:127.0.0.1]:5301  [::ffff:127.0.0.1]:43900
\t bbr wscale:9,9 rto:204 bytes_sent:4 bytes_acked:4 bytes_received:164 segs_out:6
0       0                10.0.1.1:5302          10.0.0.1:51234
\t cubic wscale:9,9 rto:204 bytes_received:1000 segs_out:6
"""


def test_parse_ss_takes_the_data_connection_per_local_port() -> None:
    received = parse_ss(SS)
    assert received[5301] == 842187474  # data connection, not iperf3's control (164)
    assert received[5302] == 1000
    assert received[43900] == 4  # client side: small, and never a server port
    assert 43904 not in received  # sent only: no bytes_received field


def test_parse_ss_empty() -> None:
    assert parse_ss("") == {}


def test_parse_qdiscs_root_bytes_and_all_drops() -> None:
    document = json.dumps(
        [
            {"kind": "htb", "handle": "1:", "dev": "p0r0t0-eth3", "root": True, "bytes": 5000,
             "drops": 1},
            {"kind": "bfifo", "handle": "10:", "dev": "p0r0t0-eth3", "parent": "1:1",
             "bytes": 4990, "drops": 7},
            {"kind": "noqueue", "dev": "lo", "root": True, "bytes": 0, "drops": 0},
        ]
    )  # fmt: skip
    assert parse_qdiscs(document) == {"p0r0t0-eth3": (5000, 8), "lo": (0, 0)}
    assert parse_qdiscs("") == {}


def test_iperf_report() -> None:
    assert iperf_report('{"end": {}}') == {"end": {}}
    with pytest.raises(EmulationError, match="unable to connect"):
        iperf_report('{"error": "unable to connect to server"}')
    with pytest.raises(EmulationError, match="no report"):
        iperf_report("iperf3: error")


def test_jain() -> None:
    assert jain([5.0] * 8) == pytest.approx(1.0)
    assert jain([1.0, 0.0]) == pytest.approx(0.5)
    assert jain([]) == 0.0 and jain([0.0, 0.0]) == 0.0


def test_chain_orders_links_into_a_path() -> None:
    hops = [("t0", "a0"), ("g0", "t0"), ("a0", "c0"), ("c0", "g1")]
    assert chain(hops) == ["g0", "t0", "a0", "c0", "g1"]
    assert chain([("a", "b"), ("c", "d")]) == []  # two pieces
    assert chain([("a", "b"), ("b", "a")]) == []  # a loop
    assert chain([]) == []


def test_result_summaries() -> None:
    flows = [Flow("g0", "g1"), Flow("g2", "g1")]
    links = [
        LinkDirectionLoad("g0-eth1", "g0", "t0", "nic", 20e6, 19e6),
        LinkDirectionLoad("t0-eth3", "t0", "g1", "nic", 20e6, 19.9e6, drops=4),
        LinkDirectionLoad("t0-eth1", "t0", "g0", "nic", 20e6, 0.3e6),  # ACKs
    ]
    result = TrafficResult(
        window_s=5,
        flows=[FlowResult(flows[0], 9e6, 2), FlowResult(flows[1], 9.5e6, 1)],
        links=links,
    )
    assert result.aggregate_bps == 18.5e6 and result.retransmits == 3
    assert result.busiest() is links[1] and links[1].utilization == pytest.approx(0.995)
    assert result.busiest(["tor_agg"]) is None
    assert result.path(5e6) == ["g0", "t0", "g1"]
