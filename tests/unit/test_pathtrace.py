"""Paths walked through the switches with ofproto/trace, on traces recorded from a real fabric.

tests/unit/data/ovs_traces.json was recorded by ``benchmarks/path_trace.py --record`` on
astral-small (Open vSwitch 3.1.0, userspace datapath): under ``ecmp``, ``path-pinned`` and
``adaptive``, every request four connections' walks sent to ovs-vswitchd's control socket
with its reply, and traces made on that fabric on purpose: a destination no switch has an
entry for, a packet whose chosen uplink is the port it came in by, a ToR allowed OpenFlow
1.3 only (its select groups then use Open vSwitch's default, dp_hash), and under
``adaptive`` a connection it does not track (its catch entry forwards the packet and
copies it to the controller).
The walk is replayed against the recording strictly (the same requests, in order: the
flows it builds, OpenFlow in_ports included, are those that got the recorded replies), and
its paths are checked against what does not come from the traces: the fabric's links, the
shortest distances, the controller's own pinned paths for each source port. The framing of
the control connection is checked on a real Unix socket with the recorded replies cut at
awkward places. Then the records the monitor makes of traced paths.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from controllers.pinning import PinnedPaths
from controllers.routing import RoutingGraph, programmable_switches
from orchestrator.emulation import pathtrace
from orchestrator.emulation.pathtrace import (
    DROPPED,
    TRACED,
    UNKNOWN,
    Hop,
    PortTable,
    TracedPath,
    TraceError,
    TraceRequest,
    VswitchdControl,
    datapath_actions,
    openflow_outputs,
    read_trace,
    trace_paths,
)
from orchestrator.emulation.wiring import intf_name
from orchestrator.monitor import record
from orchestrator.testbed.pinning import Candidate
from orchestrator.testbed.tracing import PathTraces
from orchestrator.worker.outcome import ConnectionInfo
from tests.helpers import REPO, preset_description
from topologies.fivetuple import FiveTuple

RECORDED = json.loads((REPO / "tests" / "unit" / "data" / "ovs_traces.json").read_text())
DESCRIPTION = preset_description(RECORDED["fabric"])
FABRIC = DESCRIPTION.fabric
OPENFLOW = {s.name for s in programmable_switches(FABRIC)}
SESSIONS = RECORDED["sessions"]
CASES = RECORDED["cases"]


class Replay:
    """Answers exactly the recorded requests, in the recorded order (anything else fails)."""

    name = "replay"

    def __init__(self, calls: Sequence[dict[str, Any]]) -> None:
        self.calls = list(calls)
        self.at = 0

    def call(self, method: str, params: Sequence[str]) -> str:
        assert self.at < len(self.calls), f"unrecorded request {method} {list(params)}"
        recorded = self.calls[self.at]
        self.at += 1
        assert (method, list(params)) == (recorded["method"], recorded["params"])
        if "error" in recorded:
            raise TraceError(recorded["error"])
        return str(recorded["result"])

    def close(self) -> None:
        pass

    def done(self) -> bool:
        return self.at == len(self.calls)


def requests(session: dict[str, Any]) -> list[TraceRequest]:
    return [
        TraceRequest(**{**r, "five_tuple": FiveTuple(**r["five_tuple"])})
        for r in session["requests"]
    ]


def replayed(session: dict[str, Any]) -> list[TracedPath]:
    control = Replay(session["calls"])
    paths = trace_paths(DESCRIPTION, requests(session), control)
    assert control.done(), "the walk asked fewer questions than were recorded"
    return paths


def traces(session: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(bridge, text) of every recorded ofproto/trace reply."""
    for call in session["calls"]:
        if call["method"] == "ofproto/trace" and "result" in call:
            yield call["params"][0], call["result"]


def ports_of(session: dict[str, Any]) -> PortTable:
    return PortTable.parse(
        next(c["result"] for c in session["calls"] if c["method"] == "dpif/show")
    )


# -- reading the text --------------------------------------------------------------------


def test_the_port_table_has_every_switch_port_at_its_model_number() -> None:
    """dpif/show of the recorded fabric: every OpenFlow switch's link ends, OpenFlow port =
    model port (what the emulation asks Open vSwitch for), datapath ports all different."""
    table = ports_of(SESSIONS["ecmp"])
    for link in FABRIC.links:
        for node in (link.a, link.b):
            if node in OPENFLOW:
                port = table.ports[intf_name(node, link.port_of(node))]
                assert (port.bridge, port.ofport) == (node, link.port_of(node))
    dp = [p.dp_port for p in table.ports.values()]
    assert None not in dp and len(set(dp)) == len(dp)
    assert {p.bridge for p in table.ports.values()} == OPENFLOW


