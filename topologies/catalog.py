"""The fabric presets shipped with the project, and how a name on a command line or in an
experiment file becomes a fabric file: the one place that knows where presets live.

A *fabric reference* is either a preset's name (``astral-small``: no ``/`` and no ``.yaml``
suffix) or a path to a fabric file. Every entry point (``astral topo``, ``astral up``,
``astral doctor``, ``astral calibrate``, experiment files, the emulation, benchmarks, tests)
resolves it with :func:`resolve_fabric`, so a new preset is one YAML file in
``topologies/presets/`` and nothing else. The shape decides, not the disk: ``astral-small``
is the preset even where a file of that name lies in the working directory, and a path is
never looked up among the presets.
"""

from __future__ import annotations

from pathlib import Path

from topologies.errors import FabricSpecError

PRESETS_DIR = Path(__file__).resolve().parent / "presets"
DEFAULT_PRESET = "astral-small"
PATH_SUFFIXES = (".yaml", ".yml")  # a reference ending so is a path, as one with a '/'


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
            "a preset name (one of " + ", ".join(preset_names()) + ") or a file",
            name,
        )
    return path


def is_preset_name(value: str) -> bool:
    """Whether ``value`` is written as a preset name rather than as a path."""
    return "/" not in value and not value.endswith(PATH_SUFFIXES)


def resolve_fabric(value: str | Path, base_dir: Path | None = None) -> Path:
    """The fabric file ``value`` refers to: a preset's file, or the path (``~`` expanded; a
    relative one starts at ``base_dir``, default the working directory).

    An unknown preset name is a FabricSpecError naming the presets; whether a path exists is
    for :func:`topologies.spec.load_fabric_spec` (or the caller) to say.
    """
    text = str(value)
    if is_preset_name(text):
        return preset_path(text)
    path = Path(text).expanduser()
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    return path


DEFAULT_FABRIC = PRESETS_DIR / f"{DEFAULT_PRESET}.yaml"
