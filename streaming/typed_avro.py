"""Typed Avro (``pgcdc run --avro-types logical``, sinks/avro_logical.py) into the lake.

A typed table version's records are decoded with its writer schema, each column as its own
Spark type, and each value is given the text the text mode's record holds for it (the
JSON envelope's text: sinks/envelope.py ``text_of``), so that the apply casts it to the
lake column exactly as it casts the text mode's (streaming/schema.py ``ColumnSpec.cast``),
and a table's lake table is the same, column types and values, whichever mode fed it:

* ``boolean``, ``int``, ``long``, ``float``, ``double``: ``CAST(... AS STRING)``, as the
  text mode's Avro primitives are read (NaN and infinities spelled as Spark spells them,
  which the cast reads back);
* ``bytes``: base64, as the text mode's;
* a decimal with its ``NaN`` branch (``numeric(p,s)``): the decimal's digits, or ``NaN``
  (which the apply keeps in ``_pgcdc_text``, the column NULL, as in text mode);
* ``date``, ``timestamp-micros`` and ``local-timestamp-micros`` (read as the numbers they
  are: the writer schema without its ``logicalType``): PostgreSQL's text of the value
  (``infinity`` for the greatest number, ``-infinity`` for the least; ``... BC`` for a
  year before 1; more than four digits for a year past 9999), which the text mode's
  records hold for the values Python cannot hold and the apply reads;
* ``time-micros``: Python's ``time.isoformat()`` (``13:14:15`` or ``13:14:15.123456``;
  ``24:00:00``), the text mode's text of a ``time`` (the lake column is a string);
* every string (text types, ``uuid``, json/jsonb, enums, unconstrained numeric, money,
  ``interval`` and every other type the typed writer spells): as it is, the text mode's
  text already.

Not applied yet: a column whose typed Avro is an ``array`` or a ``record`` (arrays,
composites, ranges, multiranges, and domains over them): the text mode's lake column is
their JSON text, which Spark does not write alike from the decoded structs.  A version
with such a column is refused (:func:`refused`) before anything of it is applied.
"""

from __future__ import annotations

import json
from typing import Any

from core import wire
from streaming.schema import TableSpec

_TIMES = {"date", "time-micros", "timestamp-micros", "local-timestamp-micros"}
_PRIMITIVES = {"boolean", "int", "long", "float", "double"}
_DAY = 86_400_000_000  # microseconds


def value_branches(avro_type: Any) -> list[Any]:
    """The branches of a field's type besides ``"null"``, wherever the union puts it (a type
    that is not a union: itself alone)."""
    branches = avro_type if isinstance(avro_type, list) else [avro_type]
    return [b for b in branches if b != "null"]


def row_fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The fields of the ``Row`` record of an envelope's writer schema, found by name: the
    record ``before`` or ``after`` defines (whichever comes first; the other names it), in
    the record's own order, whatever the order and the number of the envelope's fields or
    of a union's branches."""
    fields = {f["name"]: f for f in schema["fields"]}
    for side in (wire.BEFORE, wire.AFTER):
        for branch in value_branches(fields[side]["type"] if side in fields else []):
            if isinstance(branch, dict) and branch.get("type") == "record":
                found: list[dict[str, Any]] = branch["fields"]
                return found
    msg = (f"the writer schema {schema.get('name')!r} defines no row record in a 'before' or "
           "'after' field; it is not a pgcdc change envelope")
    raise ValueError(msg)


def kind(field: dict[str, Any]) -> str | None:
    """What a Row field holds besides NULL: ``text`` (a primitive cast to its text),
    ``bytes``, ``string``, ``decimal`` (with its NaN branch), ``date``, ``time``,
    ``timestamp``, ``timestamptz``; None for what is not applied (arrays, records)."""
    branches = value_branches(field["type"])
    if len(branches) == 2:
        first, second = branches
        if isinstance(first, dict) and first.get("logicalType") == "decimal" \
                and isinstance(second, dict) and second.get("type") == "string":
            return "decimal"
        return None
    if len(branches) != 1:
        return None
    branch = branches[0]
    if isinstance(branch, str):
        if branch in _PRIMITIVES:
            return "text"
        return branch if branch in ("bytes", "string") else None  # else: a named record
    logical = branch.get("logicalType")
    avro = branch.get("type")
    if avro == "string":
        return "string"  # uuid, json, an enum, a type spelled as text
    if (avro, logical) == ("int", "date"):
        return "date"
    if (avro, logical) == ("long", "time-micros"):
        return "time"
    if (avro, logical) == ("long", "local-timestamp-micros"):
        return "timestamp"
    if (avro, logical) == ("long", "timestamp-micros"):
        return "timestamptz"
    if avro in _PRIMITIVES and logical is None:
        return "text"
    return None  # an array, a record, a logical type this job does not know