@pytest.mark.parametrize("policy", sorted(SESSIONS))
def test_each_switchs_output_is_the_bucket_it_chose(policy: str) -> None:
    """Every recorded hop: the port read from the datapath actions is the OpenFlow output
    of the bucket the trace says it used (or of the only entry)."""
    table = ports_of(SESSIONS[policy])
    for bridge, text in traces(SESSIONS[policy]):
        decision = read_trace(text, table, bridge)
        assert decision.outcome == TRACED and decision.interface is not None
        outputs = re.findall(r"^\s*output:(\d+)$", text, re.MULTILINE)
        bucket = re.search(r"-> using bucket (\d+)\n\s*bucket \1\n(?:.*\n)*?\s*output:(\d+)", text)
        expected = int(bucket.group(2)) if bucket else int(outputs[-1])
        assert table.ports[decision.interface].ofport == expected
        assert table.ports[decision.interface].bridge == bridge


def test_datapath_actions_split_between_actions_not_inside_them() -> None:
    last_hop = next(t for _, t in traces(SESSIONS["path-pinned"]) if "set(eth(" in t)
    line = next(x for x in last_hop.splitlines() if x.startswith("Datapath actions: set("))
    rewrite, port = line.removeprefix("Datapath actions: ").rsplit(",", 1)
    assert datapath_actions(last_hop) == [rewrite, port]
    assert rewrite.count(",") == 1 and port.isdigit()  # the comma inside set(...) stays
    assert datapath_actions("no trace here") is None


def test_an_output_to_the_input_port_is_a_drop_not_a_hop() -> None:
    case = CASES["input-port"]
    assert openflow_outputs(case["result"]) == []  # the one output:3 was skipped
    decision = read_trace(case["result"], PortTable.parse(case["dpif_show"]), case["bridge"])
    assert decision.interface is None and decision.outcome == DROPPED
    assert "came in by" in decision.reason


def test_a_dp_hash_select_group_cannot_be_traced() -> None:
    ((bridge, text),) = traces(CASES["openflow13"])
    decision = read_trace(text, ports_of(CASES["openflow13"]), bridge)
    assert decision.interface is None and decision.outcome == UNKNOWN
    assert "dp_hash" in decision.reason and "recirc(" in decision.reason


def test_a_copy_to_the_controller_beside_the_output_is_still_that_output() -> None:
    (bridge, text), *_ = traces(CASES["catch"])
    assert "userspace(" in datapath_actions(text)[0]  # type: ignore[index]
    table = ports_of(CASES["catch"])
    decision = read_trace(text, table, bridge)
    assert decision.outcome == TRACED and decision.interface is not None
    assert table.ports[decision.interface].ofport == int(openflow_outputs(text)[-1])
    (path,) = replayed(CASES["catch"])
    assert path.complete and path.nodes[-1] == requests(CASES["catch"])[0].dst


def test_no_entry_for_the_destination_is_a_drop() -> None:
    ((bridge, text),) = traces(CASES["drop"])
    decision = read_trace(text, ports_of(CASES["drop"]), bridge)
    assert (decision.interface, decision.outcome) == (None, DROPPED)
    assert decision.reason == "no entry sends it anywhere"


def test_a_port_of_another_bridge_is_not_taken_for_this_ones() -> None:
    bridge, text = next(traces(SESSIONS["ecmp"]))
    other = next(s for s in sorted(OPENFLOW) if s != bridge)
    decision = read_trace(text, ports_of(SESSIONS["ecmp"]), other)
    assert decision.outcome == UNKNOWN and f"a port of {bridge}" in decision.reason


# -- the walk ----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", sorted(SESSIONS))
def test_every_walk_goes_gpu_to_gpu_on_links_of_the_fabric(policy: str) -> None:
    graph = RoutingGraph(FABRIC)
    for request, path in zip(requests(SESSIONS[policy]), replayed(SESSIONS[policy]), strict=True):
        assert path.outcome == TRACED and path.reason == ""
        assert path.nodes[0] == request.src and path.nodes[-1] == request.dst
        assert path.hops[0] == Hop(request.src, None, request.nic)
        assert path.traces == len(path.hops) - 2  # one per switch
        for here, there in zip(path.hops, path.hops[1:], strict=False):
            assert here.out_port is not None and there.in_port is not None
            link = next(
                x for x in FABRIC.links_of(here.node) if x.port_of(here.node) == here.out_port
            )
            assert (link.other(here.node), link.port_of(there.node)) == (there.node, there.in_port)
        # a shortest path: what both policies' entries give (one hop closer each time)
        assert len(path.hops) - 2 == graph.distances_to(request.dst)[path.nodes[1]]


