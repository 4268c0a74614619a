"""Reading a YAML file a user wrote (a fabric, an experiment): the one place where a missing,
unreadable or malformed file becomes a :class:`~topologies.errors.ConfigError` sentence
naming the file, so that every such file fails the same way. The document's shape is the
caller's to check.

Two things plain ``yaml.safe_load`` lets through are refused here:

- a key written twice in one mapping (YAML says keys are unique; PyYAML silently keeps the
  later value, so a fabric would quietly run with half of what its author wrote): the error
  names the key's path and both lines;
- nesting deeper than :data:`MAX_DEPTH` (PyYAML's composer recurses once per level, so a
  few thousand ``[`` end in a RecursionError traceback): no valid fabric or experiment file
  nests more than a handful of levels;
- aliases (``*name``) that make the document recursive (``a: &a [*a]``), nest it deeper than
  :data:`MAX_DEPTH` through a chain of anchors, or expand it past :data:`MAX_VALUES` values
  (nine nested lists of ten aliases are a billion): PyYAML builds each without complaint,
  and every later walk over the document, ours or the validator's, either recurses without
  end or takes hours. Anchors and aliases within those bounds (``<<: *defaults``) are fine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from topologies.errors import ConfigError

#: Deepest nesting of mappings and lists accepted. The deepest valid file today is an
#: experiment with an inline fabric (experiment -> fabric -> oversubscription -> value: 4
#: levels); 32 leaves room for any layout a new key needs.
MAX_DEPTH = 32
#: Most values (mappings, lists, scalars; keys included) a document may hold once its
#: aliases are expanded. The largest valid file today has a few hundred.
MAX_VALUES = 100_000


class _TooDeep(Exception):
    def __init__(self, mark: Any) -> None:
        self.mark = mark


class _Recursive(Exception):
    def __init__(self, mark: Any) -> None:
        self.mark = mark


class _TooBig(Exception):
    pass


class _Loader(yaml.SafeLoader):
    """The safe loader with a depth limit on composition."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def check_expansion(root: Node) -> None:
    """Raise _Recursive, _TooDeep or _TooBig if ``root``'s node graph, aliases followed, is
    cyclic, deeper than MAX_DEPTH or larger than MAX_VALUES. An alias is the node it names,
    so the graph is a DAG at best: each node is measured once (its height and expanded
    size memoized), and the walk never goes deeper than MAX_DEPTH + 1 calls."""
    measured: dict[int, tuple[int, int]] = {}  # id(node) -> (height, expanded size)
    open_: set[int] = set()  # nodes on the current path: meeting one again is a cycle

    def measure(node: Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in open_:
            raise _Recursive(node.start_mark)
        if key in measured:
            height, size = measured[key]
            if depth + height - 1 > MAX_DEPTH:
                raise _TooDeep(node.start_mark)
            return height, size
        if depth > MAX_DEPTH:
            raise _TooDeep(node.start_mark)
        open_.add(key)
        height, size = 1, 1
        for child in _children(node):
            child_height, child_size = measure(child, depth + 1)
            height, size = max(height, child_height + 1), size + child_size
            if size > MAX_VALUES:
                raise _TooBig
        open_.discard(key)
        measured[key] = (height, size)
        return height, size

    measure(root, 1)


def duplicate_key(node: Node | None, path: str = "") -> tuple[str, int, int] | None:
    """The first key written twice in one mapping of ``node``'s tree, as (dotted key path,
    first line, second line), or None. Merge keys (``<<``) are YAML's way of repeating on
    purpose and are not counted."""
    if isinstance(node, MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value) if isinstance(key, ScalarNode) else "?"
            where = f"{path}.{name}" if path else name
            line = key.start_mark.line + 1
            if name != "<<" and isinstance(key, ScalarNode):
                if name in seen:
                    return where, seen[name], line
                seen[name] = line
            found = duplicate_key(value, where)
            if found:
                return found
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            found = duplicate_key(item, f"{path}[{index}]")
            if found:
                return found
    return None


def parse_yaml(text: str, source: Path | str, error: type[ConfigError]) -> object:
    """The document in ``text``; a syntax error, a duplicate key or too deep a nesting raises
    ``error`` naming ``source``."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            check_expansion(node)
        found = duplicate_key(node)
        if found:
            key, first, second = found
            raise error(
                source,
                key,
                "each key once per mapping",
                detail=f"written on lines {first} and {second}",
            )
        return loader.construct_document(node) if node is not None else None
    except _TooDeep as err:
        raise error(
            source,
            "",
            f"at most {MAX_DEPTH} levels of nested mappings and lists",
            detail=f"level {MAX_DEPTH + 1} starts at {_where(err.mark)}",
        ) from None
    except _Recursive as err:
        raise error(
            source,
            "",
            "no alias inside the value of its own anchor",
            detail=f"a recursive alias at {_where(err.mark)}",
        ) from None
    except _TooBig:
        raise error(
            source,
            "",
            f"at most {MAX_VALUES} values once aliases are expanded",
            detail="aliases repeat a value each time they are used",
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise error(source, "", "valid YAML", f"a syntax error at {_where(mark)}") from None
    finally:
        loader.dispose()


def read_yaml(path: Path, error: type[ConfigError], what: str) -> object:
    """The parsed document in ``path``; a problem reading it raises ``error`` (the caller's
    ConfigError subclass), ``what`` naming the kind of file (``an existing <what> file``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(path, "", f"an existing {what} file", "no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise error(path, "", "a readable UTF-8 text file", str(err)) from None
    return parse_yaml(text, path, error)
