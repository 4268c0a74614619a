"""Run the fabric controller: ``python -m controllers --fabric DESC.json --port N ...``.

    python -m controllers --fabric runs/x/fabric.json --policy shortest \\
        --listen-host 127.0.0.1 --port 6653 --status runs/x/controller-status.json \\
        [--log runs/x/controller.log] [--log-level INFO] \\
        [--telemetry runs/x/telemetry.jsonl] [--telemetry-interval 0.5]

Starts os-ken in this process the way os-ken 4.x wants it (it ships no ``osken-manager``):
``os_ken.cfg.CONF(args=[...])`` for os-ken's own options, then what
``AppManager.run_apps`` does, except that our app gets its settings as a constructor
argument (``controllers.app.ControllerSettings``) and that this module, not os-ken, owns
the main thread:

- os-ken's hub is forced to ``native`` (real threads; os-ken 4.x's default). The
  ``eventlet`` hub would need ``eventlet.monkey_patch()`` before anything else is imported,
  and eventlet is deprecated; nothing here needs it.
- Once the OpenFlow listener is bound (checked in /proc: a listening socket of this process
  on the port), the app is told and writes ``"listening": true`` to the status file. If the
  listener thread dies instead (port taken), the process exits with ``EXIT_LISTEN_FAILED``
  (75) so the orchestrator can retry with another port.
- SIGTERM or SIGINT: the apps are closed (the status file says ``"state": "stopped"``), then
  the process exits 0 with ``os._exit``: os-ken's native listener and per-switch threads block
  in ``accept``/``recv`` and cannot be stopped; exiting closes their sockets. A second signal
  exits at once.

Two os-ken apps run in this process: ``controllers.app.FabricController`` (programs the
switches) and ``controllers.telemetry.TelemetryMonitor`` (polls their counters; idle unless
``--telemetry`` is given or the policy reacts to load; format in docs/telemetry.md).

Exit statuses: ``controllers.status.EXIT_*``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from controllers.events import EVENTS_NAME, EventsHandler
from controllers.status import EXIT_CONFIG, EXIT_CRASHED, EXIT_LISTEN_FAILED, EXIT_OK
from topologies.errors import AstralError

LOG = logging.getLogger("controllers")
LISTEN_TIMEOUT = 15.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m controllers",
        description="OpenFlow 1.3 controller (os-ken) for an emulated Astral fabric.",
    )
    parser.add_argument("--fabric", required=True, type=Path, help="generated fabric description")
    parser.add_argument("--policy", default="shortest", help="load-balancing policy")
    parser.add_argument("--listen-host", default="127.0.0.1", help="OpenFlow listen address")
    parser.add_argument("--port", type=int, default=6653, help="OpenFlow listen port")
    parser.add_argument("--status", type=Path, help="status file to keep up to date (JSON)")
    parser.add_argument("--log", type=Path, help="log file (default: standard error)")
    parser.add_argument(
        "--paths",
        type=Path,
        help="paths file of policies that publish paths (path-pinned; format in "
        "controllers/pinning.py; default: paths.json next to --status)",
    )
    parser.add_argument(
        "--events",
        type=Path,
        help="events file to append the log's records to, with their kind (JSON Lines, "
        "controllers/events.py; default: events.jsonl next to --status)",
    )
    parser.add_argument(
        "--telemetry", type=Path, help="telemetry file to append to (JSON Lines, docs/telemetry.md)"
    )
    parser.add_argument(
        "--telemetry-interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="poll every switch's port, group and flow counters this often (default 0.5)",
    )
    parser.add_argument(
        "--telemetry-max-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help="rotate the telemetry file at this size (default 64)",
    )
    parser.add_argument(
        "--telemetry-keep",
        type=int,
        default=3,
        metavar="N",
        help="rotated telemetry files to keep (FILE.1 .. FILE.N; default 3)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    return parser


def _setup_logging(path: Path | None, level: str, events: Path | None = None) -> None:
    handler: logging.Handler
    if path is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    if events is not None:  # the same records, as JSON lines with their kind (the monitor's)
        root.handlers.append(EventsHandler(events))
    root.setLevel(level)


def listening(port: int) -> bool:
    """Whether this process has a TCP socket listening on ``port`` (Linux /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as src:
                rows = src.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
                return True
    return False


def _telemetry_problem(args: argparse.Namespace) -> str | None:
    from controllers.telemetry import MIN_INTERVAL

    if not args.telemetry_interval >= MIN_INTERVAL:
        return (
            f"--telemetry-interval must be at least {MIN_INTERVAL} s, not {args.telemetry_interval}"
        )
    if not args.telemetry_max_mb >= 0.01:
        return f"--telemetry-max-mb must be at least 0.01, not {args.telemetry_max_mb}"
    if args.telemetry_keep < 1:
        return f"--telemetry-keep must be at least 1, not {args.telemetry_keep}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    events = args.events
    if events is None and args.status is not None:
        events = args.status.parent / EVENTS_NAME
    _setup_logging(args.log, args.log_level, events)
    # Before anything imports os_ken.lib.hub (see the module docstring).
    os.environ["OSKEN_HUB_TYPE"] = "native"

    from controllers.policies import default_registry
    from topologies.description import FabricDescription

    try:
        description = FabricDescription.read(args.fabric)
        policy = default_registry().create(args.policy, source="command line")
    except AstralError as err:
        LOG.error("%s", err)
        return EXIT_CONFIG
    except (OSError, ValueError, KeyError, TypeError) as err:
        LOG.error("cannot read the fabric description %s: %s", args.fabric, err)
        return EXIT_CONFIG
    problem = _telemetry_problem(args)
    if problem is not None:
        LOG.error("%s", problem)
        return EXIT_CONFIG
    if args.status is not None:
        args.status.parent.mkdir(parents=True, exist_ok=True)

    # os-ken registers its command-line options when these modules are imported; CONF must
    # be parsed after that and before any app is loaded.
    import os_ken.controller.ofp_handler  # noqa: F401
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager

    from controllers.app import ControllerSettings, EventListenerBound
    from controllers.telemetry import TelemetrySettings

    cfg.CONF(
        args=["--ofp-tcp-listen-port", str(args.port), "--ofp-listen-host", args.listen_host],
        project="os_ken",
        default_config_files=[],
        default_config_dirs=[],
        use_env=False,
    )
    settings = ControllerSettings(
        description=description,
        policy=policy,
        listen_host=args.listen_host,
        listen_port=args.port,
        status_path=args.status,
        paths_path=args.paths
        if args.paths is not None or args.status is None
        else args.status.parent / "paths.json",
    )
    telemetry = TelemetrySettings(
        description=description,
        policy=policy.name,
        interval=args.telemetry_interval,
        path=args.telemetry,
        max_bytes=int(args.telemetry_max_mb * 2**20),
        keep=args.telemetry_keep,
        # A policy that reacts to load says so (controllers.policies.Policy).
        publish=bool(getattr(policy, "needs_load", False)),
    )

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            os._exit(EXIT_CRASHED)
        LOG.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    manager = AppManager.get_instance()
    manager.load_apps(["controllers.app", "controllers.telemetry"])
    contexts = manager.create_contexts()
    services = manager.instantiate_apps(
        astral_settings=settings, astral_telemetry=telemetry, **contexts
    )
    app = manager.applications["FabricController"]

    code = EXIT_OK
    deadline = time.monotonic() + LISTEN_TIMEOUT
    while not stop.is_set() and not listening(args.port):
        if not all(t.is_alive() for t in services) or time.monotonic() > deadline:
            LOG.error("could not listen on %s:%d", args.listen_host, args.port)
            code = EXIT_LISTEN_FAILED
            stop.set()
        else:
            time.sleep(0.02)
    if code == EXIT_OK:
        app.send_event(app.name, EventListenerBound())
    while not stop.wait(0.5):
        if not all(t.is_alive() for t in services):
            LOG.error("an os-ken service thread died; stopping")
            code = EXIT_CRASHED
            break
    try:
        manager.close()
    except Exception:
        LOG.exception("error while closing the apps")
        code = code or EXIT_CRASHED
    LOG.info("controller stopped (exit status %d)", code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