def test_every_ecmp_walk_is_the_recorded_one() -> None:
    assert [[list(vars(h).values()) for h in p.hops] for p in replayed(SESSIONS["ecmp"])] == (
        SESSIONS["ecmp"]["found"]
    )


def test_path_pinned_walks_are_the_controllers_paths_for_their_source_ports() -> None:
    pinned = PinnedPaths(DESCRIPTION)
    session = SESSIONS["path-pinned"]
    for request, path in zip(requests(session), replayed(session), strict=True):
        assert request.nic is not None
        expected = pinned.path(request.src, request.dst, request.nic, request.five_tuple.src_port)
        assert list(path.nodes) == expected


def test_a_dropped_walk_keeps_the_hops_up_to_the_switch_that_drops() -> None:
    (path,) = replayed(CASES["drop"])
    assert path.outcome == DROPPED and path.nodes == ("p0s0g0", "p0r0t0")
    assert path.hops[-1].out_port is None
    assert path.reason == "p0r0t0: no entry sends it anywhere"


def test_a_walk_stops_at_a_dp_hash_switch_and_says_so() -> None:
    (path,) = replayed(CASES["openflow13"])
    assert path.outcome == UNKNOWN and len(path.hops) == 2
    assert (
        path.reason.startswith(f"{path.nodes[-1]}: its select group") and "dp_hash" in path.reason
    )


def test_a_walk_without_a_nic_port_or_bridge_is_unknown_not_guessed() -> None:
    session = SESSIONS["ecmp"]
    request = requests(session)[0]
    table = ports_of(session)
    nvlink = TraceRequest(request.five_tuple, request.src, request.dst, None, "by p0s0g0-eth0")
    path = pathtrace.walk(DESCRIPTION, nvlink, Replay([]), table)
    assert (path.outcome, path.reason, path.nodes) == (UNKNOWN, "by p0s0g0-eth0", ("p0s0g0",))
    emptied = PortTable({}, {})  # ovs-vswitchd has no such bridge
    path = pathtrace.walk(DESCRIPTION, request, Replay([]), emptied)
    assert path.outcome == UNKNOWN and "not an Open vSwitch bridge" in path.reason


def test_an_error_reply_ends_the_walk_as_unknown() -> None:
    session = SESSIONS["ecmp"]
    request = requests(session)[0]
    flow = session["calls"][1]["params"]
    control = Replay(
        [{"method": "ofproto/trace", "params": flow, "error": "p0r0t0: unknown bridge"}]
    )
    path = pathtrace.walk(DESCRIPTION, request, control, ports_of(session))
    assert path.outcome == UNKNOWN and path.reason.endswith("unknown bridge")


# -- the control connection --------------------------------------------------------------


