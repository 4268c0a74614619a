"""What tracing a launch's connections through the switches costs; the traces the tests replay.

    sudo .venv/bin/python benchmarks/path_trace.py [--fabric astral-small]
        [--collective all-to-all:direct] [--channels 2] [--rounds 5] [--record FILE]

Brings the fabric up under ``ecmp``, starts workers for the collective and runs one small
operation (every connection is then open), and traces every fabric connection
``--rounds`` times as ``astral run`` does after each batch (orchestrator.testbed.tracing:
the kernels' NIC ports by ``ip route get``, then ``ofproto/trace`` over ovs-vswitchd's
control socket), then once more with one ``ovs-appctl`` process per trace, the way it
would go without the socket. The same under ``path-pinned``, where every traced path is
also compared with the one the controller published for its source port, and under
``adaptive``. Prints, per
policy, the seconds per round (all, and the switches' walk alone), the traces and the
connections.

``--record FILE`` writes the transcript tests/unit/test_pathtrace.py replays: for a few
connections of each policy, every request the walk sent to ovs-vswitchd and the reply, the
``dpif/show`` it read, and a few traces of what cannot be followed, made on purpose on
this fabric and undone: a destination no switch has an entry for (drop), a packet whose
chosen uplink is the port it came in by (skipped), a ToR allowed OpenFlow 1.3 only,
whose select groups the controller then installs with Open vSwitch's default selection
method, dp_hash (a trace cannot follow it), and under ``adaptive`` a connection it does not
track (its catch entry forwards the packet and copies it to the controller).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import asdict, replace
from pathlib import Path
from statistics import median
from typing import Any

from orchestrator.emulation.pathtrace import (
    AppctlControl,
    Control,
    PortTable,
    TracedPath,
    TraceRequest,
    control_socket,
    flow_text,
    open_control,
    trace_paths,
)
from orchestrator.emulation.wiring import intf_name
from orchestrator.testbed.testbed import Testbed
from orchestrator.testbed.tracing import trace_requests
from orchestrator.worker.outcome import ConnectionInfo
from orchestrator.worker.spec import CollectiveTest, LaunchOptions
from topologies.fivetuple import FiveTuple

PROGRAMMED_WAIT = 20.0  # seconds for the controller to reprogram a bridge
POLICIES = ("ecmp", "path-pinned", "adaptive")
UNUSED_PORT = 60999  # a source port no connection of the benchmark has: adaptive tracks none


class Recorder:
    """A :class:`Control` that keeps every request and reply."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self.name = control.name
        self.calls: list[dict[str, Any]] = []

    def call(self, method: str, params: Sequence[str]) -> str:
        try:
            result = self.control.call(method, params)
        except Exception as error:
            self.calls.append({"method": method, "params": list(params), "error": str(error)})
            raise
        self.calls.append({"method": method, "params": list(params), "result": result})
        return result

    def close(self) -> None:
        self.control.close()


def request_dict(r: TraceRequest) -> dict[str, Any]:
    return {**asdict(r), "five_tuple": asdict(r.five_tuple)}


def measure(bed: Testbed, connections: list[ConnectionInfo], rounds: int) -> dict[str, Any]:
    """``rounds`` tracings over the socket, one with ovs-appctl."""
    figures = [bed.trace_paths(connections) for _ in range(rounds)]
    assert bed.launcher is not None
    requests = trace_requests(bed.emulation, bed.description, bed.launcher.workers, connections)
    began = time.monotonic()
    appctl = trace_paths(bed.description, requests, AppctlControl(bed.emulation))
    appctl_seconds = time.monotonic() - began
    last = figures[-1]
    return {
        "connections": len(last.paths),
        "traces": last.traces,
        "outcomes": dict(last.outcomes()),
        "seconds": [round(f.seconds, 4) for f in figures],
        "switch_seconds": [round(f.switch_seconds, 4) for f in figures],
        "via": last.via,
        "appctl_switch_seconds": round(appctl_seconds, 4),
        "appctl_traces": sum(p.traces for p in appctl),
        "same_with_appctl": [p.hops for p in appctl]
        == [last.paths[r.five_tuple].hops for r in requests],
        "paths": last.paths,
        "requests": requests,
    }


def pick(
    requests: list[TraceRequest], paths: dict[FiveTuple, Any], count: int
) -> list[TraceRequest]:
    """A few requests of different path lengths (same ToR, across the pod, across pods)."""
    by_length: dict[int, list[TraceRequest]] = {}
    for r in requests:
        by_length.setdefault(len(paths[r.five_tuple].hops), []).append(r)
    out: list[TraceRequest] = []
    while len(out) < count and any(by_length.values()):
        for length in sorted(by_length):
            if by_length[length] and len(out) < count:
                out.append(by_length[length].pop(0))
    return out


def record_walks(bed: Testbed, requests: list[TraceRequest]) -> dict[str, Any]:
    with closing(open_control(bed.emulation)) as control:
        recorder = Recorder(control)
        paths = trace_paths(bed.description, requests, recorder)
    return {
        "requests": [request_dict(r) for r in requests],
        "calls": recorder.calls,
        "found": [[list(asdict(h).values()) for h in p.hops] for p in paths],
    }


