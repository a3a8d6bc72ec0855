"""The packages' arrows point one way (issue 19): a new upward import fails here.

Layers, top to bottom; a module may import its own package and any package below it::

    pgcdc (the application)
    streaming          the Spark apply; its bulk load reuses the load's readers
    loads              table copies into the sinks (initial load, incremental snapshots)
    sinks
    snapshot_builder   the time-travel catalog, the builder, its history and DDL capture
    decoder
    core               errors, fail points, the wire contract, Java and Maven; standard
                       library only

Every import counts, at module level or inside a function (a lazy import is still an
arrow), and so does one under ``TYPE_CHECKING``.  What does not fit the order yet is listed
in :data:`ALLOWED` with its reason; an entry no longer used fails too, so the list only
shrinks.  Besides, no two modules may import each other through a circle of module-level
imports.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LAYERS = ("pgcdc", "streaming", "loads", "sinks", "snapshot_builder", "decoder", "core")
RANK = {package: rank for rank, package in enumerate(LAYERS)}

# (importing module, imported module): why the arrow points up for now
ALLOWED: dict[tuple[str, str], str] = {
    # The one tolerated exception: a change event carries its table version, the
    # catalog's immutable object (no file circle: snapshot_builder.catalog imports only
    # decoder.values, decoder.text_parsers and decoder.pgoutput, which import nothing of
    # change.py).
    ("decoder.change", "snapshot_builder.catalog"): "a change event names its table version",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _target(name: str) -> str:
    """The module an import names: itself, or the package it is in."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def _type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): never runs."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path, *, module_level: bool) -> set[str]:
    """The project modules ``module`` imports (only those run at import time when
    ``module_level``: not in a function body)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if module_level and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if module_level and isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from package import module` names a module; `from module import name` not
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                     for alias in node.names]
        for name in names:
            if name.split(".")[0] in RANK:
                found.add(_target(name))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def _upward() -> dict[tuple[str, str], None]:
    arrows = {}
    for module, path in MODULES.items():
        mine = RANK[module.split(".")[0]]
        for imported in sorted(_imports(module, path, module_level=False)):
            if RANK[imported.split(".")[0]] < mine:
                arrows[module, imported] = None
    return arrows


def test_every_project_package_has_a_layer() -> None:
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests", "bench", "build"}
    assert packages <= set(LAYERS), f"a package without a layer: {packages - set(LAYERS)}"


def test_no_import_points_up() -> None:
    upward = _upward()
    new = [f"{a} imports {b}" for a, b in upward if (a, b) not in ALLOWED]
    assert not new, ("an import points up the layers (" + " -> ".join(LAYERS) + "): "
                     + "; ".join(new))


def test_every_allowed_exception_is_still_used() -> None:
    upward = _upward()
    stale = [f"{a} -> {b}" for a, b in ALLOWED if (a, b) not in upward]
    assert not stale, f"no longer imported, remove from ALLOWED: {stale}"


def test_no_module_level_import_circle() -> None:
    graph = {m: _imports(m, p, module_level=True) for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(module: str) -> None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                circle = path[path.index(imported):] + [imported]
                pytest.fail("a circle of module-level imports: " + " -> ".join(circle))
            if imported not in state:
                walk(imported)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The test itself: an upward import in a library module is found."""
    path = tmp_path / "fake.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "from pgcdc.pipeline import Pipeline\n"
                    "from sinks import kafka\n"
                    "if TYPE_CHECKING:\n    from streaming.job import run\n"
                    "def f():\n    import loads.signals\n")
    assert _imports("decoder.fake", path, module_level=False) == {
        "pgcdc.pipeline", "sinks.kafka", "streaming.job", "loads.signals"}
    assert _imports("decoder.fake", path, module_level=True) == {"pgcdc.pipeline", "sinks.kafka"}


def test_core_needs_only_the_standard_library() -> None:
    """core/ (errors, fail points, the wire contract, Java and Maven) is what a consumer of
    pgcdc's topics may import without the producer's dependencies: the standard library and
    core itself."""
    third_party = set()
    for module, path in MODULES.items():
        if module.split(".")[0] != "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and \
                not node.level else []
            third_party.update(f"{module}: {n}" for n in names
                               if n.split(".")[0] not in {*sys.stdlib_module_names, "core"})
    assert not third_party, sorted(third_party)
