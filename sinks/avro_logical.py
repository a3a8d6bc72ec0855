"""Typed Avro (``--avro-types logical``): each column as its own Avro type, logical types
where Avro has one, written from the decoder's Python values without a text round trip.

The mapping (docs/types.md, "Typed Avro", has it as a table).  Every slot (a column, an
array element, a composite attribute, a range bound) is a union with ``null`` first.

* ``bool`` boolean; ``int2``/``int4`` int; ``int8``/``oid`` long; ``float4`` float;
  ``float8`` double; ``bytea`` bytes;
* ``numeric(p,s)`` with ``0 <= s <= p <= 38``: ``bytes`` with logical type ``decimal``
  (precision ``p``, scale ``s``), and a second branch, the string type
  ``pgcdc.type: numeric``, that holds ``NaN`` (the only value PostgreSQL keeps in a
  constrained numeric that a decimal cannot hold): a NaN is never NULL;
* any other ``numeric`` (unconstrained, wider than 38 digits, a negative scale or one
  above the precision) and ``money``: ``string`` with ``pgcdc.type`` ``numeric`` (or
  ``money``): the exact decimal, ``NaN``, ``Infinity``, ``-Infinity`` spelled so;
* ``date``: ``int`` ``date`` (days since 1970-01-01, BC dates and years past 9999
  included); ``infinity``/``-infinity`` are 2^31-1 / -2^31;
* ``time``: ``long`` ``time-micros`` (``24:00:00`` is 86,400,000,000);
* ``timestamp``: ``long`` ``local-timestamp-micros``; ``timestamptz``: ``long``
  ``timestamp-micros`` (UTC); ``infinity``/``-infinity`` are 2^63-1 / -2^63 (which are
  also the microseconds of +294247-01-10 04:00:54.775807 and its negative); a timestamp
  past 2^63-1 microseconds (PostgreSQL goes to 294276) is refused with an error;
* ``uuid``: ``string`` ``uuid``;
* ``json``/``jsonb``: ``string`` with ``connect.name`` ``io.debezium.data.Json`` (as
  Debezium names it) and ``pgcdc.type``; the server's text;
* an enum: ``string`` (the label) with ``pgcdc.type`` naming the enum type.  Its labels
  are not in the schema: ``ALTER TYPE ... ADD VALUE`` does not make a new table version,
  so a schema that listed them (an Avro ``enum``) would be wrong after one;
* arrays: Avro ``array`` whose items are the element's slot, and a nested array of the
  same (PostgreSQL does not fix an array column's dimensions: ``{1,2}`` and
  ``{{1,2},{3,4}}`` fit one ``int4[]``), six levels deep (PostgreSQL's limit);
* a composite: a ``record`` of its attributes, as the stream's catalog of types has them
  where the table version is first written (:attr:`LogicalTypes.catalog`; without one, as
  ``pg_type`` has them then); a change of them gives the tables holding the type a new
  version (snapshot_builder/builder.py), so a value whose attributes differ from its
  version's schema is a bug, refused with an error;
* a range: a ``record`` ``{lower, upper, lower_inc, upper_inc, empty}``, the bounds in
  the subtype's slot, NULL where unbounded; a multirange an ``array`` of those records;
* a domain: its base type's mapping (a domain over ``numeric(10,2)`` is that decimal);
* every other type (``interval``, ``timetz``, ``xml``, bit strings, network and MAC
  addresses, geometric and text search types, ``pg_lsn``, ``xid``, extension types):
  ``string`` with ``pgcdc.type`` naming it, the same text as with ``--avro-types text``.

Named types (records) are named after their place in the row (``<field>`` then
``_<attribute>``, ``_item`` ...), in the table's namespace, a number appended where two
places would give one name: a name is defined once per schema and reused below itself.
"""

from __future__ import annotations

import decimal
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any, Final

from core.errors import TerminalError
from decoder import text_parsers, values
from decoder.type_registry import TypeShape
from decoder.values import Range
from sinks.envelope import text_of
from snapshot_builder.catalog import Column
from snapshot_builder.datatype import TypeVersion

Shapes = Callable[[int], TypeShape | None]
"""The registered shape of a type OID that is not built in (an enum, a composite, ...)."""

