"""``astral up [FILE]``: bring a fabric up in Mininet, check it, keep it, tear it down.

    astral up                         default fabric (preset astral-small) until Ctrl-C
    astral up rail-only-small         a preset by name, or any fabric file
    astral up --hold 60               tear down after 60 s (0: right after the check)
    astral up --cli                   Mininet's CLI; exiting it tears down
    astral up --cli --keep-open       ... and after the CLI, stay up until Ctrl-C
    astral up --live [--hold 60]      the live view while it holds (links, faults, alerts;
                                      the controller polls the counters for it)
    astral up --on lab1 --hold 60     on a machine of the inventory (docs/remote.md)
    astral up --cluster localhost,lab2
                                      one fabric over several machines (docs/cluster.md)

Before bring-up, the run records of earlier runs are read: what an unfinished one left is
cleaned (each said on stderr), and one that cannot be read is named on stderr with why (what
its run left is unknown: ``astral clean`` reports it too), never skipped in silence.

It returns only once every GPU reaches every other one (orchestrator.emulation.readiness), prints a
summary (switches per tier, hosts, links, datapath, rate scale, controller, timings, run
directory) and a line starting ``ready:``, then holds the fabric. While it holds, the run
directory's ``fabric.json`` describes the fabric and ``state.json`` names every GPU
shell's pid (``mnexec -a PID``/``nsenter -t PID -n`` enter a GPU). Ctrl-C, SIGTERM or
SIGHUP tear everything down; after a kill -9, ``astral clean`` does.

Exit status: 0, or 130 after Ctrl-C, 143 after SIGTERM (128 + signal); errors as in
topologies.errors (3 environment, 4 emulation, 5 another run holds the lock).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from controllers.policies import default_registry as policy_registry
from orchestrator.cluster.emulation import ClusterEmulation, cluster_of
from orchestrator.commands.remote import add_on_arguments, refuse, run_on
from orchestrator.emulation.network import Emulation, Terminated
from orchestrator.testbed.monitoring import FULL
from topologies.catalog import DEFAULT_PRESET, resolve_fabric
from topologies.errors import ConfigError
from topologies.model import LinkKind, Tier
from topologies.units import format_rate


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "up",
        help="bring a fabric up in Mininet and hold it (Ctrl-C tears down)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "fabric",
        nargs="?",
        default=DEFAULT_PRESET,
        metavar="FILE",
        help="fabric YAML file or preset name (default: astral-small)",
    )
    hold = parser.add_mutually_exclusive_group()
    hold.add_argument(
        "--hold",
        type=float,
        metavar="SECONDS",
        help="tear down after SECONDS (0: as soon as it is ready); default: until Ctrl-C",
    )
    hold.add_argument("--cli", action="store_true", help="open the Mininet CLI")
    parser.add_argument(
        "--live",
        action="store_true",
        help="draw the live view (astral top) while holding: links, faults, alerts",
    )
    parser.add_argument(
        "--keep-open",
        action="store_true",
        help="with --cli: stay up after the CLI exits, until Ctrl-C",
    )
    parser.add_argument(
        "--policy",
        default="shortest",
        help="controller load-balancing policy: "
        + ", ".join(policy_registry().names())
        + ", or NAME:key=value,... with options (default shortest)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long switches may take to be programmed and GPUs to reach each other",
    )
    parser.add_argument(
        "--cluster",
        metavar="MACHINES",
        help="spread the fabric over these machines of the inventory, comma-separated "
        "(localhost: this one; docs/cluster.md)",
    )
    add_on_arguments(parser)
    parser.set_defaults(func=run)


def say(message: str) -> None:
    print(f"astral: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.on:
        return run_there(args)
    path = resolve_fabric(args.fabric)
    if args.live and args.cli:
        raise ConfigError(None, "--live", "either --live or --cli (both draw on the terminal)")
    settings: dict[str, Any] = {
        "policy": args.policy,
        "ready_timeout": args.timeout,
        "log": say,
        # the live view's links come from the counters the controller polls
        "telemetry_interval": FULL.telemetry_interval if args.live else None,
    }
    emulation: Emulation
    if args.cluster:
        if args.on:
            raise ConfigError(None, "--cluster", "either --cluster or --on")
        names = [name.strip() for name in args.cluster.split(",") if name.strip()]
        machines = cluster_of(names, args.inventory)
        emulation = ClusterEmulation(path, machines=machines, **settings)
    else:
        emulation = Emulation(path, **settings)
    try:
        with emulation:
            for line in summary(emulation):
                print(line)
            if isinstance(emulation, ClusterEmulation) and emulation.placement is not None:
                for line in emulation.placement.lines():
                    print(line)
                for probe in emulation.tunnel_probes.values():
                    print(probe.line())
                for line in emulation.doctor_lines():
                    print(line)
                for name, offset in emulation.clock_offsets.items():
                    print(f"clock      {name}: {offset * 1000:+.2f} ms from this machine's")
            assert emulation.description is not None
            gpus = len(emulation.description.fabric.gpus)
            print(
                f"ready: {gpus} GPUs reach each other; run directory {emulation.run_dir}",
                flush=True,
            )
            hold(args, emulation)
            say("tearing down")
    except KeyboardInterrupt:
        say(f"interrupted; {teardown_line(emulation)}")
        return 130
    except Terminated as signal:
        say(f"{signal}; {teardown_line(emulation)}")
        return signal.exit_status
    say(teardown_line(emulation))
    return 0


def run_there(args: argparse.Namespace) -> int:
    """``astral up --on MACHINE``: the same there; Ctrl-C here tears it down there."""
    if args.cli:
        return refuse("--cli needs a terminal there: with --on, use --hold or Ctrl-C")
    argv = ["up", "--policy", args.policy, "--timeout", f"{args.timeout:g}"]
    if args.hold is not None:
        argv += ["--hold", f"{args.hold:g}"]
    return run_on(args, argv, fabric=args.fabric)


def hold(args: argparse.Namespace, emulation: Emulation) -> None:
    if args.cli:
        emulation.cli()
        if not args.keep_open:
            return
    if args.live:
        from orchestrator.monitor.live import watch

        deadline = None if args.hold is None else time.monotonic() + max(0.0, args.hold)
        watch(emulation.run_dir, until=lambda: deadline is not None and time.monotonic() > deadline)
        return
    if args.hold is not None:
        time.sleep(max(0.0, args.hold))
        return
    say("holding the fabric; Ctrl-C tears it down")
    while True:
        time.sleep(3600)


def teardown_line(emulation: Emulation) -> str:
    report = emulation.teardown_report
    seconds = emulation.timings.get("teardown")
    if report is None or seconds is None:
        return "nothing was brought up"
    removed = (
        f"{len(report.bridges)} bridges, {len(report.interfaces)} interfaces, "
        f"{len(report.killed)} processes"
    )
    errors = f"; {len(report.errors)} problems (see above)" if report.errors else ""
    return f"torn down in {seconds:.2f} s ({removed}){errors}"


def _send_buffer_text(emulation: Emulation) -> str:
    if emulation.send_buffer is not None:
        return f", {emulation.send_buffer.describe()}"
    if emulation.send_buffer_problem is not None:
        return f"; WARNING: {emulation.send_buffer_problem}"
    return ""


def summary(emulation: Emulation) -> list[str]:
    """What is up, how it maps to the real fabric, and how long it took."""
    description = emulation.description
    assert description is not None and emulation.datapath is not None
    fabric = description.fabric
    spec = fabric.spec
    tiers = Counter(s.tier for s in fabric.switches.values())
    tier_text = ", ".join(
        f"{tiers[t]} {name}"
        for t, name in (
            (Tier.TOR, "ToR"),
            (Tier.AGG, "agg"),
            (Tier.CORE, "core"),
            (Tier.NVLINK, "NVLink (Linux bridges)"),
        )
        if tiers[t]
    )
    kinds = Counter(link.kind for link in fabric.links)
    link_text = ", ".join(
        f"{kinds[k]} {k.value}" for k in (LinkKind.NIC, LinkKind.TOR_AGG, LinkKind.AGG_CORE,
                                          LinkKind.NVLINK) if kinds[k]
    )  # fmt: skip
    scale = spec.emulation.scale
    nic = spec.speeds.nic
    timings = emulation.timings
    ready = timings.get("programmed", 0.0) + timings.get("reachable", 0.0)
    controller = emulation.controller
    ctl = f"127.0.0.1:{controller.port} (pid {controller.pid})" if controller else "none"
    tso = {True: "on", False: "off", None: "n/a"}[emulation.datapath.tso]
    return [
        f"fabric     {fabric.name} ({fabric.kind}) from {Path(spec.source)}",
        f"switches   {len(fabric.switches)}: {tier_text}",
        f"GPUs       {len(fabric.gpus)} in {len(fabric.servers)} servers, "
        f"{spec.nic_ports} NIC port(s) each"
        + (", forwarding between rails over NVLink" if fabric.gpu_forwarding else ""),
        f"links      {len(fabric.links)}: {link_text}",
        f"datapath   {emulation.datapath.kind} (OVS {emulation.datapath.ovs_version}), "
        f"userspace TSO {tso}" + _send_buffer_text(emulation),
        f"scale      {scale:g}: {format_rate(nic)} real -> {format_rate(nic * scale)} emulated; "
        f"NVLink {format_rate(spec.speeds.nvlink)} -> {format_rate(spec.speeds.nvlink * scale)}",
        f"controller {ctl}, policy {emulation.policy}",
        f"bring-up   {timings.get('total', 0.0) - ready:.2f} s, readiness {ready:.2f} s "
        f"(programmed {timings.get('programmed', 0.0):.2f} s, all pairs reachable "
        f"{timings.get('reachable', 0.0):.2f} s), total {timings.get('total', 0.0):.2f} s",
        f"run        {emulation.run_dir} (fabric.json, state.json, controller.log)",
    ]
