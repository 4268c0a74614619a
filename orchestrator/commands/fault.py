"""``astral fault``: break a fabric held by ``astral up`` by hand, and mend it.

    astral fault apply link-down p0r0t0-p0r0a1          until `astral fault clear`
    astral fault apply link-slow p0r0a1-c2 --rate 0.25 --duration 30s
                                                        (waits, then clears it)
    astral fault apply link-loss p0r1t1>p0r1a0 --probability 0.02
    astral fault apply link-flap p0r0t0-p0r0a1 --period 2s     (flaps until Ctrl-C or
                                                        --duration, then clears it)
    astral fault apply switch-down p1r1t0
    astral fault apply blackhole p0r0a0 --destination p1s1g0
    astral fault apply controller-crash
    astral fault list
    astral fault clear 103          (or several ids, or --all; ids by hand start at 101)

Ids are never reused while the fabric is up: each is above every id its fault log
(faults.jsonl) has seen. Faults on the same component compose: clearing one leaves what
the others still active imply (a link slowed by two runs at the slower rate, a port that
another fault holds down stays down), whoever applied them.

The same code a run's scheduled faults use (orchestrator/testbed/faults.py), on the fabric
found in ``/run/astral/runs/`` (a record whose status is ``up`` and whose owner runs; with
several, ``--run ID`` picks one). Every fault and what it adds go into that run's fault
record first, so ``astral fault list`` (from any terminal) shows them, and the fabric's
teardown, or ``astral clean`` after a kill -9, removes them. A straggler needs a run's
workers and is refused here: it belongs in an experiment's ``faults:``.

Clearing an id twice (``clear 103 103``, or a fault cleared before) undoes it once and
says so for the rest.

Exit status: 0; 2 for a bad fault or an id that was never applied on this fabric (a
straggler too; nothing is changed); 4 when no fabric is up or a command failed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from orchestrator.cluster.held import held_executor
from orchestrator.emulation.executor import NamespaceExecutor
from orchestrator.emulation.faults import FabricFaults
from orchestrator.emulation.state import (
    HAND_IDS,
    FaultEntry,
    FaultRecord,
    RunState,
    live_runs,
)
from orchestrator.run.experiment import _ExperimentReader
from orchestrator.testbed.faults import FaultInjector, RecordedController, spec_of
from orchestrator.testbed.faultschedule import FAULT_LOG, FaultLog
from orchestrator.testbed.faultspec import (
    FLAP_DOWN,
    FLAP_UP,
    KINDS,
    Action,
    FaultSpec,
    next_flap,
    parse_fault,
)
from topologies.description import FabricDescription
from topologies.errors import ConfigError, EmulationError

SOURCE = "astral fault"


class FaultUsageError(ConfigError):
    """A fault ``astral fault`` cannot take as given (exit status 2, nothing changed)."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "fault",
        help="apply and clear faults on a fabric held by astral up",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", metavar="ID", help="the run (record id) when several are up")
    parser.add_argument(
        "--state-dir", type=Path, default=None, help="where run records live (default /run/astral)"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    apply = actions.add_parser("apply", help="apply a fault now")
    apply.add_argument("kind", choices=list(KINDS), metavar="KIND", help=", ".join(KINDS))
    apply.add_argument("target", nargs="?", help="a link (A-B, or A>B one way), a switch, a GPU")
    apply.add_argument("--rate", type=float, help="link-slow: the fraction of the rate left")
    apply.add_argument("--probability", type=float, help="link-loss: drop probability")
    apply.add_argument("--period", help="link-flap: down and up once per PERIOD (e.g. 2s)")
    apply.add_argument("--destination", help="blackhole: the GPU whose traffic is dropped")
    apply.add_argument("--delay", help="straggler (refused here: it needs a run's workers)")
    apply.add_argument("--duration", help="clear it after DURATION (e.g. 30s), waiting until then")
    apply.set_defaults(func=run_apply)
    listing = actions.add_parser("list", help="the active faults")
    listing.set_defaults(func=run_list)
    clear = actions.add_parser("clear", help="undo faults")
    clear.add_argument("ids", nargs="*", type=int, metavar="ID")
    clear.add_argument("--all", action="store_true", help="every active fault")
    clear.set_defaults(func=run_clear)


def say(message: str) -> None:
    print(f"astral: {message}", flush=True)


# --- the fabric ------------------------------------------------------------------------------


class HeldFabric:
    """The fabric of one live run record, and the fault machinery on it."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.description = FabricDescription.read(state.run_dir / "fabric.json")
        shells = {
            name: (host.pid, host.starttime)
            for name, host in state.hosts.items()
            if host.pid is not None
        }
        self.record = FaultRecord(state.run_dir)
        self.injector = FaultInjector(
            FabricFaults(
                held_executor(state.run_dir, NamespaceExecutor(shells)),
                self.description,
                openflow=True,
            ),
            self.description,
            self.record,
            state.run_id,
            controller=RecordedController(state),
            owner=SOURCE,
        )
        self.log = FaultLog(state.run_dir / FAULT_LOG)

    def spec(self, fault_id: int, raw: dict[str, Any]) -> FaultSpec:
        """A fault written as an experiment's entry would be, validated the same way."""
        read = _ExperimentReader(SOURCE)
        return parse_fault(read, raw, self.description.fabric, "fault", fault_id)

    def logged_ids(self) -> set[int]:
        """Every fault id this fabric's fault log has seen (applied, undone or both)."""
        ids: set[int] = set()
        try:
            lines = self.log.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return ids
        for line in lines:
            try:
                value = json.loads(line).get("id")
            except (ValueError, AttributeError):
                continue  # a line cut short by a kill: no id to keep apart from
            if isinstance(value, int):
                ids.add(value)
        return ids

    def next_id(self) -> int:
        """An id no fault on this fabric has had: above the active ones (the record's
        :meth:`~FaultRecord.next_id`) and above every one the log has seen, so that a
        cleared fault's id is not given again while the fabric is up."""
        logged = [i for i in self.logged_ids() if i > HAND_IDS]
        return max([self.record.next_id(), *(i + 1 for i in logged)])

    def clear(self, entry: FaultEntry) -> str:
        fault = spec_of(entry, self.description.fabric, _ExperimentReader(SOURCE))
        detail = self.injector.undo(fault)
        self.log.write(fault, "undone", time.time(), time.time(), detail)
        return detail


def held_fabric(args: argparse.Namespace) -> HeldFabric:
    runs = live_runs(args.state_dir)
    if args.run is not None:
        runs = [r for r in runs if r.run_id == args.run]
        if not runs:
            raise EmulationError(f"no fabric is up with run id {args.run}")
    if not runs:
        raise EmulationError("no fabric is up: start one with `astral up` (in another terminal)")
    if len(runs) > 1:
        names = ", ".join(r.run_id for r in runs)
        raise EmulationError(f"several fabrics are up ({names}): choose one with --run ID")
    return HeldFabric(runs[0])


# --- the actions -----------------------------------------------------------------------------


APPLY_TRIES = 5  # another `astral fault apply` may take the same id meanwhile


def run_apply(args: argparse.Namespace) -> int:
    if args.kind == "straggler":
        raise FaultUsageError(
            SOURCE,
            "kind",
            "a fault astral fault can apply: a straggler needs a run's workers "
            "(use it in an experiment's faults:)",
            args.kind,
        )
    raw: dict[str, Any] = {"kind": args.kind}
    for key in ("target", "rate", "probability", "period", "delay", "destination", "duration"):
        value = getattr(args, key)
        if value is not None:
            raw[key] = value
    fabric = held_fabric(args)
    for attempt in range(APPLY_TRIES):
        fault = fabric.spec(fabric.next_id(), raw)
        began = time.time()
        try:
            detail = fabric.injector.apply(fault)
            break
        except ValueError as error:  # FaultRecord.add: the id was taken meanwhile
            if "already active" not in str(error):
                raise
            if attempt == APPLY_TRIES - 1:
                raise EmulationError(
                    f"could not record fault {fault.id}: other `astral fault` commands "
                    "keep taking its id; try again"
                ) from None
    fabric.log.write(fault, "applied", time.time(), began, detail)
    print(f"fault {fault.id} applied: {fault.describe()} ({detail})", flush=True)
    if fault.kind != "link-flap" and fault.duration is None:
        print(f"clear it with: astral fault clear {fault.id}")
        return 0
    try:
        if fault.kind == "link-flap":
            assert fault.period is not None
            flap(fabric, fault, began)
        else:
            assert fault.duration is not None
            time.sleep(max(0.0, began + fault.duration - time.time()))
    except KeyboardInterrupt:
        say("interrupted: clearing it")
    finally:
        for entry in fabric.record.entries():
            if entry.id == fault.id:
                print(f"fault {fault.id} cleared ({fabric.clear(entry)})")
    return 0


def flap(fabric: HeldFabric, fault: FaultSpec, began: float) -> None:
    """Down for half a period (the apply was the first down), up for the other half, and
    so on until the duration ends (if it has one); the same actions the scheduler takes
    (orchestrator.testbed.faultspec.next_flap), each logged."""
    action: Action | None = Action(0.0, fault.id, FLAP_DOWN, 1)
    end = None if fault.duration is None else began + fault.duration
    while action is not None:
        action = next_flap(fault, action)
        if action is None:
            break
        assert action.offset is not None
        due = began + action.offset
        time.sleep(max(0.0, due - time.time()))
        up = action.what == FLAP_UP
        detail = fabric.injector.flap(fault, up)
        event = "undone" if up else "applied"
        fabric.log.write(fault, event, time.time(), due, f"flap {action.n}: {detail}")
    if end is not None:
        time.sleep(max(0.0, end - time.time()))


def run_list(args: argparse.Namespace) -> int:
    fabric = held_fabric(args)
    entries = fabric.record.entries()
    if not entries:
        print(f"no active faults on run {fabric.state.run_id}")
        return 0
    print(f"active faults on run {fabric.state.run_id}:")
    for entry in entries:
        applied = time.strftime("%H:%M:%S", time.localtime(entry.applied)) if entry.applied else "-"
        params = " ".join(f"{k}={v}" for k, v in entry.params.items() if k != "at")
        print(f"  {entry.id:>3}  {entry.kind:<16} {entry.target:<20} {params:<28} "
              f"since {applied} ({entry.owner})")  # fmt: skip
        for resource in entry.resources:
            print(f"         {resource.label()}")
    return 0


def run_clear(args: argparse.Namespace) -> int:
    """Undo each named fault once: ids are deduplicated, one already cleared (before, or
    by another terminal meanwhile) is reported and skipped, an id never applied on this
    fabric is refused before anything is undone."""
    fabric = held_fabric(args)
    entries = {e.id: e for e in fabric.record.entries()}
    if args.all:
        wanted = sorted(entries, reverse=True)
    elif args.ids:
        wanted = list(dict.fromkeys(args.ids))
        seen = fabric.logged_ids()
        unknown = [i for i in wanted if i not in entries and i not in seen]
        if unknown:
            active = ", ".join(map(str, sorted(entries))) or "none"
            raise FaultUsageError(
                SOURCE, "clear", f"the id of a fault on this fabric (active: {active})", unknown[0]
            )
    else:
        raise EmulationError("name the faults to clear (astral fault list shows them) or --all")
    if not wanted:
        print("no active faults")
    for fault_id in wanted:
        entry = next((e for e in fabric.record.entries() if e.id == fault_id), None)
        if entry is None:
            print(f"fault {fault_id} is not active (already cleared): nothing to undo")
            continue
        print(f"fault {fault_id} cleared ({fabric.clear(entry)})")
    return 0
