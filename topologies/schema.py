"""JSON Schemas (draft 2020-12) of the files users write, generated from the validators' own
definitions: here the building blocks, and the schema of a fabric file.

What for: an editor with a YAML language server (VS Code's YAML extension, Neovim's
yamlls, ...) completes keys, lists the allowed values and marks mistakes while a file is
typed, when the file's first line names its schema::

    # yaml-language-server: $schema=../../docs/schemas/fabric.schema.json

Why generated: the hand-written readers (:mod:`topologies.spec`,
:mod:`orchestrator.run.experiment`, :mod:`orchestrator.remote.inventory`) are the authority.
A second, hand-written description of the same files would drift from them; these schemas
are built from the readers' named facts instead (key sets, required keys, minimums, ranges,
the registries of kinds, policies and collectives, the regexes the unit parsers match), so a
change there is a change here. :func:`mapping` refuses a key set that differs from the
properties given for it, so a key added to a reader without its schema fails at once.
``astral schema KIND --out docs/schemas/KIND.schema.json`` rewrites the committed copies; a
unit test says when they are stale.

A schema checks the shape only. What needs the generated fabric, the file system or a
comparison between two keys stays the validator's alone (docs/schemas.md lists it).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from topologies.fabricspec import DEFAULT_LATENCY, DEFAULT_SPEEDS
from topologies.generators import GeneratorRegistry, default_registry
from topologies.spec import (
    _TOP_KEYS,
    EMULATION_KEYS,
    LATENCY_OFF,
    LATENCY_ON,
    MAX_LATENCY,
    MINIMUM,
    NAME_PATTERN,
    NAME_TEXT,
    NIC_PORTS,
    OVERSUBSCRIPTION_KEYS,
    OVERSUBSCRIPTION_RANGE,
    REQUIRED_KEYS,
    SCALE_RANGE,
    SWITCH_KEYS,
    SWITCH_REQUIRED,
)
from topologies.units import DURATION, NUMBER_TEXT, RATE, bare_duration

Schema = dict[str, Any]

DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: A number as written holds a non-zero digit ahead of any exponent or unit: what a parser's
#: "above zero" check comes to for a text that already matches its pattern.
ABOVE_ZERO = re.compile(r"^\s*[0.]*[1-9]")


def pattern(regex: re.Pattern[str]) -> str:
    """``regex`` as JSON Schema's ECMA-262 dialect reads it. ECMA has no inline flags, so
    ``re.IGNORECASE`` is spelled out: a letter becomes ``[xX]``, a class gets the other case
    of its letters. The readers' patterns use nothing else that the two dialects read apart.
    """
    if not regex.flags & re.IGNORECASE:
        return regex.pattern
    if regex.flags & ~(re.IGNORECASE | re.UNICODE) or "(?P" in regex.pattern:
        raise ValueError(f"cannot translate {regex.pattern!r} (flags {regex.flags})")
    source, out, i = regex.pattern, [], 0
    while i < len(source):
        char = source[i]
        if char == "\\":
            out.append(source[i : i + 2])
            i += 2
        elif char == "[":
            end = source.index("]", i + 1)
            members = source[i + 1 : end]
            if "\\" in members or re.search(r"[A-Za-z]-|-[A-Za-z]", members):
                raise ValueError(f"cannot translate the class [{members}] of {regex.pattern!r}")
            others = "".join(c.swapcase() for c in members if c.swapcase() not in members)
            out.append(f"[{members}{others}]")
            i = end + 1
        else:
            out.append(f"[{char}{char.swapcase()}]" if char.swapcase() != char else char)
            i += 1
    return "".join(out)


def mapping(
    keys: Collection[str], properties: Mapping[str, Schema], required: Sequence[str] = ()
) -> Schema:
    """A mapping of exactly the reader's ``keys``, each value as ``properties`` says, in
    its order (a caller sorts a set, so that the generated file is the same every time).

    Raises ``ValueError`` when ``properties`` names other keys than ``keys``: the schema
    then no longer says what the reader accepts.
    """
    if set(keys) != set(properties) or not set(required) <= set(keys):
        raise ValueError(
            f"the schema's keys {sorted(properties)} (required {list(required)}) differ "
            f"from the reader's {sorted(keys)}"
        )
    schema: Schema = {"type": "object", "properties": dict(properties)}
    schema["additionalProperties"] = False
    if required:
        schema["required"] = list(required)
    return schema


def text(*regexes: re.Pattern[str]) -> Schema:
    """A string every one of ``regexes`` matches (``re.search``, as JSON Schema does)."""
    if len(regexes) == 1:
        return {"type": "string", "pattern": pattern(regexes[0])}
    return {"type": "string", "allOf": [{"pattern": pattern(r)} for r in regexes]}


def integer(minimum: int) -> Schema:
    return {"type": "integer", "minimum": minimum}


def number(low: float, high: float) -> Schema:
    """A number in [low, high], or one written as text (PyYAML reads ``1e-4`` as a string;
    the reader converts it, and checks the range, which a pattern cannot)."""
    return {"anyOf": [{"type": "number", "minimum": low, "maximum": high}, text(NUMBER_TEXT)]}


def choice(values: Collection[Any]) -> Schema:
    return {"enum": list(values)}


def rate() -> Schema:
    """What :func:`topologies.units.parse_rate` takes: a positive number (bit/s) or text."""
    return {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, text(RATE, ABOVE_ZERO)]}


def duration(maximum: float | None = None) -> Schema:
    """What :func:`topologies.units.parse_duration` takes: a number (microseconds) >= 0, at
    most ``maximum`` seconds, or text (whose maximum only the reader checks)."""
    bare: Schema = {"type": "number", "minimum": 0}
    if maximum is not None:
        bare["maximum"] = bare_duration(maximum)
    return {"anyOf": [bare, text(DURATION)]}


def name() -> Schema:
    return {**text(NAME_PATTERN), "description": NAME_TEXT}


def latency() -> Schema:
    """``off``/``false``, ``on``/``true``, or real-world latencies by component."""
    components = {key: duration(MAX_LATENCY) for key in DEFAULT_LATENCY}
    return {
        "anyOf": [
            choice([False, True, LATENCY_OFF, LATENCY_ON]),
            mapping(DEFAULT_LATENCY, components),
        ]
    }


def fabric_object(kinds: GeneratorRegistry | None = None) -> Schema:
    """The fabric mapping (:func:`topologies.spec.parse_fabric_spec`), without the
    document's own keys, so that an experiment's schema can hold it as an inline fabric."""
    if kinds is None:
        kinds = default_registry()
    counts = {key: integer(MINIMUM[key]) for key in ("pods", "servers_per_pod", "gpus_per_server")}
    properties = {
        "name": name(),
        "kind": choice(kinds.kinds()),
        **counts,
        "servers_per_pod": {"anyOf": [counts["servers_per_pod"], {"type": "null"}]},
        "nic_ports": {**integer(MINIMUM["nic_ports"]), **choice(NIC_PORTS)},
        "switch": mapping(
            SWITCH_KEYS,
            {key: integer(MINIMUM[f"switch.{key}"]) for key in sorted(SWITCH_KEYS)},
            SWITCH_REQUIRED,
        ),
        "speeds": mapping(DEFAULT_SPEEDS, {key: rate() for key in DEFAULT_SPEEDS}),
        "oversubscription": mapping(
            OVERSUBSCRIPTION_KEYS,
            {key: number(*OVERSUBSCRIPTION_RANGE) for key in sorted(OVERSUBSCRIPTION_KEYS)},
        ),
        "emulation": mapping(EMULATION_KEYS, {"scale": number(*SCALE_RANGE)}),
        "latency": latency(),
    }
    return mapping(_TOP_KEYS, properties, REQUIRED_KEYS)


def fabric_schema(kinds: GeneratorRegistry | None = None) -> Schema:
    """The schema of a fabric file (topologies/presets/*.yaml)."""
    return {
        "$schema": DIALECT,
        "title": "astral fabric",
        "description": "A fabric file (topologies/spec.py), generated by `astral schema fabric`",
        **fabric_object(kinds),
    }
