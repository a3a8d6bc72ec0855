"""Delta table schemas driven by catalog versions, never by inference.

A table is created with the columns of its newest version plus pgcdc's
position columns, with Delta's type widening enabled.  A later version:

* adds columns (``ALTER TABLE ... ADD COLUMNS``), null in older rows;
* widens a column's type where Delta can do it in place (``smallint`` ->
  ``int`` -> ``bigint``, ``float`` -> ``double``, a decimal that keeps its
  integer digits and scale; ``ALTER COLUMN ... TYPE``);
* keeps columns a version dropped (null in newer rows), so history stays
  readable.

Any other type change cannot be applied in place: it is an error that names
the fix (re-snapshot the table into a new location), never a silent cast.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pgcdc.errors import TerminalError
from streaming.schema import TableSpec

log = logging.getLogger(__name__)

_INTEGERS = ["smallint", "int", "bigint"]
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")


class SchemaEvolutionError(TerminalError):
    pass


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def widens(old: str, new: str) -> bool:
    """Whether Delta can change a column from ``old`` to ``new`` in place, losslessly."""
    if old == new:
        return True
    if old in _INTEGERS and new in _INTEGERS:
        return _INTEGERS.index(new) > _INTEGERS.index(old)
    if (old, new) == ("float", "double"):
        return True
    a, b = _DECIMAL.match(old), _DECIMAL.match(new)
    if a and b:
        (p1, s1), (p2, s2) = (int(a[1]), int(a[2])), (int(b[1]), int(b[2]))
        return s2 >= s1 and p2 - s2 >= p1 - s1
    return old in _INTEGERS and b is not None and int(b[1]) - int(b[2]) >= (5, 10, 20)[
        _INTEGERS.index(old)]


def evolve(spark: Any, path: str, spec: TableSpec, meta_columns: tuple[str, ...]) -> Any:
    """The Delta table at ``path``, created or brought to ``spec``'s shape."""
    from delta.tables import DeltaTable

    target = f"delta.{quote(path)}"
    columns = [(c.name, c.spark_type) for c in spec.columns] + [(m, "bigint")
                                                                for m in meta_columns]
    if not DeltaTable.isDeltaTable(spark, path):
        ddl = ", ".join(f"{quote(n)} {t}" for n, t in columns)
        spark.sql(f"CREATE TABLE IF NOT EXISTS {target} ({ddl}) USING DELTA "
                  "TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        return DeltaTable.forPath(spark, path)
    table = DeltaTable.forPath(spark, path)
    present = {f.name: f.dataType.simpleString() for f in table.toDF().schema.fields}
    added = [(n, t) for n, t in columns if n not in present]
    if added:
        ddl = ", ".join(f"{quote(n)} {t}" for n, t in added)
        spark.sql(f"ALTER TABLE {target} ADD COLUMNS ({ddl})")
        log.info("added columns %s to %s", [n for n, _ in added], path)
    for name, wanted in columns:
        have = present.get(name)
        if have is None or have == wanted:
            continue
        if not widens(have, wanted):
            msg = (f"column {name} of {spec.qualified_name} changed from {have} to {wanted}, "
                   f"which Delta cannot apply in place: re-snapshot the table into a new "
                   f"location (or drop {path})")
            raise SchemaEvolutionError(msg)
        spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        spark.sql(f"ALTER TABLE {target} ALTER COLUMN {quote(name)} TYPE {wanted}")
        log.info("widened %s.%s from %s to %s", path, name, have, wanted)
    return table
