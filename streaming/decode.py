"""A micro-batch's change records decoded: the batch's events, and each table's typed events.

Two steps, so that a typed record's value reaches its lake column without passing through
text, and no map of every value's text is built for the whole batch:

1. :func:`parse_envelopes`: every record of the batch, whatever its format and table, in
   one frame (:data:`EVENT_COLUMNS`): ``op``, ``source`` (the fields of
   :data:`SOURCE_READ`), the record's format and version headers, its value as it came,
   and the text of its own version's key columns (``_keys``; of the old row's, ``_old_keys``:
   the batch's key ranges, streaming/apply.py ``batch_bounds``).  What the batch-wide
   steps read (versions, operations, truncates, key ranges, pulls of earlier topics); the
   apply keeps it once per batch.
2. :func:`table_events`: one table's events decoded again from their values, one table
   version at a time, straight into its lake table's shape: ``before`` and ``after``
   structs with a field per column of the table's newest version (:func:`content`, in the
   column's lake type; :func:`untyped`, for a column whose lake type does not hold every
   value, PostgreSQL's text of a value it does not hold: the row's ``_pgcdc_text`` entry),
   and ``unchanged`` (the unchanged TOASTed columns) by their newest names.  A renamed
   column is read under the name the version gave it and a retyped one with the lenient
   cast (both known per version before anything runs: no test of the version per row).

Per format, a value becomes its lake column's as follows:

* typed Avro (``pgcdc run --avro-types logical``, sinks/avro_logical.py): straight from
  its Avro type: a boolean, an integer, a float or a double cast to the column's type;
  ``bytes`` as they are; a decimal as the decimal it is (its ``NaN`` branch: NULL, and
  ``NaN`` in ``_pgcdc_text``); ``date`` from its days since 1970; ``timestamp-micros`` and
  ``local-timestamp-micros`` from their microseconds (PostgreSQL's infinities are the
  greatest and least longs, which are Spark's greatest and least timestamps); a string as
  it is.  What the lake keeps as a string (times, arrays, composites, ranges) is spelled as
  the text mode's records spell it (streaming/typed_avro.py);
* text-mode Avro and JSON: the value's text cast by
  :meth:`streaming.schema.ColumnSpec.cast` (JSON is text; a text-mode Avro field is a
  string where Avro has no primitive).

Either way the lake table is the same, column types and values, whichever format fed it
(tests/integration/test_spark_typed_avro.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from core import wire
from core.wire import (
    AFTER,
    BEFORE,
    FORMAT_AVRO,
    FORMAT_AVRO_CONFLUENT,
    FORMAT_DEBEZIUM_JSON,
    FORMAT_HEADER,
    FORMAT_JSON,
    OP,
    SOURCE,
    TABLE_VERSION_HEADER,
    UNCHANGED,
    catalog_history_topic,
)
from streaming import sql_text, typed_avro
from streaming.catalog import CatalogLog
from streaming.evolution import quote
from streaming.schema import ColumnSpec, TableSpec, renamed_names, retyped_versions


class CatalogMismatchError(Exception):
    """An event names a table version the catalog log does not hold."""


# what the apply reads of the envelope's source block (core/wire.py), with its Spark type
SOURCE_READ = ((wire.SOURCE_COMMIT_LSN, "BIGINT"), (wire.SOURCE_ORDINAL, "BIGINT"),
               (wire.SOURCE_TABLE_OID, "BIGINT"), (wire.SOURCE_TABLE_VERSION, "STRING"),
               (wire.SOURCE_SCHEMA, "STRING"), (wire.SOURCE_TABLE, "STRING"))

_SOURCE_TYPE = f"STRUCT<{', '.join(f'{name}: {kind}' for name, kind in SOURCE_READ)}>"
_IMAGES = (f"{BEFORE} MAP<STRING, STRING>, {AFTER} MAP<STRING, STRING>, "
           f"{UNCHANGED} ARRAY<STRING>")
# the JSON envelope as it is read: what the apply uses of it, by name
ENVELOPE_SCHEMA = f"{OP} STRING, {_IMAGES}, {SOURCE} {_SOURCE_TYPE}"

KEYS = "_keys"  # the text of each key column of the event's version (new row, else old)
OLD_KEYS = "_old_keys"  # and of the old row's (an update's or a delete's ``before``)
TOASTED = "_toasted"  # whether the event names columns whose TOASTed value was not resent
# the columns of :func:`parse_envelopes`
EVENT_COLUMNS = (OP, SOURCE, "_format", "_version", "value", KEYS, OLD_KEYS, TOASTED)

_HEADER = "CAST(element_at(filter(headers, h -> h.key = '{0}'), 1).value AS STRING)"

# the format header_rows gives a record of the catalog history topic
# (``<prefix>._catalog_history``, sinks/kafka.py), which the job subscribes to beside the
# table topics so that a DDL with no row change after it (a table dropped or renamed last)
# still makes a micro-batch, which reads the catalog again and follows it
CATALOG_FORMAT = "catalog"


def header_rows(batch: Any) -> Any:
    """A batch's change records (Kafka tombstones left out) with their format and version;
    a catalog history record (its topic's, without a table version) has the format
    :data:`CATALOG_FORMAT`."""
    version = _HEADER.format(TABLE_VERSION_HEADER)
    form = f"coalesce({_HEADER.format(FORMAT_HEADER)}, '{FORMAT_JSON}')"
    if "topic" in batch.columns:
        suffix = catalog_history_topic("")
        form = (f"CASE WHEN endswith(topic, '{suffix}') AND {version} IS NULL "
                f"THEN '{CATALOG_FORMAT}' ELSE {form} END")
    return batch.where("value IS NOT NULL").selectExpr(
        "value", f"{form} AS _format", f"{version} AS _version")


def batch_versions(rows: Any) -> list[tuple[str, str | None]]:
    """The distinct (format, header version) pairs of :func:`header_rows`."""
    return [(str(r[0]), None if r[1] is None else str(r[1]))
            for r in rows.select("_format", "_version").distinct().collect()]


def _check_formats(versions: list[tuple[str, str | None]]) -> None:
    unknown = sorted({f for f, _ in versions}
                     - {FORMAT_JSON, FORMAT_AVRO, FORMAT_AVRO_CONFLUENT})
    if FORMAT_DEBEZIUM_JSON in unknown:
        msg = ("events in Debezium's JSON encoding (header pgcdc.format debezium-json: pgcdc "
               "run --format json's default), which this job does not read (its interval and "
               "adaptive times lose what the lake keeps): run pgcdc with --json-mode pgcdc "
               "(sink.json_mode = \"pgcdc\") or --format avro, into a new --topic-prefix")
        raise CatalogMismatchError(msg)
    if unknown:
        msg = (f"events in format(s) {unknown} (the pgcdc.format header); this job reads "
               "json, avro and avro-confluent: run a pgcdc release that knows the format")
        raise CatalogMismatchError(msg)


def _writer(catalog: CatalogLog | dict[str, TableSpec], version: str) -> TableSpec:
    """The table version whose writer schema decodes Avro records of ``version``."""
    spec = (catalog.get(version) if isinstance(catalog, dict)
            else catalog.by_version(version))
    if spec is None or spec.value_schema is None:
        msg = (f"Avro events of table version {version} but the catalog log holds no "
               "writer schema for it; the catalog topic is incomplete")
        raise CatalogMismatchError(msg)
    refusal = typed_avro.refusal(spec)  # a logical type this job does not know
    if refusal is not None:
        raise CatalogMismatchError(refusal)
    return spec


def parse_envelopes(batch: Any, catalog: CatalogLog, *, rows: Any = None,
                    versions: list[tuple[str, str | None]] | None = None) -> Any:
    """Every change of a batch in the columns :data:`EVENT_COLUMNS`, whatever its format
    (the union of :func:`parse_parts`)."""
    return union(parse_parts(batch, catalog, rows=rows, versions=versions))


def union(frames: Sequence[Any]) -> Any:
    """The frames' rows in one frame, their columns matched by name."""
    return reduce(lambda out, frame: out.unionByName(frame), frames[1:], frames[0])


def parse_parts(batch: Any, catalog: CatalogLog, *, rows: Any = None,
                versions: list[tuple[str, str | None]] | None = None) -> list[Any]:
    """Every change of a batch in the columns :data:`EVENT_COLUMNS`, whatever its format:
    the JSON records in one frame, each Avro version's in one of its own.

    Avro values are decoded with the writer schema of the version their
    ``pgcdc.table_version`` header names, one version at a time (in the Confluent wire
    format, ``pgcdc.format`` avro-confluent, after the 5 bytes of the magic byte and the
    registry's schema id: the catalog log's writer schema is the registered one); the decoded
    ``source.table_version`` must agree with the header (checked by
    ``streaming.apply.summarize``).  Tombstones are skipped.
    """
    from pyspark.sql import functions as F

    if rows is None:
        rows = header_rows(batch)
    if versions is None:
        versions = batch_versions(rows)
    _check_formats(versions)
    parts = []
    if any(f == FORMAT_JSON for f, _ in versions):  # no pass over the batch for an absent format
        parts.append(_json_events(rows.where(f"_format = '{FORMAT_JSON}'"), catalog,
                                  [v for f, v in versions if f == FORMAT_JSON and v]))
    for form, version in sorted({(f, v) for f, v in versions
                                 if f in (FORMAT_AVRO, FORMAT_AVRO_CONFLUENT)}, key=str):
        spec = _writer(catalog, str(version))
        part = rows.where((F.col("_format") == form) & (F.col("_version") == version))
        parts.append(_avro_events(part, form, spec))
    if not parts:  # an empty batch: its (empty) rows in the events' shape
        parts.append(_json_events(rows, catalog, []))
    return parts


def _source(decoded: str) -> str:
    """The :data:`SOURCE_READ` fields of the decoded envelope ``decoded``."""
    fields = ", ".join(f"'{name}', {decoded}.{SOURCE}.{name}" for name, _ in SOURCE_READ)
    return f"named_struct({fields}) AS {SOURCE}"


def _toasted(decoded: str) -> str:
    """:data:`TOASTED` of the decoded envelope ``decoded``."""
    return f"coalesce(size({decoded}.{UNCHANGED}) > 0, false) AS {TOASTED}"


def _json_events(rows: Any, catalog: CatalogLog, versions: list[str]) -> Any:
    """JSON records of ``versions`` (those their headers name) as :data:`EVENT_COLUMNS`."""
    from pyspark.sql import functions as F

    names = {}  # a version's key columns, by version
    for version in set(versions):
        spec = catalog.by_version(version)
        if spec is not None and spec.key_columns:
            names[version] = spec.key_columns
    if names:
        lookup = ", ".join(
            f"{sql_text.literal(v)}, array({', '.join(sql_text.literal(c.name) for c in keys)})"
            for v, keys in sorted(names.items()))
        found = f"element_at(map({lookup}), e.{SOURCE}.{wire.SOURCE_TABLE_VERSION})"
        keys = f"transform({found}, n -> coalesce(e.{AFTER}[n], e.{BEFORE}[n]))"
        old = f"transform({found}, n -> e.{BEFORE}[n])"
    else:
        keys = old = "CAST(NULL AS ARRAY<STRING>)"
    return rows.select(F.from_json(F.col("value").cast("string"), ENVELOPE_SCHEMA).alias("e"),
                       "_format", "_version", "value").selectExpr(
        f"e.{OP} AS {OP}", _source("e"), "_format", "_version", "value",
        f"{keys} AS {KEYS}", f"{old} AS {OLD_KEYS}", _toasted("e"))


def _avro_value(form: str) -> str:
    """The Avro binary of a record: after the magic byte and the schema id in the Confluent
    wire format."""
    return "substring(value, 6)" if form == FORMAT_AVRO_CONFLUENT else "value"


def _reader(spec: TableSpec) -> tuple[str, dict[str, dict[str, Any]], bool]:
    """The reader schema of a version's Avro values, its row fields by column name, and
    whether they are typed (their dates, times and timestamps read as the numbers they are:
    typed_avro.reader_schema).  Fields are read by name, never by position, so a writer
    schema whose envelope fields, row fields or union branches come in another order, or
    with fields added, gives each value to its own column."""
    schema = spec.value_schema
    assert schema is not None
    fields = {f[wire.COLUMN_ATTRIBUTE]: f for f in typed_avro.row_fields(json.loads(schema))}
    typed = spec.avro_types != wire.AVRO_TYPES_TEXT
    return (typed_avro.reader_schema(schema) if typed else schema), fields, typed


def avro_text(ref: str, field: dict[str, Any], *, typed: bool) -> str:
    """The Spark SQL text of the value ``ref`` (a row field of a decoded struct) as the text
    mode's record holds it: a text-mode field cast to a string (``bytes`` base64), a typed
    one spelled by :func:`streaming.typed_avro.text`."""
    if typed:
        return typed_avro.text(ref, field)
    if typed_avro.value_branches(field["type"]) == ["bytes"]:
        return f"base64({ref})"
    return f"CAST({ref} AS STRING)"


def _avro_events(rows: Any, form: str, spec: TableSpec) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    reader, fields, typed = _reader(spec)
    keys, old = [], []
    for column in spec.key_columns:
        field = fields.get(column.name)
        if field is None:
            keys.append("CAST(NULL AS STRING)")
            old.append("CAST(NULL AS STRING)")
            continue
        new_text, old_text = (avro_text(f"e.{side}.{quote(field['name'])}", field, typed=typed)
                              for side in (AFTER, BEFORE))
        keys.append(f"coalesce({new_text}, {old_text})")
        old.append(old_text)
    decoded = rows.select(from_avro(F.expr(_avro_value(form)), reader).alias("e"),
                          "_format", "_version", "value")
    return decoded.selectExpr(
        f"e.{OP} AS {OP}", _source("e"), "_format", "_version", "value",
        f"CAST(array({', '.join(keys)}) AS ARRAY<STRING>) AS {KEYS}",
        f"CAST(array({', '.join(old)}) AS ARRAY<STRING>) AS {OLD_KEYS}", _toasted("e"))


# --- one table's events, typed ------------------------------------------------------------

def content(i: int) -> str:
    """The field of an image holding the ``i``-th column's value, in its lake type."""
    return f"_c{i}"


def untyped(i: int) -> str:
    """The field of an image holding the ``i``-th column's text where its typed value is
    NULL though the value is not (only for a column whose type may not hold a value:
    :meth:`streaming.schema.ColumnSpec.untyped`)."""
    return f"_u{i}"


def narrow(column: ColumnSpec) -> bool:
    """Whether the column's lake type may not hold a value (it has an :func:`untyped`
    field)."""
    return column.untyped("x") is not None


# Spark types a try_cast from PostgreSQL's text of another type gives exactly or as NULL
_LENIENT = frozenset({"string", "boolean", "smallint", "int", "bigint", "float", "double"})


def lenient_cast(column: ColumnSpec, text: str) -> str:
    """The value of a text written under a version in which the column had another type (a
    retype since): NULL where the old text does not convert.  Such a row is read again from
    the source (the retype rewrote the table), so the value is a placeholder until then,
    never a failed batch."""
    spark_type = column.spark_type
    if spark_type in _LENIENT or spark_type.startswith("decimal"):
        return f"try_cast({text} AS {spark_type})"
    return f"CAST(NULL AS {spark_type})"


_PRIMITIVE_LAKE = frozenset({"boolean", "smallint", "int", "bigint", "float", "double"})


def from_text(column: ColumnSpec, text: str, *, stale: bool) -> tuple[str, str]:
    """A column's value and :func:`untyped` text from the value's text."""
    value = lenient_cast(column, text) if stale else column.cast(text)
    return value, column.untyped(text) or "CAST(NULL AS STRING)"


def _from_typed(column: ColumnSpec, ref: str, field: dict[str, Any]) -> tuple[str, str]:
    """A column's value and :func:`untyped` text straight from a typed Avro field of the
    column's own version (module docstring); what the lake keeps as text, from its text."""
    found, spark_type = typed_avro.kind(field), column.spark_type
    none = "CAST(NULL AS STRING)"
    if found == "text" and spark_type in _PRIMITIVE_LAKE:
        return f"CAST({ref} AS {spark_type})", none
    if (found, spark_type) in (("bytes", "binary"), ("string", "string")):
        return ref, none
    if found == "decimal" and spark_type.startswith("decimal"):
        number = f"{ref}.member0"
        value = f"CAST({number} AS {spark_type})"
        # the NaN branch; a decimal the column cannot hold (never from its own version)
        text = (f"CASE WHEN {number} IS NULL THEN {ref}.member1 "
                f"WHEN {value} IS NULL THEN CAST({number} AS STRING) END")
        return value, text
    if (found, spark_type) == ("date", "date"):
        return f"date_from_unix_date({ref})", none
    if (found, spark_type) == ("timestamptz", "timestamp"):
        return f"timestamp_micros({ref})", none
    if (found, spark_type) == ("timestamp", "timestamp_ntz"):  # (the session's zone is UTC)
        return f"CAST(timestamp_micros({ref}) AS TIMESTAMP_NTZ)", none
    return from_text(column, typed_avro.text(ref, field), stale=False)


def _image(spec: TableSpec, image: str | None,
           values: Sequence[tuple[str, str] | None]) -> str:
    """An event's ``before`` or ``after`` struct: per column of ``spec`` its value and
    untyped text (None: the version has no such column); NULL where ``image`` (the decoded
    image, if it may be absent) is."""
    fields = []
    for i, (column, found) in enumerate(zip(spec.columns, values, strict=True)):
        value, text = found or (f"CAST(NULL AS {column.spark_type})", "CAST(NULL AS STRING)")
        fields.append(f"'{content(i)}', CAST({value} AS {column.spark_type})")
        if narrow(column):
            fields.append(f"'{untyped(i)}', CAST({text} AS STRING)")
    if not fields:  # a table without columns: one placeholder field
        fields.append(f"'{content(0)}', CAST(NULL AS BOOLEAN)")
    struct = f"named_struct({', '.join(fields)})"
    return struct if image is None else f"CASE WHEN {image} IS NULL THEN NULL ELSE {struct} END"


def _unchanged(renames: dict[str, dict[str, str | None]], version: str) -> str:
    """The event's unchanged TOASTed columns by their newest names."""
    cases = " ".join(f"WHEN {sql_text.literal(old)} THEN {sql_text.literal(name)}"
                     for name, by_version in renames.items()
                     if (old := by_version.get(version)) is not None and old != name)
    unchanged = f"coalesce(e.{UNCHANGED}, CAST(array() AS ARRAY<STRING>))"
    return f"transform({unchanged}, u -> CASE u {cases} ELSE u END)" if cases else unchanged


def table_events(events: Any, spec: TableSpec, versions: Sequence[TableSpec],
                 encodings: Sequence[tuple[str, str]], *, lenient: bool = True) -> Any:
    """The events of table ``spec.oid`` among ``events`` (:func:`parse_envelopes`), typed:
    ``op``, ``source``, ``unchanged`` (by the newest names), ``before`` and ``after`` (NULL
    where the event has no such image), structs of the newest version's columns (module
    docstring).  ``versions``: the table's versions (streaming/catalog.py); ``encodings``:
    the (format, table version) pairs its events hold, each decoded on its own.  A column
    retyped since an event's version is cast leniently (:func:`lenient_cast`), unless not
    ``lenient`` (the keyless apply matches rows by the values the strict cast gives)."""
    by_version = {v.version: v for v in versions}
    by_version.setdefault(spec.version, spec)
    renames = renamed_names(spec, list(versions))
    retyped = retyped_versions(spec, list(versions))
    branches = []
    for form, version in sorted(set(encodings)) or [(FORMAT_JSON, spec.version)]:
        part = events.where(
            f"source.table_oid = {spec.oid} AND _format = {sql_text.literal(form)} "
            f"AND source.table_version = {sql_text.literal(version)}")
        names = [renames.get(c.name, {}).get(version, c.name) for c in spec.columns]
        stale = [lenient and version in retyped.get(c.name, []) for c in spec.columns]
        decoded, images = _decoded(part, spec, form, _Version(
            names, stale, None if form == FORMAT_JSON else _writer(by_version, version)))
        branches.append(decoded.selectExpr(
            "op", "source", f"{_unchanged(renames, version)} AS unchanged",
            f"{images(BEFORE)} AS {BEFORE}", f"{images(AFTER)} AS {AFTER}"))
    return union(branches)


@dataclass(frozen=True)
class _Version:
    """What decoding one table version's events into the newest version's columns needs:
    each column's name in the version (None: it has none), whether it had another type
    then, and the version's writer schema (an Avro version's)."""

    names: list[str | None]
    stale: list[bool]
    writer: TableSpec | None


def _decoded(part: Any, spec: TableSpec, form: str,
             version: _Version) -> tuple[Any, Callable[[str], str]]:
    """One version's events of a table decoded as ``e`` (beside ``op`` and ``source``), and
    the SQL of its ``before`` or ``after`` image."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    columns = list(zip(spec.columns, version.names, version.stale, strict=True))
    if version.writer is None:  # JSON: maps of texts
        decoded = part.select("op", "source", F.from_json(
            F.col("value").cast("string"), _IMAGES).alias("e"))

        def images(side: str) -> str:
            return _image(spec, f"e.{side}", [
                None if name is None else from_text(
                    column, f"e.{side}[{sql_text.literal(name)}]", stale=stale)
                for column, name, stale in columns])

        return decoded, images
    reader, fields, typed = _reader(version.writer)
    decoded = part.select("op", "source", from_avro(F.expr(_avro_value(form)), reader).alias("e"))

    def typed_images(side: str) -> str:
        out: list[tuple[str, str] | None] = []
        for column, name, stale in columns:
            field = None if name is None else fields.get(name)
            if field is None:
                out.append(None)
                continue
            ref = f"e.{side}.{quote(field['name'])}"
            out.append(_from_typed(column, ref, field) if typed and not stale else
                       from_text(column, avro_text(ref, field, typed=typed), stale=stale))
        return _image(spec, f"e.{side}", out)

    return decoded, typed_images


def row_image(spec: TableSpec, values: dict[str, tuple[str, str]]) -> str:
    """An image of ``spec``'s columns from Spark SQL of their values and untyped texts by
    column name (:func:`from_text`; a column not named: NULL), always present (the lake
    load's rows, streaming/bulk_load.py)."""
    return _image(spec, None, [values.get(c.name) for c in spec.columns])