Writer = Callable[[bytearray, Any], None]
"""Writes a non-null value: its union branch index, then the value."""

MAX_DIMENSIONS: Final = 6  # PostgreSQL's MAXDIM
DECIMAL_MAX_PRECISION: Final = 38

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_EPOCH_ORDINAL: Final = date(1970, 1, 1).toordinal()
_EPOCH: Final = datetime(1970, 1, 1)  # noqa: DTZ001 - the naive epoch of local timestamps
_EPOCH_UTC: Final = datetime(1970, 1, 1, tzinfo=UTC)
_DECIMALS: Final = decimal.Context(prec=DECIMAL_MAX_PRECISION + 2, Emax=999_999, Emin=-999_999)
_TEXT_TYPES: Final = frozenset(("text", "varchar", "bpchar", "name", "char"))


class AvroTypeError(TerminalError, ValueError):
    """A value the typed Avro schema of its column cannot hold: ``pgcdc run`` stops on it
    (exit 3) with the message, before the event is handed to Kafka."""


def varint(out: bytearray, n: int) -> None:
    """A non-negative (already zigzagged) number, seven bits a byte, low bits first: Avro's
    variable-length encoding (sinks/avro.py writes with it too)."""
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _long(out: bytearray, value: int) -> None:
    varint(out, (value << 1) ^ (value >> 63))


_SHORT_LENGTHS: Final = [bytes((size << 1,)) for size in range(64)]  # a length under 64


def _blob(out: bytearray, data: bytes) -> None:
    size = len(data)
    if size < 64:
        out += _SHORT_LENGTHS[size]
    else:
        varint(out, size << 1)
    out += data


def _branch(index: int) -> bytes:
    """The bytes of a union's branch ``index`` (``null`` is 0)."""
    out = bytearray()
    _long(out, index)
    return bytes(out)


# --- dates and times as numbers ----------------------------------------------------------------