def wait_for(check: Any, timeout: float = PROGRAMMED_WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def record_cases(
    bed: Testbed, requests: list[TraceRequest], paths: dict[FiveTuple, TracedPath]
) -> dict[str, Any]:
    """The traces of what cannot be followed (the module docstring), each undone."""
    cases: dict[str, Any] = {}
    crossing = next(r for r in requests if len(paths[r.five_tuple].hops) > 3)
    bogus = replace(crossing, five_tuple=replace(crossing.five_tuple, dst_ip="10.99.99.99"))
    cases["drop"] = record_walks(bed, [bogus])
    hops = paths[crossing.five_tuple].hops
    tor, uplink = hops[1].node, hops[1].out_port
    assert uplink is not None
    with closing(open_control(bed.emulation)) as control:
        ports = PortTable.parse(control.call("dpif/show", []))
        flow = flow_text(crossing, ports.ports[intf_name(tor, uplink)].ofport, None)
        cases["input-port"] = {
            "bridge": tor,
            "flow": flow,
            "result": control.call("ofproto/trace", [tor, flow]),
            "dpif_show": control.call("dpif/show", []),
        }

    def now() -> TracedPath:
        with closing(open_control(bed.emulation)) as control:
            return trace_paths(bed.description, [crossing], control)[0]

    subprocess.run(["ovs-vsctl", "set", "Bridge", tor, "protocols=OpenFlow13"], check=True)
    try:
        if not wait_for(lambda: "dp_hash" in now().reason):
            raise SystemExit(f"{tor} got no dp_hash groups in {PROGRAMMED_WAIT:g} s")
        cases["openflow13"] = record_walks(bed, [crossing])
    finally:
        subprocess.run(
            ["ovs-vsctl", "set", "Bridge", tor, "protocols=OpenFlow13,OpenFlow15"], check=True
        )
        if not wait_for(lambda: now().complete):
            raise SystemExit(f"{tor} was not programmed again in {PROGRAMMED_WAIT:g} s")
    return cases


def report(policy: str, figures: dict[str, Any], rounds: int) -> str:
    line = (
        f"{policy:<12} {figures['connections']} connections, {figures['traces']} traces, "
        f"outcomes {figures['outcomes']}: via the {figures['via']} "
        f"{median(figures['seconds']):.3f} s a tracing (median of {rounds}: "
        f"{figures['seconds']}), the switches' walk {median(figures['switch_seconds']):.3f} s "
        f"of it; with ovs-appctl per trace the walk took {figures['appctl_switch_seconds']:.3f} "
        f"s ({figures['appctl_traces']} traces, same paths: {figures['same_with_appctl']})"
    )
    if "differ_from_plan" in figures:
        line += f"; paths that differ from the published one: {figures['differ_from_plan']}"
    return line


def differ_from_plan(
    figures: dict[str, Any], connections: list[ConnectionInfo], bed: Testbed
) -> int:
    """Traced paths whose nodes are not those of the path chosen for the connection."""
    chosen = bed.pinning.chosen if bed.pinning is not None else {}
    flows = {c.five_tuple: (c.src, c.dst, c.channel) for c in connections}
    return sum(
        1
        for r in figures["requests"]
        if figures["paths"][r.five_tuple].nodes != chosen[flows[r.five_tuple]].nodes
    )


def record_catch(
    bed: Testbed, requests: list[TraceRequest], paths: dict[FiveTuple, TracedPath]
) -> dict[str, Any]:
    """Under adaptive, the walk of a connection the controller does not track (yet), on a
    ToR with a choice: its catch entry forwards the packet and copies it to the
    controller."""
    crossing = next(r for r in requests if len(paths[r.five_tuple].hops) > 3)
    untracked = replace(crossing, five_tuple=replace(crossing.five_tuple, src_port=UNUSED_PORT))
    return record_walks(bed, [untracked])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fabric", default="astral-small")
    parser.add_argument("--collective", default="all-to-all:direct", help="OP:ALGORITHM")
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--record", type=Path, default=None, metavar="FILE")
    args = parser.parse_args()
    op, algorithm = args.collective.split(":")
    record: dict[str, Any] = {"sessions": {}}
    with Testbed(args.fabric, policy="ecmp", ready_timeout=120, lock_wait=900) as bed:
        print(f"# {args.fabric} up ({bed.run_dir}), {control_socket()}", file=sys.stderr)
        with closing(open_control(bed.emulation)) as control:
            record["ovs"] = control.call("version", []).strip()
        for policy in POLICIES:
            bed.use_policy(policy)
            options = LaunchOptions(iterations=1, warmup=0, channels=args.channels)
            with bed.launch(options=options, collectives=[(op, algorithm)]) as launcher:
                result = launcher.run([CollectiveTest(op, algorithm, 65536)])
                result.raise_for_failure()
                connections = [c for c in result.connections if c.link == "fabric"]
                figures = measure(bed, connections, args.rounds)
                if policy == "path-pinned":
                    figures["differ_from_plan"] = differ_from_plan(figures, connections, bed)
                print(report(policy, figures, args.rounds))
                if args.record is None:
                    continue
                session = record_walks(bed, pick(figures["requests"], figures["paths"], 4))
                record["sessions"][policy] = session
                if policy == "ecmp":
                    record["cases"] = record_cases(bed, figures["requests"], figures["paths"])
                if policy == "adaptive":
                    record["cases"]["catch"] = record_catch(
                        bed, figures["requests"], figures["paths"]
                    )
    if args.record is not None:
        record["fabric"] = args.fabric
        record["recorded"] = time.strftime("%Y-%m-%d", time.gmtime())
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"# recorded {args.record}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
