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
  text already;
* an ``array`` or a ``record`` (arrays, composites, ranges, multiranges, domains over them):
  the JSON text the text mode's record holds for the value (sinks/envelope.py ``text_of``,
  Python's ``json`` with ``separators=(",", ":")`` and ``ensure_ascii=False``), built in
  Spark SQL by :func:`json_text` from the decoded value: ``[...]`` of the elements (nested
  arrays nested, ``null`` elements kept), ``{"attribute":...}`` of a composite's attributes
  in the type's order, ``{"lower":...,"upper":...,"lower_inc":...,"upper_inc":...,
  "empty":...}`` of a range, each element, attribute or bound in its own JSON form: integers
  and booleans their digits and ``true``/``false``; floats Python's ``repr`` (the shortest
  digits that read back, ``1e-05``, ``1e+16``, ``NaN``, ``Infinity``); a ``numeric(p,s)``
  ``str`` of Python's ``Decimal`` (``"1.50"``, ``"1.0E-7"``, ``"0E-8"``); dates, times and
  timestamps Python's ``isoformat`` (``"2024-02-29T13:14:15.500000+00:00"``) and
  PostgreSQL's text for what Python cannot hold (``"infinity"``,
  ``"0044-03-15 12:00:00.5 BC"``, years past 9999); ``bytes`` base64;
  strings quoted with Python's escapes (a quote, a backslash, ``\\n``, ``\\u001f``); the
  string types whose text is itself JSON (``xid``, ``xid8``, ``cid``, ``pg_lsn`` numbers;
  geometric types, ``hstore``, PostGIS objects) as they are.

