"""The house's import directions: which package may import which, checked on the source.

The layers, top to bottom (docs/architecture.md draws them): the entry points (``astral``'s
CLI, the pytest plugin and the Python API) -> ``study`` (several variants of an experiment)
-> ``run`` -> ``monitor``, ``calibration`` and ``forecast`` ->
``testbed`` -> ``emulation``, ``worker`` and ``results`` -> ``collectives`` -> ``topologies``.
``controllers`` is its own process: it may import ``topologies`` only, and of
``orchestrator`` only ``emulation`` starts it (and ``testbed`` reads what it publishes).
The package's own ``__init__`` (``REPO``, the checkout) is below every layer of
``orchestrator`` and imports nothing of ours. ``remote`` (SSH to another machine, whose own
``astral`` does the work) sits beside the others under the entry points and imports only
``topologies`` and the package. ``workload`` (a training iteration described: model,
parallel layout, batch, what it costs) is pure: it imports ``collectives``, ``topologies``
and the package, and ``run``, ``forecast``, ``study`` and the entry points may import it.
An import that is not drawn here is a new
arrow: either it is wrong, or the drawing (and docs/architecture.md) changes with it.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO

BELOW_TESTBED = {
    "cluster",
    "emulation",
    "worker",
    "results",
    "collectives",
    "controllers",
    "topologies",
    "package",
}

#: What ``run`` may import, and everything above it too.
BELOW_RUN = {
    "monitor",
    "diagnosis",
    "calibration",
    "forecast",
    "testbed",
    "workload",
    *BELOW_TESTBED,
}

# package -> the packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "entry": {"study", "run", "remote", *BELOW_RUN},
    "study": {"run", *BELOW_RUN},
    "run": BELOW_RUN,
    "diagnosis": {"results", "collectives", "topologies", "package"},
    "monitor": {"testbed", *BELOW_TESTBED},
    "forecast": {"testbed", "workload", *BELOW_TESTBED},
    "calibration": {"testbed", *BELOW_TESTBED},
    "testbed": BELOW_TESTBED,
    "cluster": {"emulation", "remote", "topologies", "package"},
    "emulation": {"controllers", "topologies", "package"},
    "worker": {"collectives", "topologies", "package"},
    "results": {"collectives", "topologies", "package"},
    "workload": {"collectives", "topologies", "package"},
    "collectives": {"topologies", "package"},
    "controllers": {"topologies"},
    "remote": {"topologies", "package"},
    "topologies": set(),
    "package": set(),
}

ENTRY_MODULES = {"orchestrator.cli", "orchestrator.pytest_plugin", "orchestrator.api"}


def layer(module: str) -> str | None:
    """The layer a dotted module name belongs to, or None for modules not of ours."""
    parts = module.split(".")
    if parts[0] in ("controllers", "topologies"):
        return parts[0]
    if parts[0] != "orchestrator":
        return None
    if module == "orchestrator":
        return "package"
    if module in ENTRY_MODULES or parts[1] == "commands":
        return "entry"
    return parts[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every module of ours that a file imports (top level or inside functions)."""
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from P import X`: X is a module of P or a name in P; callers strip
                # the name back to the longest module that exists.
                yield node.lineno, f"{base}.{alias.name}"


def sources() -> list[Path]:
    return sorted(
        path
        for top in ("orchestrator", "controllers", "topologies")
        for path in (REPO / top).rglob("*.py")
    )


def defining_module(target: str, modules: Collection[str]) -> str:
    """``target`` (``package.module.Name``) stripped back to the longest module of ours in
    it; unchanged when it is not ours."""
    module = target
    while module and module not in modules:
        module = module.rpartition(".")[0]
    return module or target


def wrong_arrows() -> list[str]:
    found = []
    modules = {module_name(p) for p in sources()}
    for path in sources():
        source = layer(module_name(path))
        assert source is not None
        for line, target in imports(path):
            target_layer = layer(defining_module(target, modules))
            if target_layer is None or target_layer == source:
                continue
            if target_layer not in ALLOWED[source]:
                where = f"{path.relative_to(REPO)}:{line}"
                found.append(f"{where}: {source} -> {target_layer} ({target})")
    return found


def test_every_package_has_a_layer() -> None:
    unknown = {layer(module_name(p)) for p in sources()} - set(ALLOWED)
    assert not unknown, f"packages without a place in the drawing: {sorted(map(str, unknown))}"


def test_imports_follow_the_layers() -> None:
    wrong = wrong_arrows()
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_cycles_between_modules() -> None:
    """No module imports, directly or through others, a module that imports it back."""
    names = {module_name(p): p for p in sources()}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = set()
        for _, target in imports(path):
            target = defining_module(target, names)
            if target in names and target != name:
                targets.add(target)
        graph[name] = targets
    # Package __init__ files are reached through any import of a submodule; only count
    # the modules' own edges.
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        ("orchestrator.commands.run", "orchestrator.run.runner", True),
        ("orchestrator.collectives.plans", "orchestrator.worker.launcher", False),
        ("topologies.model", "orchestrator.run.experiment", False),
        ("controllers.app", "orchestrator.emulation.network", False),
        ("orchestrator.emulation.network", "orchestrator.testbed.testbed", False),
        ("orchestrator.results.plots", "orchestrator.collectives.nccl", True),
        ("orchestrator.worker.launcher", "orchestrator", True),
        ("orchestrator", "orchestrator.run.runner", False),
        ("controllers.app", "orchestrator", False),
        ("orchestrator.commands.remote", "orchestrator.remote.operations", True),
        ("orchestrator.remote.operations", "orchestrator.run.runner", False),
        ("orchestrator.remote.jobs", "orchestrator.emulation.network", False),
        ("orchestrator.run.runner", "orchestrator.remote.connection", False),
    ],
)
def test_the_check_knows_a_wrong_arrow(source: str, target: str, allowed: bool) -> None:
    source_layer, target_layer = layer(source), layer(target)
    assert source_layer is not None and target_layer is not None
    assert (target_layer in ALLOWED[source_layer]) is allowed
