"""The monitor: one timeline of a run, four layers, on one clock (docs/monitoring.md).

- ``record``: what a run's launches, controller and machine produced, turned into the
  bundle's monitor tables (steps, connection ends and paths, TCP_INFO, controller events,
  host CPU) and its logs copied in;
- ``queries``: the two questions the indexes are for: what crossed a link between two
  instants, and which links a rank's slow step used;
- ``live``: the live view (``astral top``, ``astral run --live``) over the files a run
  writes while it goes;
- ``plots``: the per-rank Gantt, the heat map with fault intervals, the touched
  connections' throughput and RTT;
- ``faultreport``: ``astral report``'s fault section, what each layer saw.

It sits above ``testbed/`` (it reads what the controller and the launcher publish) and
below ``run/``, which records a run through it.
"""