A field whose typed Avro this job does not know (a logical type it does not spell) is
refused (:func:`refused`) before anything of its version is applied.
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
    ``timestamp``, ``timestamptz``, ``json`` (an array or a record, spelled as the text
    mode's JSON by :func:`json_text`); None for what is not applied (a logical type this
    job does not know, anywhere in the field's type)."""
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
        if branch in ("bytes", "string"):
            return branch
    if isinstance(branch, str) or branch.get("type") in ("array", "record"):
        try:
            json_text("x", field)
        except ValueError:
            return None
        return "json"
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
    return None  # a logical type this job does not know


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
            "typed Avro (a logical type) pgcdc spark does not know: nothing of them was "
            "applied; feed the lake from pgcdc run "
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


def _date_text(ref: str) -> str:
    """PostgreSQL's text of a (non-null) date's days since 1970 (Python's ``isoformat`` for
    years 1 to 9999)."""
    date, bc = _civil(f"CAST({ref} AS INT)")
    return (f"CASE WHEN {ref} = 2147483647 THEN 'infinity' "
            f"WHEN {ref} = -2147483648 THEN '-infinity' "
            f"ELSE concat({date}, CASE WHEN {bc} THEN ' BC' ELSE '' END) END")


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
    if found == "json":
        return f"CASE WHEN {ref} IS NOT NULL THEN {json_text(ref, field)} END"
    if found == "date":
        return f"CASE WHEN {ref} IS NOT NULL THEN {_date_text(ref)} END"
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


# --- arrays and records: the text mode's JSON text ---------------------------------------------

_NUMBER_STRINGS = {"xid", "xid8", "cid", "pg_lsn"}  # a Python int in the text mode's JSON
_OBJECT_STRINGS = {"point", "line", "lseg", "box", "path", "polygon", "circle"}
_OBJECT_EXTENSIONS = {"hstore", "geometry", "geography"}  # named schema.type
_LONG_MAX, _LONG_MIN = 9223372036854775807, -9223372036854775808


def sql_string(value: str) -> str:
    """A Spark SQL string literal of ``value`` (backslashes and quotes escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


_JACKSON_FRAME = sql_string('^[{]"s":|[}]$')  # to_json(named_struct('s', ...)) less the object
# Jackson's \u000B ... \u001F (not after an escaped backslash) in Python's lower case
_UPPER_HEX = tuple((sql_string(r"(?<!\\)((?:\\\\)*)\\u00([01])" + letter),
                    sql_string(r"$1\\u00$2" + letter.lower())) for letter in "ABCDEF")


def json_string(ref: str) -> str:
    """Spark SQL: the JSON string of the (non-null) string ``ref`` as Python's ``json``
    writes it with ``ensure_ascii=False``: a quote, a backslash and the control characters
    escaped (``\\n``, ``\\t``, ... and ``\\u00XX`` with lowercase hex), nothing else.  Spark's
    ``to_json`` (Jackson) escapes the same characters alike but for the hex digits of
    ``\\u000B``, ``\\u000E``, ``\\u000F``, ``\\u001A`` to ``\\u001F``, which it writes in
    upper case: in a string holding one of those, they are put in lower case (where the
    backslash before them is not itself escaped)."""
    text = f"regexp_replace(to_json(named_struct('s', {ref})), {_JACKSON_FRAME}, '')"
    fixed = text
    for pattern, replacement in _UPPER_HEX:
        fixed = f"regexp_replace({fixed}, {pattern}, {replacement})"
    return (f"CASE WHEN {ref} RLIKE '[\\\\x0b\\\\x0e\\\\x0f\\\\x1a-\\\\x1f]' THEN {fixed} "
            f"ELSE {text} END")


def _let(value: str, name: str, body: str) -> str:
    """``body`` with ``name`` bound to ``value`` (computed once)."""
    return f"element_at(transform(array({value}), {name} -> {body}), 1)"


def float_repr(ref: str, *, single: bool, name: str) -> str:
    """Spark SQL: Python's ``repr`` of the (non-null) float or double ``ref``, which its
    ``json`` writes: the shortest digits that read back as the value (for a ``float``, as
    a float: PostgreSQL's text of a ``real``, which Python reads as a double whose repr has
    those digits), fixed notation from ``1e-4`` to below ``1e16`` (``100.0``, ``0.0001``),
    else ``1e-05``, ``1.5e+300`` (the exponent's two digits at least, as Java's ``%e``);
    ``NaN``, ``Infinity``, ``-Infinity``.

    The digits are the first of Java's ``%.Ne`` (N = 0, 1, ...) that cast back to the
    value; Java rounds its own shortest digits (``Double.toString``'s), so where Java 17's
    are not the shortest the rounding is of those, not of the exact binary value.
    """
    kind = "FLOAT" if single else "DOUBLE"
    p, c = f"{name}p", f"{name}c"
    shortest = (f"element_at(filter(transform(sequence(0, {8 if single else 16}), {p} -> "
                f"format_string(concat('%.', {p}, 'e'), CAST({ref} AS DOUBLE))), "
                f"{c} -> CAST({c} AS {kind}) = {ref}), 1)")
    exponent = f"CAST(substring_index({name}, 'e', -1) AS INT)"
    fixed = (f"regexp_replace(regexp_replace(CAST(CAST(regexp_replace({name}, '^-', '') AS "
             f"DECIMAL(38, 21)) AS STRING), '0+$', ''), '[.]$', '.0')")
    layout = (f"CASE WHEN {exponent} < -4 OR {exponent} >= 16 "
              f"THEN regexp_replace({name}, '[.]?0+e', 'e') "
              f"ELSE concat(CASE WHEN {name} LIKE '-%' THEN '-' ELSE '' END, {fixed}) END")
    return (f"CASE WHEN isnan({ref}) THEN 'NaN' "
            f"WHEN {ref} = CAST('Infinity' AS {kind}) THEN 'Infinity' "
            f"WHEN {ref} = CAST('-Infinity' AS {kind}) THEN '-Infinity' "
            f"ELSE {_let(shortest, name, layout)} END")


def decimal_str(ref: str, scale: int, *, name: str) -> str:
    """Spark SQL: ``str()`` of the Python ``Decimal`` PostgreSQL's text of the (non-null)
    ``decimal(p, scale)`` ``ref`` reads as (its exponent is ``-scale``): the plain digits,
    or, below ``1e-6``, scientific notation (``1.0E-7``, ``0E-8``)."""
    plain = f"CAST({ref} AS STRING)"
    if scale <= 6:  # Python's adjusted exponent is -scale at least
        return plain
    digits = (f"coalesce(nullif(regexp_replace(regexp_replace({name}, '[-.]', ''), '^0+', ''), "
              f"''), '0')")
    d = f"{name}d"
    scientific = (f"concat(CASE WHEN {ref} < 0 THEN '-' ELSE '' END, substr({d}, 1, 1), "
                  f"CASE WHEN length({d}) > 1 THEN concat('.', substr({d}, 2)) ELSE '' END, "
                  f"'E', CAST(length({d}) - {1 + scale} AS STRING))")
    return (f"CASE WHEN {ref} > -0.000001 AND {ref} < 0.000001 "
            f"THEN {_let(plain, name, _let(digits, d, scientific))} ELSE {plain} END")


def _clock_trimmed(micros: str) -> str:
    """``HH:MM:SS`` and the fraction without its trailing zeros, as PostgreSQL prints it."""
    return (f"concat(format_string('%02d:%02d:%02d', {micros} div 3600000000, "
            f"({micros} div 60000000) % 60, ({micros} div 1000000) % 60), "
            f"regexp_replace(CASE WHEN {micros} % 1000000 = 0 THEN '' "
            f"ELSE format_string('.%06d', {micros} % 1000000) END, '0+$', ''))")


def _iso_timestamp(ref: str, *, utc: bool, name: str) -> str:
    """Spark SQL: the JSON of a (non-null) timestamp's microseconds as the text mode's is:
    Python's ``isoformat()`` (``2024-02-29T13:14:15.123456``, ``+00:00`` for a
    ``timestamptz``) for years 1 to 9999, else PostgreSQL's text (``infinity``,
    ``0044-03-15 12:00:00.5 BC``, ``10000-01-01 00:00:00``)."""
    rest, day = f"{name}r", f"{name}d"
    year = f"year({day})"
    date = (f"format_string('%04d-%02d-%02d', CASE WHEN {year} <= 0 THEN 1 - {year} "
            f"ELSE {year} END, month({day}), day({day}))")
    zone = "+00" if utc else ""
    body = (f"CASE WHEN {year} BETWEEN 1 AND 9999 THEN concat('\"', {date}, 'T', "
            f"{_clock(rest)}, '{zone}{':00' if utc else ''}\"') "
            f"ELSE concat('\"', {date}, ' ', {_clock_trimmed(rest)}, "
            f"CASE WHEN {year} <= 0 THEN '{zone} BC' ELSE '{zone}' END, '\"') END")
    days = f"date_from_unix_date(CAST(({ref} - {rest}) div {_DAY} AS INT))"
    split = _let(f"pmod({ref}, {_DAY})", rest, _let(days, day, body))
    return (f"CASE WHEN {ref} = {_LONG_MAX} THEN '\"infinity\"' "
            f"WHEN {ref} = {_LONG_MIN} THEN '\"-infinity\"' ELSE {split} END")


class _Json:
    """The Spark SQL of one field's JSON text, its named types looked up in the field."""

    def __init__(self, avro_type: Any) -> None:
        self.names: dict[str, dict[str, Any]] = {}
        self.count = 0
        self._collect(avro_type, "")

    def _collect(self, node: Any, namespace: str) -> None:
        if isinstance(node, list):
            for branch in node:
                self._collect(branch, namespace)
        elif isinstance(node, dict):
            if node.get("type") == "record":
                namespace = node.get("namespace", namespace)
                self.names[f"{namespace}.{node['name']}" if namespace else node["name"]] = node
                self.names.setdefault(node["name"], node)
                for field in node.get("fields", []):
                    self._collect(field["type"], namespace)
            elif node.get("type") == "array":
                self._collect(node["items"], namespace)

    def _name(self) -> str:
        self.count += 1
        return f"_pgcdc_j{self.count}"

    def value(self, ref: str, avro_type: Any) -> str:
        """The JSON of a slot (``null`` for NULL; a union of several branches is the struct
        of ``member0``, ``member1`` ... Spark's ``from_avro`` decodes it to)."""
        branches = value_branches(avro_type)
        if not branches:
            return "'null'"
        if len(branches) == 1:
            body = self.single(ref, branches[0])
        else:
            cases = " ".join(f"WHEN {ref}.member{i} IS NOT NULL THEN "
                             f"{self.single(f'{ref}.member{i}', b)}"
                             for i, b in enumerate(branches))
            body = f"CASE {cases} ELSE 'null' END"
        return f"CASE WHEN {ref} IS NULL THEN 'null' ELSE {body} END"

    def single(self, ref: str, branch: Any) -> str:
        """The JSON of a non-null value of one branch."""
        if isinstance(branch, str):
            if branch in ("boolean", "int", "long"):
                return f"CAST({ref} AS STRING)"
            if branch in ("float", "double"):
                return float_repr(ref, single=branch == "float", name=self._name())
            if branch == "bytes":
                return json_string(f"replace(base64({ref}), concat(chr(13), chr(10)), '')")
            if branch == "string":
                return json_string(ref)
            if branch not in self.names:
                msg = f"the named type {branch!r} is not defined in the field"
                raise ValueError(msg)
            return self.single(ref, self.names[branch])
        avro, logical = branch.get("type"), branch.get("logicalType")
        if avro == "array":
            name = self._name()
            return (f"concat('[', array_join(transform({ref}, {name} -> "
                    f"{self.value(name, branch['items'])}), ','), ']')")
        if avro == "record":
            parts = []
            for i, field in enumerate(branch["fields"]):
                key = json.dumps(field.get("pgcdc.attribute", field["name"]), ensure_ascii=False)
                parts.append(sql_string(("{" if i == 0 else ",") + key + ":"))
                parts.append(self.value(f"{ref}.`{field['name']}`", field["type"]))
            return f"concat({', '.join(parts or [sql_string('{')])}, '}}')"
        if avro == "bytes" and logical == "decimal":
            digits = decimal_str(ref, int(branch.get("scale", 0)), name=self._name())
            return f"concat('\"', {digits}, '\"')"
        if avro == "string":
            kind = str(branch.get("pgcdc.type", ""))
            if logical is None and kind in _NUMBER_STRINGS:
                return ref
            if logical is None and (kind in _OBJECT_STRINGS
                                    or kind.rsplit(".", 1)[-1] in _OBJECT_EXTENSIONS):
                return f"CASE WHEN {ref} LIKE '{{%' THEN {ref} ELSE {json_string(ref)} END"
            return json_string(ref)
        if (avro, logical) == ("int", "date"):
            return f"concat('\"', {_date_text(ref)}, '\"')"
        if (avro, logical) == ("long", "time-micros"):
            return f"concat('\"', {_clock(ref)}, '\"')"
        if avro == "long" and logical in ("local-timestamp-micros", "timestamp-micros"):
            return _iso_timestamp(ref, utc=logical == "timestamp-micros", name=self._name())
        if logical is None and avro in _PRIMITIVES | {"bytes", "string"}:
            return self.single(ref, avro)
        msg = f"typed Avro {branch} is not applied"
        raise ValueError(msg)


def json_text(ref: str, field: dict[str, Any]) -> str:
    """A Spark SQL expression: the text mode's JSON text of the non-null array or record
    ``ref`` (a field of the struct ``from_avro`` gives with :func:`reader_schema`): what
    sinks/envelope.py ``text_of`` writes for the value the text mode decodes; raises
    ``ValueError`` for a type it does not spell."""
    spelling = _Json(field["type"])
    branches = value_branches(field["type"])
    if len(branches) != 1:
        msg = (f"column {field.get(wire.COLUMN_ATTRIBUTE)}: typed Avro {field['type']} is "
               "not applied")
        raise ValueError(msg)
    return spelling.single(ref, branches[0])
