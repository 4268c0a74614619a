"""The fabric description a user writes (YAML), validated into a typed :class:`FabricSpec`
(:mod:`topologies.fabricspec`).

This module only checks the *shape* of the document (keys, types, ranges). The kinds it
accepts, and the NIC ports each defaults to, are the generator registry's
(:mod:`topologies.generators`). Whether the described fabric can actually be wired (radix
large enough, port split consistent with the counts) is each generator's business:
``generators.<kind>.check(spec)`` raises the same :class:`~topologies.errors.FabricSpecError`,
so a user always gets one sentence naming the file, the key path, what was expected and what
was found.

Example (``topologies/presets/astral-small.yaml``)::

    name: astral-small
    kind: astral            # a registered kind: astral, fat-tree, rail-optimized, ...
    pods: 2
    servers_per_pod: 2
    gpus_per_server: 2      # = rails
    nic_ports: 2            # 2 = dual-ToR, 1 = single-ToR
    switch: {radix: 4, down_ports: 2}
    speeds: {nic: 200G, tor_agg: 200G, agg_core: 200G, nvlink: 3.6T}
    oversubscription: {tor: 1, agg: 1}
    emulation: {scale: 1.0e-4}   # 200G real -> 20M emulated
    latency: {switch_hop: 0.6us, nic: 0.4us, library: 1.3us, nvlink: 0.6us, operation: 6.6us}
                                 # real-world figures, applied / scale; `latency: off` adds
                                 # none; a key left out keeps its default (docs/latency.md)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from topologies.errors import ConfigError, FabricSpecError
from topologies.fabricspec import (
    DEFAULT_LATENCY,
    DEFAULT_SCALE,
    DEFAULT_SPEEDS,
    MIN_EMULATED_BPS,
    EmulationSpec,
    FabricSpec,
    LatencySpec,
    Oversubscription,
    Speeds,
    SwitchSpec,
)
from topologies.generators import GeneratorRegistry, default_registry
from topologies.units import NUMBER_TEXT, format_rate, parse_duration, parse_rate
from topologies.yamlfile import read_yaml

# What the reader checks, named so that the JSON Schema (topologies/schema.py) is generated
# from the same facts: the keys of each mapping, which are required, and the ranges.
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
NAME_TEXT = "a lower-case name of letters, digits and '-' (at most 32)"

_TOP_KEYS = {
    "name",
    "kind",
    "pods",
    "servers_per_pod",
    "gpus_per_server",
    "nic_ports",
    "switch",
    "speeds",
    "oversubscription",
    "emulation",
    "latency",
}
REQUIRED_KEYS = ("name", "kind", "gpus_per_server", "switch")
SWITCH_KEYS = {"radix", "down_ports"}
SWITCH_REQUIRED = ("radix",)
OVERSUBSCRIPTION_KEYS = {"tor", "agg"}
EMULATION_KEYS = {"scale"}
#: The smallest value of each integer key (a key path), as ``read.integer`` is given it.
MINIMUM = {
    "pods": 1,
    "servers_per_pod": 1,
    "gpus_per_server": 1,
    "nic_ports": 1,
    "switch.radix": 2,
    "switch.down_ports": 1,
}
NIC_PORTS = (1, 2)  # single-ToR, dual-ToR
OVERSUBSCRIPTION_RANGE = (1.0, 1000.0)
SCALE_RANGE = (1e-9, 1.0)  # emulated = real x scale
LATENCY_OFF, LATENCY_ON = "off", "on"  # or false, true

# Above this a "real-world latency" is a unit mistake (they are micro-, not milliseconds).
MAX_LATENCY = 1e-3


_T = TypeVar("_T")


class _Reader:
    """Walks a parsed document, raising :attr:`error` (FabricSpecError here; a subclass
    names its own file kind's) with file and key path."""

    error: type[ConfigError] = FabricSpecError

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, expected: str, found: object = None, detail: str = "") -> None:
        raise self.error(self.source, key, expected, found, detail=detail)

    def mapping(self, value: object, key: str, allowed: set[str]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(key, "a mapping", _describe(value))
        assert isinstance(value, Mapping)
        for name in value:
            if not isinstance(name, str) or name not in allowed:
                path = f"{key}.{name}" if key else str(name)
                self.fail(
                    path, "one of the known keys " + ", ".join(sorted(allowed)), "unknown key"
                )
        return value

    def integer(self, value: object, key: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"an integer >= {minimum}", value)
        assert isinstance(value, int)
        if value < minimum:
            self.fail(key, f"an integer >= {minimum}", value)
        return value

    def number(self, value: object, key: str, low: float, high: float | None = None) -> float:
        if isinstance(value, str):
            if not NUMBER_TEXT.match(value):
                self.fail(key, "a number", value)
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, "a number", value)
        assert isinstance(value, (int, float))
        if value < low or (high is not None and value > high) or value != value:
            rng = f">= {low:g}" if high is None else f"between {low:g} and {high:g}"
            self.fail(key, f"a number {rng}", value)
        return float(value)

    def duration(self, value: object, key: str) -> float:
        try:
            seconds = parse_duration(value)
        except ValueError as err:
            self.fail(key, str(err), value)
        if seconds > MAX_LATENCY:
            self.fail(
                key,
                "a real-world latency of at most 1ms (they are microseconds; a bare number"
                " is microseconds)",
                value,
            )
        return seconds

    def latency(self, value: object, key: str, base: LatencySpec) -> LatencySpec:
        """``off``/``false``, ``on``/``true``, or a mapping of components over ``base``'s
        figures (a key left out keeps its value); a mapping or ``on`` turns latency on."""
        if value is False or value == LATENCY_OFF:
            return replace(base, enabled=False)
        if value is True or value == LATENCY_ON:
            return replace(base, enabled=True)
        if not isinstance(value, Mapping):
            self.fail(
                key,
                f"{LATENCY_OFF}, {LATENCY_ON}, or a mapping of "
                + ", ".join(DEFAULT_LATENCY)
                + " to durations",
                _describe(value),
            )
        raw = self.mapping(value, key, set(DEFAULT_LATENCY))
        figures = {name: self.duration(v, f"{key}.{name}") for name, v in raw.items()}
        return replace(base, enabled=True, **figures)

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, "true or false", value)
        assert isinstance(value, bool)
        return value

    def choice(self, value: object, key: str, choices: Collection[str], what: str) -> str:
        if not isinstance(value, str) or value not in choices:
            self.fail(key, f"{what}: one of " + ", ".join(choices), value)
        assert isinstance(value, str)
        return value

    def parsed(self, value: object, key: str, parse: Callable[[object], _T]) -> _T:
        """``parse(value)``; its ValueError (which names the accepted forms) as a failure."""
        try:
            return parse(value)
        except ValueError as err:
            self.fail(key, str(err), value)
        raise AssertionError("unreachable")

    def rate(self, value: object, key: str) -> float:
        return self.parsed(value, key, parse_rate)


