"""The host's choice of NIC port: an experiment setting of its own, ``host_ports``.

Every emulated GPU's NIC has (usually) two ports, to two ToRs, and its fabric route is one
multipath route over them (orchestrator/emulation/hostconfig.py: L4 hash policy). Which
port a connection leaves by is therefore the host's decision, not the switches': the
kernel hashes the five-tuple, or the orchestrator picks a source port the kernel routes out
of the port it wants (orchestrator/testbed/pinning.py). The switch policy decides the rest
of the path. Mixing the two up makes a comparison of switch policies unfair: when the hash
puts both ring connections of a rank on one NIC port, that rank is capped at half its rail
bandwidth whatever the switches do. So the host's part is named and set apart:

    balanced   the orchestrator picks every fabric connection's source port so that each
               rank's connections of a collective spread evenly over its NIC ports (ties
               to the port whose ToR carries fewer of them), the same way under every
               policy. Under a policy that pins paths (path-pinned) the path is then the
               least loaded of those leaving by that port; under any other (ecmp,
               shortest, adaptive, ...) only the first hop is fixed, the switches still
               choose the rest.
    hash       the kernel's multipath hash picks the NIC port, as for any application:
               connections use ephemeral source ports. Under path-pinned a connection's
               source port also selects its path, so it cannot be ephemeral: its NIC port
               is the one the kernel's hash gives a random ephemeral port (``ip route
               get``), and the pinned path is the least loaded among those leaving by it.
               The NIC ports are then as uneven as the hash makes them, the paths as
               disjoint as the fabric allows from there: the switch policy's part alone.

The default is ``balanced`` for every policy: a run that compares switch policies then
compares the switch policies alone (a real NCCL job assigns its channels to NIC ports
itself, too); ``hash`` measures what the host's hash costs on top (a bonded NIC). The
nccl-tests tables, the summary and the bundle name the setting (docs/benchmarks.md has
the measured split).
"""

from __future__ import annotations

import argparse

from topologies.errors import ConfigError

BALANCED = "balanced"
HASH = "hash"
HOST_PORTS = (BALANCED, HASH)
DEFAULT_HOST_PORTS = BALANCED


def check_host_ports(value: object, source: str = "testbed", key: str = "host_ports") -> str:
    """``value`` if it names a setting; otherwise a ConfigError naming ``key``."""
    if not isinstance(value, str) or value not in HOST_PORTS:
        raise ConfigError(
            source, key, "how hosts pick NIC ports: one of " + ", ".join(HOST_PORTS), value
        )
    return value


def add_host_ports_option(parser: argparse.ArgumentParser) -> None:
    """``--host-ports hash,balanced`` (default: both, in that order), for the benchmarks
    that measure the settings side by side; a wrong name is argparse's usage error."""

    def settings(text: str) -> list[str]:
        names = text.split(",")
        for name in names:
            if name not in HOST_PORTS:
                raise argparse.ArgumentTypeError(
                    f"expected how hosts pick NIC ports: one of {', '.join(HOST_PORTS)}, "
                    f"found {name!r}"
                )
        return names

    parser.add_argument(
        "--host-ports",
        type=settings,
        default=[HASH, BALANCED],
        help="how hosts pick NIC ports, comma-separated: hash, balanced (default: both)",
    )
