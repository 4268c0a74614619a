"""How much the monitor records while collectives run: its detail levels.

The monitor (docs/monitoring.md) lines up four layers on one clock; most of them cost
nothing a run would notice (the application's steps come with the workers' answers, the
controller's events with its log), but three are work done while the traffic flows:

- the senders' TCP_INFO, at most every 50 ms per connection, with its throughput samples
  (a few more numbers in a sample message for the launcher to parse; the read itself is
  the one the byte counts already make);
- the switches' counters, polled by the controller (every 0.5 s at full detail: the
  network layer's resolution; every 2 s at the lightest, enough for the heat map);
- the ranks' progress written for the live view, and the CPU of the controller and the
  workers read with every CPU sample (a few /proc files at 10 Hz);
- the probe mesh (orchestrator.testbed.probemesh): a few dozen 64-byte TCP messages every
  50 ms on paths that cover every link direction, so that a fault where the collectives
  do not go is seen too.

``full`` does all of it, ``light`` none of the optional parts. ``benchmarks/monitor_overhead.py``
measures what full costs against light (docs/monitoring.md, "Overhead").
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies.errors import ConfigError


@dataclass(frozen=True)
class MonitorLevel:
    name: str
    tcp_info: bool  # TCP_INFO with the throughput samples (LaunchOptions.tcp_info_interval)
    telemetry_interval: float  # seconds between the controller's counter polls
    live: bool  # the ranks' progress file for `astral top`
    process_cpu: bool  # the controller's and the workers' CPU with every CPU sample
    probes: bool  # the probe mesh across every link (orchestrator.testbed.probemesh)


FULL = MonitorLevel(
    "full", tcp_info=True, telemetry_interval=0.5, live=True, process_cpu=True, probes=True
)
LIGHT = MonitorLevel(
    "light", tcp_info=False, telemetry_interval=2.0, live=False, process_cpu=False, probes=False
)
LEVELS = {level.name: level for level in (FULL, LIGHT)}
DEFAULT_MONITOR = FULL.name


def monitor_level(name: str, source: str | None = None, key: str = "monitor") -> MonitorLevel:
    """The level called ``name``; an unknown one is a ConfigError naming ``source`` (the
    file or option) and ``key``, listing the known ones."""
    if name not in LEVELS:
        raise ConfigError(source, key, f"a monitor level ({' or '.join(LEVELS)})", name)
    return LEVELS[name]