def refused(spec: TableSpec) -> list[str]:
    """The columns of a typed table version this job does not apply, each as ``name
    (type)``; empty for a text-mode version."""
    if spec.avro_types == wire.AVRO_TYPES_TEXT or spec.value_schema is None:
        return []
    types = {c.name: c.type_name for c in spec.columns}
    out = []
    for field in row_fields(json.loads(spec.value_schema)):
        if kind(field) is None:
            name = field[wire.COLUMN_ATTRIBUTE]
            out.append(f"{name} ({types.get(name, '?')})")
    return out


def refusal(spec: TableSpec) -> str | None:
    """The message of a typed version this job refuses, naming the table, the columns and
    their types, and the fix; None when it applies the version."""
    columns = refused(spec)
    if not columns:
        return None
    return (f"table {spec.qualified_name} (version {spec.version}) is typed Avro (pgcdc run "
            f"--avro-types {spec.avro_types}) with column(s) {', '.join(columns)}, whose "
            "typed Avro is an array or a record, which pgcdc spark does not apply yet "
            "(issue 17.1): nothing of them was applied; feed the lake from pgcdc run "
            "--avro-types text (the default) into another --topic-prefix, and keep the "
            "typed topics for other consumers")


def reader_schema(schema: str) -> str:
    """The writer schema with dates, times and timestamps as the numbers they are
    (``logicalType`` left out: the same bytes), which :func:`text` spells."""

    def plain(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: plain(v) for k, v in node.items()}
            if out.get("logicalType") in _TIMES:
                del out["logicalType"]
            return out
        if isinstance(node, list):
            return [plain(v) for v in node]
        return node

    return json.dumps(plain(json.loads(schema)))


def _civil(days: str) -> tuple[str, str]:
    """``(the date's text, whether it is BC)`` of a number of days since 1970, as SQL: the
    year as PostgreSQL prints it, four digits at least, a year before 1 as ``1 - year``
    (to be followed by `` BC``)."""
    day = f"date_from_unix_date({days})"
    year = f"year({day})"
    text = (f"format_string('%04d-%02d-%02d', CASE WHEN {year} <= 0 THEN 1 - {year} "
            f"ELSE {year} END, month({day}), day({day}))")
    return text, f"{year} <= 0"


def _clock(micros: str) -> str:
    """``HH:MM:SS`` and ``.ffffff`` when there is a fraction, of microseconds in a day."""
    return (f"concat(format_string('%02d:%02d:%02d', {micros} div 3600000000, "
            f"({micros} div 60000000) % 60, ({micros} div 1000000) % 60), "
            f"CASE WHEN {micros} % 1000000 = 0 THEN '' "
            f"ELSE format_string('.%06d', {micros} % 1000000) END)")


def text(ref: str, field: dict[str, Any]) -> str:
    """A Spark SQL expression: the text mode's text of the value ``ref`` (a field of the
    struct ``from_avro`` gives with :func:`reader_schema`)."""
    found = kind(field)
    if found == "text":
        return f"CAST({ref} AS STRING)"
    if found == "bytes":
        return f"base64({ref})"
    if found == "string":
        return ref
    if found == "decimal":
        return f"coalesce(CAST({ref}.member0 AS STRING), {ref}.member1)"
    if found == "time":
        return f"CASE WHEN {ref} IS NOT NULL THEN {_clock(ref)} END"
    if found == "date":
        date, bc = _civil(f"CAST({ref} AS INT)")
        return (f"CASE WHEN {ref} = 2147483647 THEN 'infinity' "
                f"WHEN {ref} = -2147483648 THEN '-infinity' "
                f"WHEN {ref} IS NOT NULL THEN concat({date}, "
                f"CASE WHEN {bc} THEN ' BC' ELSE '' END) END")
    if found in ("timestamp", "timestamptz"):
        rest = f"pmod({ref}, {_DAY})"
        date, bc = _civil(f"CAST(({ref} - {rest}) div {_DAY} AS INT)")
        zone = "+00" if found == "timestamptz" else ""  # before BC, as PostgreSQL prints it
        return (f"CASE WHEN {ref} = 9223372036854775807 THEN 'infinity' "
                f"WHEN {ref} = -9223372036854775808 THEN '-infinity' "
                f"WHEN {ref} IS NOT NULL THEN concat({date}, ' ', {_clock(rest)}, "
                f"CASE WHEN {bc} THEN '{zone} BC' ELSE '{zone}' END) END")
    msg = f"column {field.get(wire.COLUMN_ATTRIBUTE)}: typed Avro {field['type']} is not applied"
    raise ValueError(msg)
