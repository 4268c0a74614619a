"""Reading a YAML file a user wrote (a fabric, an experiment): the one place where a missing,
unreadable or malformed file becomes a :class:`~topologies.errors.ConfigError` sentence
naming the file, so that every such file fails the same way. The document's shape is the
caller's to check."""

from __future__ import annotations

from pathlib import Path

import yaml

from topologies.errors import ConfigError


def read_yaml(path: Path, error: type[ConfigError], what: str) -> object:
    """The parsed document in ``path``; a problem reading it raises ``error`` (the caller's
    ConfigError subclass), ``what`` naming the kind of file (``an existing <what> file``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(path, "", f"an existing {what} file", "no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise error(path, "", "a readable UTF-8 text file", str(err)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        raise error(path, "", "valid YAML", f"a syntax error at {where}") from None