def _describe(value: object) -> str:
    if value is None:
        return "nothing"
    return (
        f"a {type(value).__name__} ({value!r})"
        if not isinstance(value, (dict, list))
        else (f"a {type(value).__name__}")
    )


# Keys of another file of ours that no fabric description has, and what that file is: an
# experiment names its fabric and its collectives, a study sweeps experiments, a training
# workload has a model.
_OTHER_FILES = (
    (("fabric", "fabrics", "collectives", "workload"), "an experiment"),
    (("model",), "a training workload"),
)


def check_is_fabric(document: object, source: str) -> None:
    """A FabricSpecError when ``document`` is an experiment or a workload given where a
    fabric description is expected (``astral topo show EXPERIMENT.yaml``), saying so and
    where its fabric is. Why: the key check alone names the first key a fabric does not
    know (``description``), which leaves the user to work out that the file is of
    another kind."""
    if not isinstance(document, Mapping) or "kind" in document:
        return
    for keys, what in _OTHER_FILES:
        present = [k for k in keys if k in document]
        if not present:
            continue
        fabric = document.get("fabric")
        where = (
            f"; its fabric is `fabric: {fabric}`: give that preset or file"
            if isinstance(fabric, str)
            else ""
        )
        raise FabricSpecError(
            source,
            "",
            "a fabric description (name, kind, gpus_per_server, ...; topologies/presets/)",
            f"{what} ({present[0]}: ...)",
            detail=f"a fabric file has a kind{where}",
        )


