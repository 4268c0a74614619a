"""One key of an experiment document changed by its dotted path, before it is validated.

``astral forecast --set KEY=VALUE`` (a what-if) and a study's ``sweep:`` (one variant per
value, orchestrator.study.spec) both say "this experiment, but with ``speeds.nic`` at
400G": the change is made on the parsed YAML document and the result validated as a file
would be, so a bad value is the validator's error naming its key, and nothing else has to
know what a fabric or an experiment key means.

Which document a key changes: an experiment key (``sizes.max``, ``scale``, ``faults``,
``placement.order``; the experiment's top-level keys) changes the experiment; any other is
the fabric's (``oversubscription.agg``, ``nic_ports``, ``switch.radix``), and
``fabric.KEY`` says so explicitly. A fabric the experiment names by preset or file is read
and written inline first, so the change never touches a shared file. A value of ``None``
removes the key (the validator's default applies).

Two experiment keys replace a fabric key for the run (:func:`~orchestrator.run.experiment.
parse_experiment`): ``scale`` the fabric's ``emulation.scale``, and ``latency`` the fabric's
``latency`` (a mapping of it, the components it names). A fabric key set here that the
experiment's own key would replace takes effect anyway: the experiment's key gives way (is
removed, or loses the component). Why: a setting is a what-if asked for by name, and one
the experiment silently outranked would leave the variant equal to the baseline, an answer
to another question (``--set emulation.scale=1e-4`` on experiments/default.yaml, whose
``scale: 2.0e-4`` would keep the run at 2e-4). Where giving way would change more than the key
set (a component of the fabric's latencies under an experiment's ``latency: off``, which
would turn every other latency on), it is an error naming the experiment's key instead.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from topologies.errors import ConfigError, FabricSpecError

# fabric key -> the experiment key that replaces it for the run (parse_experiment)
REPLACED_BY_EXPERIMENT: dict[tuple[str, ...], str] = {
    ("emulation", "scale"): "scale",
    ("latency",): "latency",
}


def changed(
    document: dict[str, Any],
    settings: Sequence[tuple[str, object]],
    *,
    source: str,
    base_dir: Path,
) -> dict[str, Any]:
    """A copy of ``document`` with every ``(dotted key, value)`` of ``settings`` applied.

    ``source`` names where the settings come from in errors (``--set``, a study file's
    ``sweep``); ``base_dir`` is where a relative fabric path starts.
    """
    out = copy.deepcopy(document)
    for key, value in settings:
        parts, on_fabric = _target(key, source)
        if on_fabric:
            _assign(_inline_fabric(out, key, source, base_dir), parts, value, key, source)
            _give_way(out, parts, key, source)
        else:
            _assign(out, parts, value, key, source)
    return out


def is_fabric_key(key: str) -> bool:
    """Whether ``key`` changes the fabric (see the module docstring)."""
    from orchestrator.run.experiment import _TOP_KEYS as EXPERIMENT_KEYS

    head = key.split(".", 1)[0]
    return (head == "fabric" and "." in key) or head not in EXPERIMENT_KEYS


def _target(key: str, source: str) -> tuple[list[str], bool]:
    """The key's parts below its document, and whether that document is the fabric."""
    from orchestrator.run.experiment import _TOP_KEYS as EXPERIMENT_KEYS
    from topologies.spec import _TOP_KEYS as FABRIC_KEYS

    parts = key.split(".")
    if not key or any(not part for part in parts):
        raise ConfigError(source, key, "a dotted key such as speeds.nic or sizes.max", key)
    if not is_fabric_key(key):
        return parts, False
    if parts[0] == "fabric":
        parts = parts[1:]
    if parts[0] not in FABRIC_KEYS:
        raise ConfigError(
            source,
            key,
            "an experiment key ("
            + ", ".join(sorted(EXPERIMENT_KEYS - {"fabric"}))
            + ") or a fabric key ("
            + ", ".join(sorted(FABRIC_KEYS))
            + ")",
            key,
        )
    return parts, True


def _inline_fabric(
    document: dict[str, Any], key: str, source: str, base_dir: Path
) -> dict[str, Any]:
    """The document's fabric as a mapping, read from its preset or file if need be."""
    from topologies.catalog import resolve_fabric
    from topologies.yamlfile import read_yaml

    fabric = document.get("fabric")
    if isinstance(fabric, str):
        try:
            fabric = read_yaml(resolve_fabric(fabric, base_dir), FabricSpecError, "fabric")
        except FabricSpecError as err:
            raise ConfigError(
                source, key, "an experiment whose fabric can be read", fabric, detail=str(err)
            ) from None
        document["fabric"] = fabric
    if not isinstance(fabric, dict):
        raise ConfigError(source, key, "an experiment whose fabric is a mapping", fabric)
    return fabric


def _give_way(document: dict[str, Any], parts: Sequence[str], key: str, source: str) -> None:
    """Make the experiment's own key give way to the fabric key ``parts`` just set where it
    would replace it for the run (see the module docstring)."""
    from topologies.spec import LATENCY_ON

    for fabric_path, own in REPLACED_BY_EXPERIMENT.items():
        if own not in document:
            continue
        depth = min(len(parts), len(fabric_path))
        if tuple(parts[:depth]) != fabric_path[:depth]:
            continue
        if len(parts) <= len(fabric_path):  # the whole value the experiment replaces
            document.pop(own)
            continue
        # a component below it (latency.nic): the experiment's value replaces that part
        # only when it is a mapping naming it; `on` keeps the fabric's figures
        mine = document[own]
        component = parts[len(fabric_path)]
        if isinstance(mine, dict):
            mine.pop(component, None)
        elif mine is not True and mine != LATENCY_ON:
            raise ConfigError(
                source,
                key,
                "a fabric key the experiment does not replace for the run",
                f"{own}: {mine} in the experiment",
                detail=f"which sets the run's {own} whatever the fabric's; set {own} "
                f"instead, e.g. {own}={{{component}: ...}}",
            )


def _assign(
    document: dict[str, Any], parts: Sequence[str], value: object, key: str, source: str
) -> None:
    node = document
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(source, key, f"{part} to be a mapping", child)
        node = child
    if value is None:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = copy.deepcopy(value)
