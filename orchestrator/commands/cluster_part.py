"""One machine's part of a cluster run: ``python -m orchestrator.commands.cluster_part``.

The machine holding a cluster run (orchestrator.cluster.emulation) starts this on every
other machine over SSH and speaks with it in JSON lines: it sends one line with the whole
fabric's description, this machine's share (orchestrator.emulation.share) and the run's
policy; this process brings the share up as an ordinary
:class:`~orchestrator.emulation.network.Emulation` (its own run record under this
machine's state directory, its own lock, its own teardown) and answers::

    {"event": "up", "run_id": ..., "run_dir": ..., "shells": {gpu: [pid, starttime]},
     "datapath": ..., "timings": {...}, "time": <epoch seconds here>}

Then it obeys ``{"cmd": "cpu", "since": t}`` (the CPU samples it took since ``t``, in its
own clock: the saturation flag of its share, orchestrator.testbed.cpuload), ``{"cmd":
"probe", "timeout": s}`` (probe from its GPUs to every GPU of the
fabric: ``{"event": "probed", "rounds": n}``), ``{"cmd": "clock"}`` (``{"event": "clock",
"time": ...}``, for the clock offsets) and ``{"cmd": "stop"}``. Any failure is
``{"event": "error", "message": ...}``. At ``stop``, at end of file on stdin (the session
closed: the run's side is gone, whatever happened to it) and at SIGTERM it tears its share
down and reports ``{"event": "down", "report": [...]}``. A part killed with SIGKILL leaves
its record for ``astral clean`` on this machine, as any run does.

It is a command of its own (not one of ``astral``'s: nobody types it) because it is a
process's entry point, like ``astral``, and reads this machine's calibration for the load
check of its share.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from dataclasses import asdict
from typing import IO, Any

from orchestrator.calibration.capacity import load_calibration
from orchestrator.cluster.tunnelprobe import PROBE_DEVICE, device_commands, run_all
from orchestrator.emulation.doctor import CheckResult, Demand, evaluate, gather_facts
from orchestrator.emulation.executor import run_local
from orchestrator.emulation.network import Emulation, Terminated
from orchestrator.emulation.pathtrace import control_socket
from orchestrator.emulation.share import Share
from orchestrator.emulation.state import proc_starttime
from orchestrator.testbed.cpuload import CpuSampler
from orchestrator.worker import rto
from topologies.description import FabricDescription
from topologies.errors import AstralError


def _say(out: IO[str], event: str, message: str | None = None, **fields: Any) -> None:
    if message is not None:
        fields["message"] = message
    out.write(json.dumps({"event": event, **fields}) + "\n")
    out.flush()


def _doctor(description: FabricDescription, share: Share) -> list[CheckResult]:
    """``astral doctor``'s checks of this machine against its share (root, Open vSwitch
    and its datapath, the tools, the Python packages, cores and memory for this share's
    GPUs and switches, the minimum RTO)."""
    fabric = description.fabric
    demand = Demand.of(fabric, share.nodes, f"{fabric.name} ({share.machine}'s share)")
    return evaluate(gather_facts(rto.probe), demand)


def _calibration(packet_scale: int = 1) -> dict[str, Any] | None:
    """This machine's emulator capacity (``astral calibrate``) at the share's packet size
    (orchestrator.calibration.capacity: Calibration.at_packet_scale), for the load check
    of its share; None where it has none or it cannot be read."""
    try:
        calibration = load_calibration()
    except AstralError:
        return None
    if calibration is None:
        return None
    calibration = calibration.at_packet_scale(packet_scale)
    return {
        "capacity_bps": calibration.capacity_bps,
        "safe_bps": calibration.safe_bps,
        "recipe": calibration.recipe,
        "measured_at": calibration.measured_at,
    }


def _tunnel_probe(
    emulation: Emulation, command: dict[str, Any], probes: list[subprocess.Popen[bytes]]
) -> tuple[str, ...]:
    """This machine's end of a tunnel probe (orchestrator.cluster.tunnelprobe): the probe
    device and an iperf3 server on its address, both recorded first."""
    state = emulation.state
    assert state is not None and state.link_group is not None
    state.add_interfaces([PROBE_DEVICE])
    failed = run_all(
        device_commands(
            state.link_group,
            int(command["vni"]),
            str(command["local"]),
            str(command["remote"]),
            str(command["address"]),
            int(command["udp_port"]),
        )
    )
    if failed is not None:
        return ("error", f"the tunnel probe's device: {failed.stderr.strip()}")
    address = str(command["address"]).split("/")[0]
    server = subprocess.Popen(
        ["iperf3", "-s", "-1", "-B", address],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    state.add_process("tunnel-probe-iperf3", server.pid, "worker")
    probes.append(server)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        listening = run_local(["ss", "-ltnH", "src", address]).stdout
        if listening.strip():
            return ("tunnel-probe-ready",)
        time.sleep(0.05)
    return ("error", "the tunnel probe's iperf3 server did not listen in 10 s")


def _end_tunnel_probe(probes: list[subprocess.Popen[bytes]]) -> None:
    for server in probes:
        if server.poll() is None:
            server.terminate()
        server.wait()
    if probes:
        run_local(["ip", "link", "del", "dev", PROBE_DEVICE])
    probes.clear()


def serve(inp: IO[str], out: IO[str]) -> int:
    first = inp.readline()
    if not first:
        return 0
    try:
        order = json.loads(first)
        description = FabricDescription.from_dict(order["description"])
        share = Share.from_dict(order["share"])
    except (ValueError, KeyError, TypeError) as err:
        _say(out, "error", message=f"a part's order could not be read: {err}")
        return 2
    emulation = Emulation(
        description,
        policy=str(order.get("policy", "shortest")),
        ready_timeout=float(order.get("ready_timeout", 60.0)),
        share=share,
        log=lambda line: print(line, file=sys.stderr, flush=True),
        lock_wait=float(order.get("lock_wait", 0.0)),
    )
    status = 0
    probes: list[subprocess.Popen[bytes]] = []
    doctor = _doctor(description, share)
    failed = [r for r in doctor if not r.ok]
    if failed:
        lines = "; ".join(
            f"{r.name}: {r.detail} ({r.fix})" if r.fix else f"{r.name}: {r.detail}" for r in failed
        )
        _say(
            out, "error", message=f"astral doctor says this machine cannot hold its share: {lines}"
        )
        return 3
    sampler = CpuSampler()  # this machine's CPU, for the saturation flag there
    try:
        emulation.start()
        sampler.start()
        shells = {
            gpu: [host.pid, proc_starttime(host.pid)] for gpu, host in emulation.hosts.items()
        }
        assert emulation.fitted_recipe is not None
        packet_scale = emulation.fitted_recipe.packet_scale
        _say(
            out,
            "up",
            run_id=emulation.state.run_id if emulation.state else None,
            run_dir=str(emulation.run_dir),
            shells=shells,
            datapath=emulation.datapath.describe() if emulation.datapath else None,
            timings=emulation.timings,
            control=str(control_socket() or ""),
            calibration=_calibration(packet_scale),
            doctor=[f"{r.verdict.value} {r.name}: {r.detail}" for r in doctor],
            time=time.time(),
        )
        for line in inp:
            command = json.loads(line)
            if command.get("cmd") == "stop":
                break
            if command.get("cmd") == "clock":
                _say(out, "clock", time=time.time())
            elif command.get("cmd") == "cpu":
                since = float(command.get("since", 0.0))
                taken = [asdict(x) for x in sampler.snapshot() if x.t >= since]
                _say(out, "cpu", samples=taken)
            elif command.get("cmd") == "tunnel-probe":
                _say(out, *_tunnel_probe(emulation, command, probes))
            elif command.get("cmd") == "tunnel-probe-done":
                _end_tunnel_probe(probes)
                _say(out, "tunnel-probe-done")
            elif command.get("cmd") == "probe":
                try:
                    rounds = emulation.probe(float(command.get("timeout", 60.0)))
                    _say(out, "probed", rounds=rounds)
                except AstralError as err:
                    _say(out, "error", message=str(err))
    except (AstralError, ValueError) as err:
        _say(out, "error", message=str(err))
        status = 1
    except Terminated as signal_:
        status = signal_.exit_status
    except KeyboardInterrupt:
        status = 130
    finally:
        sampler.stop()
        _end_tunnel_probe(probes)
        report = emulation.stop()
        with contextlib.suppress(BrokenPipeError, OSError):
            _say(out, "down", report=report.lines(), errors=report.errors)
    return status


def main() -> int:
    return serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