def parse_fabric_spec(
    document: object, source: str = "<inline>", kinds: GeneratorRegistry | None = None
) -> FabricSpec:
    """Validate a parsed YAML document into a FabricSpec (shape only, see module docstring).

    ``kinds``: the registry whose kinds the document may name (default: the built-in ones).
    """
    if kinds is None:
        kinds = default_registry()
    check_is_fabric(document, source)
    read = _Reader(source)
    doc = read.mapping(document, "", _TOP_KEYS)
    for required in REQUIRED_KEYS:
        if required not in doc:
            read.fail(required, "this key to be present", "it missing")

    name = doc["name"]
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        read.fail("name", NAME_TEXT, name)
    kind = doc["kind"]
    generator = kinds.get(kind, source)

    pods = read.integer(doc.get("pods", 1), "pods", MINIMUM["pods"])
    servers = doc.get("servers_per_pod")
    servers_per_pod = (
        None
        if servers is None
        else read.integer(servers, "servers_per_pod", MINIMUM["servers_per_pod"])
    )
    gpus = read.integer(doc["gpus_per_server"], "gpus_per_server", MINIMUM["gpus_per_server"])
    nic_ports = read.integer(
        doc.get("nic_ports", generator.default_nic_ports), "nic_ports", MINIMUM["nic_ports"]
    )
    if nic_ports not in NIC_PORTS:
        read.fail("nic_ports", "1 (single-ToR) or 2 (dual-ToR)", nic_ports)

    sw = read.mapping(doc["switch"], "switch", SWITCH_KEYS)
    for required in SWITCH_REQUIRED:
        if required not in sw:
            read.fail(f"switch.{required}", "this key to be present", "it missing")
    radix = read.integer(sw["radix"], "switch.radix", MINIMUM["switch.radix"])
    down = read.integer(
        sw.get("down_ports", radix // 2), "switch.down_ports", MINIMUM["switch.down_ports"]
    )
    if down >= radix:
        read.fail(
            "switch.down_ports",
            f"fewer down ports than the radix ({radix})",
            down,
            detail="a switch needs at least one uplink",
        )

    raw_speeds = read.mapping(doc.get("speeds", {}), "speeds", set(DEFAULT_SPEEDS))
    speeds = Speeds(**{k: read.rate(v, f"speeds.{k}") for k, v in raw_speeds.items()})

    raw_over = read.mapping(
        doc.get("oversubscription", {}), "oversubscription", OVERSUBSCRIPTION_KEYS
    )
    over = Oversubscription(
        **{
            k: read.number(v, f"oversubscription.{k}", *OVERSUBSCRIPTION_RANGE)
            for k, v in raw_over.items()
        }
    )

    raw_emu = read.mapping(doc.get("emulation", {}), "emulation", EMULATION_KEYS)
    emulation = EmulationSpec(
        scale=read.number(raw_emu.get("scale", DEFAULT_SCALE), "emulation.scale", *SCALE_RANGE)
    )
    if emulation.scale <= 0:
        read.fail("emulation.scale", "a number above 0", emulation.scale)
    for key, value in raw_speeds.items():  # the rates as given, once the scale is known
        emulated = getattr(speeds, key) * emulation.scale
        if emulated < MIN_EMULATED_BPS:
            read.fail(
                f"speeds.{key}",
                f"a rate of at least {format_rate(MIN_EMULATED_BPS / emulation.scale)} real "
                f"({MIN_EMULATED_BPS / 1e6:g} Mbit/s emulated at emulation.scale "
                f"{emulation.scale:g}, or a larger scale)",
                value,
                detail=f"{emulated:.3g} bit/s emulated: a shaped link's smallest queue "
                "(16 frames) would take over 0.19 s to drain; far below, a run stalls",
            )
    slowest = min(vars(speeds).values()) * emulation.scale  # defaults too: the scale's fault
    if slowest < MIN_EMULATED_BPS:
        read.fail(
            "emulation.scale",
            f"a scale at which every link runs at {MIN_EMULATED_BPS / 1e6:g} Mbit/s emulated "
            f"or more (at least {MIN_EMULATED_BPS / min(vars(speeds).values()):g} here)",
            emulation.scale,
            detail=f"the slowest link would run at {slowest:.3g} bit/s emulated",
        )

    latency = read.latency(doc.get("latency", True), "latency", LatencySpec())

    return FabricSpec(
        name=name,
        kind=kind,
        pods=pods,
        servers_per_pod=servers_per_pod,
        gpus_per_server=gpus,
        nic_ports=nic_ports,
        switch=SwitchSpec(radix=radix, down_ports=down),
        speeds=speeds,
        oversubscription=over,
        emulation=emulation,
        latency=latency,
        source=source,
    )


def load_fabric_spec(path: str | Path, kinds: GeneratorRegistry | None = None) -> FabricSpec:
    """Read and validate a fabric file; every problem becomes one FabricSpecError."""
    path = Path(path)
    document = read_yaml(path, FabricSpecError, "fabric")
    return parse_fabric_spec(document, str(path), kinds)
