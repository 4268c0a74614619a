"""The fabric presets shipped with the project, and how a name on a command line or in an
experiment file becomes a fabric file: the one place that knows where presets live.

A *fabric reference* is either a preset's name (``astral-small``: no ``/`` and no ``.yaml``
suffix) or a path to a fabric file. Every entry point (``astral topo``, ``astral up``,
``astral doctor``, ``astral calibrate``, experiment files, benchmarks, tests) resolves it
here, so a new preset is one YAML file in ``topologies/presets/`` and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from topologies.errors import FabricSpecError

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_PRESET = "astral-small"


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """The file of preset ``name`` (FabricSpecError naming the presets if there is none)."""
    path = PRESETS_DIR / f"{name}.yaml"
    if "/" in name or not path.is_file():
        raise FabricSpecError(
            "command line",
            "FABRIC",
            "a preset name (one of " + ", ".join(preset_names()) + ")",
            name,
        )
    return path


def is_preset_name(value: str) -> bool:
    """Whether ``value`` is written as a preset name rather than as a path."""
    return "/" not in value and not value.endswith((".yaml", ".yml"))


DEFAULT_FABRIC = PRESETS_DIR / f"{DEFAULT_PRESET}.yaml"
