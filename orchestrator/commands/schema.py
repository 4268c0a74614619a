"""``astral schema fabric|experiment|machines [--out FILE]``: the JSON Schema of a file kind.

Prints the schema (JSON Schema draft 2020-12) of a fabric file, an experiment file or the
inventory of machines, generated from the definitions its validator checks against
(topologies/schema.py says why), or writes it to FILE. An editor with a YAML language server
then checks a file while it is typed, when its first line names the schema:
``# yaml-language-server: $schema=<path to the schema>``. The repository's copies are
docs/schemas/KIND.schema.json (docs/schemas.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from topologies.errors import ConfigError

#: Kind -> (module, function) that generates its schema; imported when asked for, so that
#: `astral --help` does not load the registries.
SCHEMAS = {
    "fabric": ("topologies.schema", "fabric_schema"),
    "experiment": ("orchestrator.run.schema", "experiment_schema"),
    "machines": ("orchestrator.remote.schema", "machines_schema"),
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="print the JSON Schema of a fabric, experiment or machines file",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("kind", choices=list(SCHEMAS), help="which file's schema")
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="write the schema to FILE instead of printing it"
    )
    parser.set_defaults(func=run)


def render(kind: str) -> str:
    """The schema of ``kind`` as the committed file holds it: indented JSON, one newline."""
    module, function = SCHEMAS[kind]
    schema = getattr(importlib.import_module(module), function)()
    return json.dumps(schema, indent=2) + "\n"


def run(args: argparse.Namespace) -> int:
    document = render(args.kind)
    if args.out is None:
        sys.stdout.write(document)
        return 0
    try:
        args.out.write_text(document, encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            "command line", "--out", "a file that can be written", f"{args.out}: {error.strerror}"
        ) from None
    return 0
