"""No module of sinks/ imports another module's private (``_``) names (issue 19): what one
sink module shares with another is its public, documented API.  (A compiled module of the
package, ``sinks._fastavro`` and the like, is imported by its one Python wrapper; attribute
access to another object's private names is ruff's SLF001.)"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _private_imports(package: str, root: Path = REPO) -> list[str]:
    """``from <module> import _<name>`` in ``package``'s modules, but for compiled modules
    (those with a ``.pyi`` stub beside their binary)."""
    found = []
    for path in sorted((root / package).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                compiled = (root / node.module.replace(".", "/") / f"{name}.pyi").exists()
                if not compiled:
                    found.append(f"{path.relative_to(root)}: from {node.module} import {name}")
    return found


def test_no_sink_module_imports_private_names() -> None:
    assert _private_imports("sinks") == []


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    (tmp_path / "sinks").mkdir()
    (tmp_path / "sinks" / "_fastavro.pyi").write_text("")
    (tmp_path / "sinks" / "a.py").write_text("from sinks.avro import AvroEncoder, _PRIMITIVE\n"
                                             "from sinks import _fastavro, _other\n")
    assert _private_imports("sinks", tmp_path) == [
        "sinks/a.py: from sinks.avro import _PRIMITIVE", "sinks/a.py: from sinks import _other"]


def test_no_streaming_module_imports_private_names_of_another() -> None:
    """What the multiset apply shares with the keyed one is public (streaming/sql_text.py,
    streaming.apply's write helpers)."""
    assert [f for f in _private_imports("streaming") if ": from streaming." in f] == []