_DATE_TIME: Final = re.compile(
    r"(\d+)-(\d\d)-(\d\d)(?:[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    r"(?:([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?)?( BC)?")


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 0 is 1 BC),
    as PostgreSQL counts them (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _text_micros(text: str, *, days_only: bool = False) -> int:
    """Microseconds since 1970 (or days) of the text the decoder keeps for a date or
    timestamp Python cannot hold: ``infinity``, BC, years past 9999."""
    if text in ("infinity", "-infinity"):
        high, low = (_INT_MAX, _INT_MIN) if days_only else (_LONG_MAX, _LONG_MIN)
        return high if text == "infinity" else low
    match = _DATE_TIME.fullmatch(text)
    if match is None:
        msg = f"{text!r} is not a date or timestamp PostgreSQL writes"
        raise AvroTypeError(msg)
    year, month, day, hour, minute, second, fraction, sign, off_h, off_m, off_s, bc = \
        match.groups()
    number = int(year)
    days = _days_from_civil(1 - number if bc else number, int(month), int(day))
    if days_only:
        return days
    seconds = days * 86400 + int(hour or 0) * 3600 + int(minute or 0) * 60 + int(second or 0)
    if sign:
        offset = int(off_h) * 3600 + int(off_m or 0) * 60 + int(off_s or 0)
        seconds -= offset if sign == "+" else -offset
    return seconds * 1_000_000 + int((fraction or "0").ljust(6, "0"))


def _write_date(out: bytearray, value: Any) -> None:
    days = value.toordinal() - _EPOCH_ORDINAL if isinstance(value, date) \
        else _text_micros(value, days_only=True)
    out.append(2)
    varint(out, (days << 1) ^ (days >> 31))


def _timestamp_writer(epoch: datetime) -> Writer:
    def write(out: bytearray, value: Any) -> None:
        if isinstance(value, datetime):
            delta = value - epoch
            micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
        else:
            micros = _text_micros(value)
            if not _LONG_MIN <= micros <= _LONG_MAX:
                msg = (f"timestamp {value} is beyond Avro's timestamp-micros (a long: up to "
                       "+294247-01-10 04:00:54.775807)")
                raise AvroTypeError(msg)
        out.append(2)
        _long(out, micros)
    return write


def _write_time(out: bytearray, value: Any) -> None:
    if isinstance(value, time):
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 \
            + value.microsecond
    elif value == "24:00:00":
        micros = 86_400_000_000
    else:
        msg = f"{value!r} is not a time PostgreSQL writes"
        raise AvroTypeError(msg)
    out.append(2)
    _long(out, micros)


# --- numbers -------------------------------------------------------------------------------------

def _decimal_writer(precision: int, scale: int) -> Writer:
    special = _branch(2)
    limit = 10**precision

    def write(out: bytearray, value: Any) -> None:
        if type(value) is not Decimal and not isinstance(value, Decimal):
            msg = f"{value!r} (type {type(value).__name__}) is not a numeric value"
            raise AvroTypeError(msg)
        if not value.is_finite():  # NaN (an infinity cannot be in a numeric(p,s))
            out += special
            _blob(out, text_of(value).encode())
            return
        scaled = value.scaleb(scale, _DECIMALS)
        unscaled = int(scaled)
        if not -limit < unscaled < limit or scaled != unscaled:
            msg = f"{value} does not fit numeric({precision},{scale})"
            raise AvroTypeError(msg)
        data = unscaled.to_bytes(((unscaled if unscaled >= 0 else ~unscaled).bit_length() + 8)
                                 // 8, "big", signed=True)
        out += _DECIMAL_HEADS[len(data)]  # the branch (1) and the length (under 64 bytes)
        out += data
    return write


_DECIMAL_HEADS: Final = [bytes((2, size << 1)) for size in range(64)]


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """``(p, s)`` of a ``numeric(p,s)`` a decimal holds (``0 <= s <= p <= 38``), else None."""
    if typmod < 4:
        return None
    precision = ((typmod - 4) >> 16) & 0xFFFF
    scale = (typmod - 4) & 0xFFFF
    if scale & 0x400:  # a negative scale (PostgreSQL 15), an 11-bit two's complement
        return None
    if not 0 < precision <= DECIMAL_MAX_PRECISION or scale > precision:
        return None
    return precision, scale


# --- simple slots --------------------------------------------------------------------------------

def boolean_writer(mismatch: Callable[[Any], Exception]) -> Writer:
    """The writer of a nullable boolean: the union branch of a non-null value (1, zigzag
    0x02), then the byte; anything but True or False raises ``mismatch(value)``.  Text
    Avro (sinks/avro.py) writes its booleans with it too."""
    def write(out: bytearray, value: Any) -> None:
        if value is True:
            out += b"\x02\x01"
        elif value is False:
            out += b"\x02\x00"
        else:
            raise mismatch(value)
    return write


def _not_a_boolean(value: Any) -> AvroTypeError:
    return AvroTypeError(f"{value!r} is not a boolean")


_write_boolean = boolean_writer(_not_a_boolean)


def _integer_writer(low: int, high: int, bits: int) -> Writer:
    def write(out: bytearray, value: Any) -> None:
        if type(value) is not int or not low <= value <= high:
            msg = f"{value!r} is not an Avro {'int' if bits == 31 else 'long'}"
            raise AvroTypeError(msg)
        out.append(2)
        varint(out, (value << 1) ^ (value >> bits))
    return write


def _float_writer(kind: str) -> Writer:
    pack = struct.Struct("<f" if kind == "float" else "<d").pack

    def write(out: bytearray, value: Any) -> None:
        number = float(value)
        out.append(2)
        try:
            out += pack(number)
        except OverflowError:  # beyond float32: an infinity, as fastavro's C cast gives
            out += pack(math.copysign(math.inf, number))
    return write


def _write_bytes(out: bytearray, value: Any) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        msg = f"{value!r} is not bytes"
        raise AvroTypeError(msg)
    out.append(2)
    _blob(out, bytes(value))


def _write_string(out: bytearray, value: Any) -> None:
    out.append(2)
    _blob(out, (value if type(value) is str else text_of(value)).encode())


def _write_uuid(out: bytearray, value: Any) -> None:
    out.append(2)
    _blob(out, str(value).encode())


@dataclass(frozen=True, slots=True)
class Slot:
    """A nullable place: the union's branches besides ``null``, and the writer of a value."""

    branches: tuple[Any, ...]
    write: Writer
    inner: Writer | None = None  # a range's record without its branch (for multiranges)
    # what sinks/_fastavro.c writes itself with the same bytes as ``write`` (a key of
    # :data:`COMPILED_KINDS`, or ``decimal`` with ``precision_scale``), if anything: it
    # calls ``write`` for the values it does not take (text the decoder kept, a NaN, ...)
    primitive: str | None = None
    precision_scale: tuple[int, int] = (0, 0)


# sinks/_fastavro.c's column kinds: text mode's primitives, then typed Avro's
COMPILED_KINDS: Final = {
    "boolean": 0, "int": 1, "long": 2, "float": 3, "double": 4, "bytes": 5, "string": 6,
    "date": 7, "local-timestamp-micros": 8, "timestamp-micros": 9, "time-micros": 10,
    "int-array": 11, "long-array": 12}
_COMPILED_DECIMAL: Final = 1000  # + precision * 64 + scale
NOT_COMPILED: Final = -1  # no kind of sinks/_fastavro.c: it calls the Python writer


def compiled_kind(slot: Slot) -> int:
    """The kind sinks/_fastavro.c gives the column of ``slot``."""
    if slot.primitive == "decimal":
        precision, scale = slot.precision_scale
        return _COMPILED_DECIMAL + precision * 64 + scale
    return COMPILED_KINDS.get(slot.primitive or "", NOT_COMPILED)


def _typed(avro_type: Any, write: Writer, primitive: str | None = None) -> Slot:
    return Slot((avro_type,), write, primitive=primitive)


def _text(type_name: str) -> Slot:
    if type_name in _TEXT_TYPES:
        return Slot(("string",), _write_string, primitive="string")
    return Slot(({"type": "string", "pgcdc.type": type_name},), _write_string,
                primitive="string")


_BUILTIN_SLOTS: Final[dict[str, Slot]] = {
    "bool": _typed("boolean", _write_boolean, "boolean"),
    "int2": _typed("int", _integer_writer(_INT_MIN, _INT_MAX, 31), "int"),
    "int4": _typed("int", _integer_writer(_INT_MIN, _INT_MAX, 31), "int"),
    "int8": _typed("long", _integer_writer(_LONG_MIN, _LONG_MAX, 63), "long"),
    "oid": _typed("long", _integer_writer(_LONG_MIN, _LONG_MAX, 63), "long"),
    "float4": _typed("float", _float_writer("float"), "float"),
    "float8": _typed("double", _float_writer("double"), "double"),
    "bytea": _typed("bytes", _write_bytes, "bytes"),
    "date": _typed({"type": "int", "logicalType": "date"}, _write_date, "date"),
    "time": _typed({"type": "long", "logicalType": "time-micros"}, _write_time, "time-micros"),
    "timestamp": _typed({"type": "long", "logicalType": "local-timestamp-micros"},
                        _timestamp_writer(_EPOCH), "local-timestamp-micros"),
    "timestamptz": _typed({"type": "long", "logicalType": "timestamp-micros"},
                          _timestamp_writer(_EPOCH_UTC), "timestamp-micros"),
    "uuid": _typed({"type": "string", "logicalType": "uuid"}, _write_uuid),
    "json": _typed({"type": "string", "connect.name": "io.debezium.data.Json",
                    "pgcdc.type": "json"}, _write_string, "string"),
    "jsonb": _typed({"type": "string", "connect.name": "io.debezium.data.Json",
                     "pgcdc.type": "jsonb"}, _write_string, "string"),
}

_RANGE_SUBTYPES: Final = {
    values.INT4RANGE: values.INT4, values.INT8RANGE: values.INT8,
    values.NUMRANGE: values.NUMERIC, values.DATERANGE: values.DATE,
    values.TSRANGE: values.TIMESTAMP, values.TSTZRANGE: values.TIMESTAMPTZ,
}
_MULTIRANGES: Final = {
    values.INT4MULTIRANGE: values.INT4RANGE, values.INT8MULTIRANGE: values.INT8RANGE,
    values.NUMMULTIRANGE: values.NUMRANGE, values.DATEMULTIRANGE: values.DATERANGE,
    values.TSMULTIRANGE: values.TSRANGE, values.TSTZMULTIRANGE: values.TSTZRANGE,
}
_ARRAY_ELEMENTS: Final = {array: element for element, array in text_parsers.ARRAY_OIDS.items()}


# --- the schema of one table version's rows -----------------------------------------------------

class SchemaBuilder:
    """The slots of one schema's columns; names its records uniquely within that schema."""

    def __init__(self, namespace: str, shapes: Shapes, table: str) -> None:
        self._namespace = namespace
        self._shapes = shapes
        self._table = table
        self._names: set[str] = {"Key", "Row", "Envelope"}  # the envelope's own records

    def column(self, column: Column, field: str) -> Slot:
        """The slot of a column (``field``: its Avro field name)."""
        typmod = column.base_typmod if column.base_type is not None else column.typmod
        return self._slot(column.type_oid, typmod, field, column.name, 0)

    def _name(self, path: str) -> str:
        name = re.sub(r"[^A-Za-z0-9_]", "_", path)
        if not name or name[0].isdigit():
            name = f"_{name}"
        candidate, number = name, 1
        while candidate in self._names:
            number += 1
            candidate = f"{name}_{number}"
        self._names.add(candidate)
        return candidate

    def _slot(self, oid: int, typmod: int, path: str, column: str, depth: int) -> Slot:
        if depth > 32:  # a type built on itself through arrays of composites
            msg = f"column {column} of {self._table}: its type nests more than 32 levels"
            raise AvroTypeError(msg)
        if oid < values.FIRST_NORMAL_OID:
            return self._builtin(oid, typmod, path, column, depth)
        shape = self._shapes(oid)
        if shape is None or shape.kind in ("text", "base"):
            return _text(shape.name if shape is not None and shape.name else
                         text_parsers.type_name(oid))
        if shape.kind == "enum":
            return Slot(({"type": "string", "pgcdc.type": shape.name or str(oid)},),
                        _write_string, primitive="string")
        if shape.kind == "domain":
            return self._slot(shape.of, shape.typmod if shape.typmod != -1 else typmod,
                              path, column, depth + 1)
        if shape.kind == "array":
            return self._array(self._slot(shape.of, typmod, f"{path}_item", column, depth + 1))
        if shape.kind == "range":
            return self._range(shape.of, path, column, depth)
        if shape.kind == "multirange":
            return self._multirange(shape.of, path, column, depth)  # ``of``: the subtype
        if shape.kind == "composite":
            return self._composite(shape, path, column, depth)
        return _text(shape.name or text_parsers.type_name(oid))

    def _builtin(self, oid: int, typmod: int, path: str, column: str, depth: int) -> Slot:
        name = text_parsers.type_name(oid)
        if oid == values.NUMERIC:
            decimal_type = numeric_precision_scale(typmod)
            if decimal_type is None:
                return _text("numeric")
            precision, scale = decimal_type
            return Slot(({"type": "bytes", "logicalType": "decimal", "precision": precision,
                          "scale": scale}, {"type": "string", "pgcdc.type": "numeric"}),
                        _decimal_writer(precision, scale), primitive="decimal",
                        precision_scale=(precision, scale))
        slot = _BUILTIN_SLOTS.get(name)
        if slot is not None:
            return slot
        element = _ARRAY_ELEMENTS.get(oid)
        if element is not None:
            return self._array(self._slot(element, typmod, f"{path}_item", column, depth + 1))
        if oid in _RANGE_SUBTYPES:
            return self._range(_RANGE_SUBTYPES[oid], path, column, depth, builtin=oid)
        if oid in _MULTIRANGES:
            return self._multirange(_RANGE_SUBTYPES[_MULTIRANGES[oid]], path, column, depth,
                                    builtin=_MULTIRANGES[oid])
        return _text(name)

    def _array(self, item: Slot) -> Slot:
        """An array of ``item``s, and of such arrays, :data:`MAX_DIMENSIONS` deep."""
        references = tuple(_reference(b, self._namespace) for b in item.branches)
        nested_branch = len(item.branches) + 1
        inner: Any = {"type": "array", "items": ["null", *references]}
        for _ in range(MAX_DIMENSIONS - 2):
            inner = {"type": "array", "items": ["null", *references, inner]}
        # the outermost level defines the item's named types; the inner ones refer to them
        schema = {"type": "array", "items": ["null", *item.branches, inner]}
        write_item = item.write
        nested = _branch(nested_branch)

        def write_items(out: bytearray, items: Any, depth: int) -> None:
            if not isinstance(items, list):
                msg = f"{items!r} is not an array"
                raise AvroTypeError(msg)
            if items:
                _long(out, len(items))
                for element in items:
                    if element is None:
                        out.append(0)
                    elif isinstance(element, list):
                        if depth >= MAX_DIMENSIONS:
                            msg = f"an array of more than {MAX_DIMENSIONS} dimensions"
                            raise AvroTypeError(msg)
                        out += nested
                        write_items(out, element, depth + 1)
                    else:
                        write_item(out, element)
            out.append(0)

        def write(out: bytearray, value: Any) -> None:
            out.append(2)
            write_items(out, value, 1)

        compiled = {"int": "int-array", "long": "long-array"}.get(item.primitive or "")
        return Slot((schema,), write, primitive=compiled)

    def _range(self, subtype: int, path: str, column: str, depth: int,
               builtin: int | None = None) -> Slot:
        name = self._name(f"{path}_range" if builtin is None else path)
        bound = self._slot(subtype, -1, f"{path}_bound", column, depth + 1)
        bound_ref = tuple(_reference(b, self._namespace) for b in bound.branches)
        schema = {"type": "record", "name": name, "namespace": self._namespace,
                  "pgcdc.type": text_parsers.type_name(builtin) if builtin else "range",
                  "fields": [
                      {"name": "lower", "type": ["null", *bound.branches], "default": None},
                      {"name": "upper", "type": ["null", *bound_ref], "default": None},
                      {"name": "lower_inc", "type": "boolean"},
                      {"name": "upper_inc", "type": "boolean"},
                      {"name": "empty", "type": "boolean"}]}
        write_bound = bound.write

        def write_range(out: bytearray, value: Any) -> None:
            if not isinstance(value, Range):
                msg = f"{value!r} is not a range"
                raise AvroTypeError(msg)
            for side in (value.lower, value.upper):
                if side is None:
                    out.append(0)
                else:
                    write_bound(out, side)
            out.append(1 if value.lower_inc else 0)
            out.append(1 if value.upper_inc else 0)
            out.append(1 if value.empty else 0)

        def write(out: bytearray, value: Any) -> None:
            out.append(2)
            write_range(out, value)

        return Slot((schema,), write, write_range)

    def _multirange(self, subtype: int, path: str, column: str, depth: int,
                    builtin: int | None = None) -> Slot:
        """An array of range records over ``subtype`` (``builtin``: the built-in range type;
        a user multirange's shape names its range's subtype, as the decoder registers it)."""
        inner = self._range(subtype, f"{path}_item", column, depth + 1, builtin=builtin)
        write_range = inner.inner
        assert write_range is not None

        def write(out: bytearray, value: Any) -> None:
            out.append(2)
            if value:
                _long(out, len(value))
                for each in value:
                    write_range(out, each)
            out.append(0)

        return Slot(({"type": "array", "items": inner.branches[0]},), write)

    def _composite(self, shape: TypeShape, path: str, column: str, depth: int) -> Slot:
        name = self._name(path)
        names = tuple(attribute for attribute, _ in shape.fields)
        fields, writers = [], []
        for position, (attribute, oid) in enumerate(shape.fields):
            field = attribute if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", attribute) \
                else f"{re.sub(r'[^A-Za-z0-9_]', '_', attribute)}_{position}"
            slot = self._slot(oid, -1, f"{path}_{field}", column, depth + 1)
            fields.append({"name": field, "type": ["null", *slot.branches], "default": None,
                           "pgcdc.attribute": attribute})
            writers.append((attribute, slot.write))
        schema = {"type": "record", "name": name, "namespace": self._namespace,
                  "pgcdc.type": shape.name or "composite", "fields": fields}
        expected = set(names)
        type_name, table = shape.name, self._table

        def write(out: bytearray, value: Any) -> None:
            if not isinstance(value, dict) or value.keys() != expected:
                got = sorted(value) if isinstance(value, dict) else type(value).__name__
                msg = (f"column {column} of {table}: a value of composite type {type_name} "
                       f"has attributes {got}, but the table version's Avro schema has "
                       f"{list(names)} (the type was altered while the table's version "
                       "stayed); alter the table too (any column change gives it a new "
                       "version and schema), or run with --avro-types text")
                raise AvroTypeError(msg)
            out.append(2)
            for attribute, write_attribute in writers:
                item = value[attribute]
                if item is None:
                    out.append(0)
                else:
                    write_attribute(out, item)

        return Slot((schema,), write)


def _reference(branch: Any, namespace: str) -> Any:
    """A branch as a later occurrence in the same schema must write it: a record defined
    above by its full name, anything holding one with those names."""
    if isinstance(branch, dict):
        if branch.get("type") == "record":
            return f"{branch.get('namespace', namespace)}.{branch['name']}"
        if branch.get("type") == "array":
            items = branch["items"]
            return dict(branch, items=[_reference(b, namespace) for b in items]
                        if isinstance(items, list) else _reference(items, namespace))
    return branch


class LogicalTypes:
    """Typed Avro's schemas and writers of table versions, user types looked up in
    ``shapes`` (a :class:`~decoder.type_registry.TypeRegistry`'s ``shape``; None: built-in types
    only, a user type's values as text)."""

    def __init__(self, shapes: Shapes | None = None,
                 load: Callable[[list[int]], None] | None = None) -> None:
        # load: registers the given user type OIDs (and what they are built from) where
        # ``shapes`` looks (decoder.types.load_types), called before a schema needs them
        self.shapes: Shapes = shapes if shapes is not None else _no_shapes
        self._load = load
        # the stream's catalog of types (the snapshot builder's, at the change being
        # written): a composite's attributes as the table version's values have them
        self.catalog: Callable[[int], TypeVersion | None] | None = None

    def shape(self, oid: int) -> TypeShape | None:
        """The shape of a user type: a composite's attributes from :attr:`catalog` when it
        has the type (the ones the decoded values have, whatever ``pg_type`` says now),
        anything else as ``shapes`` has it."""
        known = self.shapes(oid)
        dtype = self.catalog(oid) if self.catalog is not None else None
        if dtype is None or dtype.kind != "composite":
            return known
        return TypeShape("composite", fields=tuple((a.name, a.type_oid)
                                                   for a in dtype.attributes),
                         name=known.name if known is not None else dtype.qualified_name)

    def slots(self, namespace: str, table: str, columns: tuple[Column, ...],
              fields: list[str]) -> tuple[Slot, ...]:
        """The slots of one record's ``columns`` (Avro field names ``fields``), with the
        record names of one schema."""
        oids = {c.type_oid for c in columns}
        for oid in list(oids):  # a composite's attributes as the catalog has them
            shape = self.shape(oid) if oid >= values.FIRST_NORMAL_OID else None
            if shape is not None and shape.kind == "composite":
                oids.update(attribute for _, attribute in shape.fields)
        unknown = sorted(oid for oid in oids if oid >= values.FIRST_NORMAL_OID
                         and self.shapes(oid) is None)
        if unknown and self._load is not None:
            self._load(unknown)
        builder = SchemaBuilder(namespace, self.shape, table)
        return tuple(builder.column(c, f) for c, f in zip(columns, fields, strict=True))


    @classmethod
    def reading(cls, conninfo: str) -> LogicalTypes:
        """User types read from the ``pg_type`` of the database ``conninfo`` names, when a
        table version first needs them (enum, domain, array, range types keep their
        definition for their OID's life; a composite's attributes are the ones it has
        then: see the module docstring)."""
        import psycopg

        from decoder.type_registry import TypeRegistry
        from decoder.types import load_types

        types = TypeRegistry()

        def load(oids: list[int]) -> None:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                load_types(conn, oids, types)

        return cls(types.shape, load)


def _no_shapes(oid: int) -> TypeShape | None:
    return None