def serve(path: Path, replies: list[bytes], chunks: int) -> threading.Thread:
    """A Unix socket that answers each request with the next reply, cut in ``chunks``."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def run() -> None:
        connection, _ = server.accept()
        decoder = json.JSONDecoder()
        buffer = ""
        with connection, server:
            for reply in replies:
                while True:
                    try:
                        request, end = decoder.raw_decode(buffer)
                        buffer = buffer[end:]
                        break
                    except json.JSONDecodeError:
                        buffer += connection.recv(4096).decode()
                body = reply.replace(b'"id": 0', f'"id": {request["id"]}'.encode())
                size = max(1, len(body) // chunks)
                for at in range(0, len(body), size):
                    connection.sendall(body[at : at + size])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_replies_are_read_whole_however_they_arrive(tmp_path: Path) -> None:
    texts = [text + " \u00e9" for _, text in traces(SESSIONS["ecmp"])][:3]  # a 2-byte character
    replies = [json.dumps({"id": 0, "result": t, "error": None}).encode() for t in texts]
    replies.append(
        json.dumps({"id": 0, "result": None, "error": "nosuch: unknown bridge\n"}).encode()
    )
    thread = serve(tmp_path / "ctl", replies, chunks=7)
    with VswitchdControl(tmp_path / "ctl") as control:
        assert [control.call("ofproto/trace", ["b", "f"]) for _ in texts] == texts
        with pytest.raises(TraceError, match=r"^nosuch: unknown bridge$"):
            control.call("ofproto/trace", ["nosuch", "f"])
    thread.join(timeout=5)


def test_a_missing_socket_is_said(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot connect"):
        VswitchdControl(tmp_path / "none.ctl")
    assert pathtrace.control_socket(tmp_path) is None


# -- what the monitor records ------------------------------------------------------------


def connection(request: TraceRequest, src: int, dst: int) -> ConnectionInfo:
    return ConnectionInfo(src, dst, 0, "fabric", request.five_tuple)


def test_an_ecmp_connection_is_recorded_as_traced_instead_of_its_first_hop() -> None:
    request = requests(SESSIONS["ecmp"])[1]
    path = replayed(SESSIONS["ecmp"])[1]
    c = connection(request, 0, 3)
    first_hop = Candidate(0, path.hops[0].out_port or 0, path.nodes[:2])
    (planned,) = record.connection_paths(FABRIC, [c], {(0, 3, 0): first_hop})
    assert {h.source for h in planned[1]} == {record.FIRST_HOP} and len(planned[1]) == 2
    (traced,) = record.connection_paths(FABRIC, [c], {(0, 3, 0): first_hop}, {c.five_tuple: path})
    assert [(h.node, h.in_port, h.out_port) for h in traced[1]] == [
        (h.node, h.in_port, h.out_port) for h in path.hops
    ]
    assert {h.source for h in traced[1]} == {record.TRACED}
    assert record.disagreements(FABRIC, [c], {(0, 3, 0): first_hop}, {c.five_tuple: path}) == []


def test_a_pinned_path_the_trace_confirms_stays_pinned_one_it_contradicts_gives_way() -> None:
    session = SESSIONS["path-pinned"]
    request, path = requests(session)[1], replayed(session)[1]
    c = connection(request, 0, 3)
    published = Candidate(1, request.nic or 0, path.nodes)
    (kept,) = record.connection_paths(FABRIC, [c], {(0, 3, 0): published}, {c.five_tuple: path})
    assert {h.source for h in kept[1]} == {record.PINNED} and len(kept[1]) == len(path.hops)
    assert record.disagreements(FABRIC, [c], {(0, 3, 0): published}, {c.five_tuple: path}) == []
    # the same connection, had the controller published another path for its port
    published_paths = PinnedPaths(DESCRIPTION).paths(request.src, request.dst, request.nic or 0)
    other = next(p for _, p in published_paths if tuple(p) != path.nodes)
    wrong = Candidate(2, request.nic or 0, tuple(other))
    (taken,) = record.connection_paths(FABRIC, [c], {(0, 3, 0): wrong}, {c.five_tuple: path})
    assert {h.source for h in taken[1]} == {record.TRACED}
    assert [h.node for h in taken[1]] == list(path.nodes)
    (said,) = record.disagreements(FABRIC, [c], {(0, 3, 0): wrong}, {c.five_tuple: path})
    assert " ".join(other) in said and " ".join(path.nodes) in said


def test_untraceable_paths_are_recorded_as_far_as_known_and_marked() -> None:
    request = requests(CASES["openflow13"])[0]
    (stuck,) = replayed(CASES["openflow13"])
    (dropped,) = replayed(CASES["drop"])
    c = connection(request, 0, 3)
    (row,) = record.connection_paths(FABRIC, [c], {}, {c.five_tuple: stuck})
    assert [h.node for h in row[1]] == list(stuck.nodes) and row[1][-1].out_port is None
    assert {h.source for h in row[1]} == {record.TRACE_UNKNOWN}
    (row,) = record.connection_paths(FABRIC, [c], {}, {c.five_tuple: dropped})
    assert {h.source for h in row[1]} == {record.TRACE_DROPPED}
    # a pinned path on which the trace only stopped at an unknown choice keeps the plan
    onward = ("p0r0a0", "c0", "p0r1a0", "p0r1t0", request.dst)
    published = Candidate(1, request.nic or 0, (*stuck.nodes, *onward))
    (row,) = record.connection_paths(FABRIC, [c], {(0, 3, 0): published}, {c.five_tuple: stuck})
    assert {h.source for h in row[1]} == {record.PINNED}
    assert record.disagreements(FABRIC, [c], {(0, 3, 0): published}, {c.five_tuple: stuck}) == []


def test_the_summary_counts_outcomes_and_keeps_the_reasons() -> None:
    paths = replayed(SESSIONS["ecmp"]) + replayed(CASES["drop"]) + replayed(CASES["openflow13"])
    tuples = [FiveTuple("10.0.0.1", 1000 + i, "10.1.0.2", 47000) for i in range(len(paths))]
    traced = PathTraces(dict(zip(tuples, paths, strict=True)), 0.5, 0.25, 21, "replay")
    summary = traced.summary()
    assert summary["outcomes"] == {DROPPED: 1, TRACED: 4, UNKNOWN: 1}
    assert traced.incomplete() == 2 and summary["connections"] == 6
    assert summary["problems"][0] == "dropped: p0r0t0: no entry sends it anywhere"
    assert summary["problems"][1].startswith("unknown: p0r0t0: its select group")
