"""Column values in pgoutput's binary format: each type's send function output, into the
same Python values as the text decoders of decoder/text_parsers.py.

With the ``binary`` option (PostgreSQL 14+), the server sends a column as ``'b'``, the
bytes of its type's ``typsend`` function (the format psycopg's binary loaders read), for
every type that has one; types without one still come as text.  A value decodes to
exactly what its text would have decoded to, so a table reads the same whichever format
the stream uses:

* what stays the server's text in text mode stays that text here, spelled as the
  replication session prints it (``DateStyle=ISO``, ``TimeZone=UTC``): ``infinity``
  dates and timestamps, BC dates and years past 9999, the time ``24:00:00``;
* float4 is the double nearest to its shortest decimal (what ``float4out`` prints), not
  the float4's exact binary value;
* jsonb, xml, tsvector and tsquery are their server text, rebuilt from the binary
  structure as ``jsonb_out``/``tsvectorout``/``tsqueryout`` print it; int2vector,
  oidvector and pg_snapshot too, as text mode keeps them;
* money is in cents (``lc_monetary=C``, as the session prints it).

Formats (``src/backend/utils/adt/*.c``, ``*_send``): integers, OIDs and floats
big-endian; ``numeric`` is ndigits, weight, sign, dscale, then base-10000 digits;
dates are days and timestamps microseconds since 2000-01-01, with ``INT_MAX``/
``INT64_MAX`` (and the minimums) for +-infinity; ``interval`` is microseconds, days,
months; arrays are ndim, a NULL flag, the element OID, (size, lower bound) per
dimension, then each element with its length (-1: NULL); ranges are a flags byte and
the present bounds; records are the field count, then per field its type OID and value.

The decoders live in four modules: the scalar types in decoder/binary_scalars.py, dates
and times in decoder/binary_time.py, tsvector and tsquery in decoder/binary_text_search.py;
here the types built from others (arrays, ranges, multiranges, composites, domains, enums),
the extensions' and the table by OID.  The common types (bool, the integers, float4/8,
the text types, jsonb, uuid, numeric, date, timestamp, timestamptz, enums, domains over
these and their arrays) are also read in C (decoder/_fastrow.c, ``BinaryDecoder``):
:meth:`BinaryDecoders.decoder_for` gives a column of such a type the compiled decoder,
which hands every value it cannot read exactly (infinity, BC, NaN numerics, malformed
bytes) to the Python decoder here; tests/unit/test_fastrow_binary.py checks that both
agree.

A type without a binary decoder here (an extension's, say) cannot be read when the
server sends it in binary: :class:`BinaryDecoders` gives it a decoder that raises
:class:`BinaryFormatError`, naming the type and the fix (``source.binary = off``).
``source.binary = auto`` (decoder/transfer.py) asks :meth:`BinaryDecoders.supports`
first and streams text when a published column has such a type.
"""

from __future__ import annotations

import struct
from math import prod
from typing import Any, Final

from core.errors import TerminalError
from decoder import text_parsers
from decoder import values as v
from decoder.binary_scalars import SCALARS, BinaryDecoder, cut, done, i32_at
from decoder.binary_text_search import TEXT_SEARCH
from decoder.binary_time import TIMES
from decoder.extensions import parse_ewkb
from decoder.tuples import CompiledBinaryDecoder
from decoder.type_registry import TypeRegistry, TypeShape
from decoder.values import EMPTY_RANGE, Range

__all__ = ["EXTENSIONS", "BinaryDecoder", "BinaryDecoders", "BinaryFormatError", "decoder_for"]


class BinaryFormatError(TerminalError):
    """A column arrived in binary and cannot be decoded: no decoder for its type, or bytes
    that are not its type's send format."""

    def __init__(self, type_name: str, reason: str | None = None) -> None:
        self.type_name = type_name
        if reason is None:
            text = (f"a value of type {type_name} arrived in binary format, which pgcdc "
                    "cannot decode: set source.binary = off (or auto, which streams text "
                    "when a published column has such a type) and restart")
        else:
            text = (f"malformed binary value of type {type_name}: {reason}; this is a bug or "
                    "a protocol mismatch: report it with the server version, and set "
                    "source.binary = off to stream text meanwhile")
        super().__init__(text)


_ARRAY_HEAD = struct.Struct("!iiI").unpack_from
_FIELD_HEAD = struct.Struct("!Ii").unpack_from
_SNAPSHOT_HEAD = struct.Struct("!iqq").unpack_from


# --- arrays, ranges, composites and others built from other types ---------------------------

class _Array:
    """Nested lists, lower bounds dropped; ``element=None`` keeps each element's bytes,
    ``element_oid=0`` accepts any element type.  A class, not a closure: the compiled
    decoder of a column (:func:`_compiled`) reads its element decoder and OID."""

    __slots__ = ("element", "element_oid")

    def __init__(self, element: BinaryDecoder | None, element_oid: int) -> None:
        self.element = element
        self.element_oid = element_oid

    def __call__(self, raw: bytes) -> list[Any]:
        element, element_oid = self.element, self.element_oid
        ndim, _flags, oid = _ARRAY_HEAD(raw, 0)
        if element_oid and oid != element_oid:
            msg = f"array of type OID {oid}, the column's element type is OID {element_oid}"
            raise ValueError(msg)
        if ndim == 0:
            done(raw, 12)
            return []
        if not 0 < ndim <= 6:
            msg = f"array of {ndim} dimensions"
            raise ValueError(msg)
        sizes = [i32_at(raw, 12 + 8 * i)[0] for i in range(ndim)]
        pos = 12 + 8 * ndim
        items: list[Any] = []
        append = items.append
        for _ in range(prod(sizes)):
            (length,) = i32_at(raw, pos)
            pos += 4
            if length == -1:
                append(None)
                continue
            value = cut(raw, pos, length)
            append(value if element is None else element(value))
            pos += length
        done(raw, pos)
        for size in reversed(sizes[1:]):
            items = [items[i : i + size] for i in range(0, len(items), size)]
        return items


_RANGE_EMPTY, _RANGE_LB_INC, _RANGE_UB_INC, _RANGE_LB_INF, _RANGE_UB_INF = 1, 2, 4, 8, 16


def _range_at(raw: bytes, bound: BinaryDecoder) -> Range:
    flags = raw[0]
    if flags & _RANGE_EMPTY:
        done(raw, 1)
        return EMPTY_RANGE
    pos = 1
    lower = upper = None
    if not flags & _RANGE_LB_INF:
        (length,) = i32_at(raw, pos)
        lower = bound(cut(raw, pos + 4, length))
        pos += 4 + length
    if not flags & _RANGE_UB_INF:
        (length,) = i32_at(raw, pos)
        upper = bound(cut(raw, pos + 4, length))
        pos += 4 + length
    done(raw, pos)
    return Range(lower, upper, bool(flags & _RANGE_LB_INC), bool(flags & _RANGE_UB_INC))


def _range(bound: BinaryDecoder) -> BinaryDecoder:
    def decode(raw: bytes) -> Range:
        return _range_at(raw, bound)

    return decode


def _multirange(bound: BinaryDecoder) -> BinaryDecoder:
    def decode(raw: bytes) -> tuple[Range, ...]:
        (count,) = i32_at(raw, 0)
        pos, ranges = 4, []
        for _ in range(count):
            (length,) = i32_at(raw, pos)
            ranges.append(_range_at(cut(raw, pos + 4, length), bound))
            pos += 4 + length
        done(raw, pos)
        return tuple(ranges)

    return decode


def _composite(fields: tuple[tuple[str, int, BinaryDecoder], ...]) -> BinaryDecoder:
    def decode(raw: bytes) -> dict[str, Any]:
        (count,) = i32_at(raw, 0)
        if count != len(fields):
            msg = f"{count} fields, the type has {len(fields)}"
            raise ValueError(msg)
        pos, out = 4, dict[str, Any]()
        for name, field_oid, field in fields:
            oid, length = _FIELD_HEAD(raw, pos)
            if oid != field_oid:
                msg = f"field {name} of type OID {oid}, the type says {field_oid}"
                raise ValueError(msg)
            pos += 8
            if length == -1:
                out[name] = None
                continue
            out[name] = field(cut(raw, pos, length))
            pos += length
        done(raw, pos)
        return out

    return decode


def _hstore(raw: bytes) -> dict[str, str | None]:
    """hstore_send: the pair count, then per pair the key and the value (-1: NULL)."""
    (count,) = i32_at(raw, 0)
    pos, out = 4, dict[str, str | None]()
    for _ in range(count):
        (length,) = i32_at(raw, pos)
        key = cut(raw, pos + 4, length).decode("utf-8")
        pos += 4 + length
        (length,) = i32_at(raw, pos)
        pos += 4
        if length == -1:
            out[key] = None
            continue
        out[key] = cut(raw, pos, length).decode("utf-8")
        pos += length
    done(raw, pos)
    return out


def _ewkb(raw: bytes) -> dict[str, Any]:
    """PostGIS geometry_send / geography_send: the EWKB whose hex is their text."""
    return parse_ewkb(raw.hex())


def _vector(element: BinaryDecoder, element_oid: int) -> BinaryDecoder:
    """int2vector and oidvector (array_send's format): their text, numbers joined by spaces."""
    array = _Array(element, element_oid)

    def decode(raw: bytes) -> str:
        return " ".join(map(str, array(raw)))

    return decode


def _snapshot(raw: bytes) -> str:
    """pg_snapshot / txid_snapshot: ``xmin:xmax:xip,...`` as their text."""
    count, xmin, xmax = _SNAPSHOT_HEAD(raw, 0)
    done(raw, 20 + 8 * max(count, 0))
    running = struct.unpack_from(f"!{count}q", raw, 20)
    return f"{xmin}:{xmax}:{','.join(map(str, running))}"


EXTENSIONS: Final[dict[str, BinaryDecoder]] = {
    "hstore": _hstore, "geometry": _ewkb, "geography": _ewkb,
}
"""Binary decoders of extension base types, by ``pg_type.typname`` (decoder/extensions.py
has their text decoders)."""

_SCALARS: Final[dict[int, BinaryDecoder]] = {**SCALARS, **TIMES, **TEXT_SEARCH}
_TEXT: Final = SCALARS[v.TEXT]
_RANGE_SUBTYPES: Final = {
    v.INT4RANGE: v.INT4, v.NUMRANGE: v.NUMERIC, v.TSRANGE: v.TIMESTAMP,
    v.TSTZRANGE: v.TIMESTAMPTZ, v.DATERANGE: v.DATE, v.INT8RANGE: v.INT8,
}
_MULTIRANGE_SUBTYPES: Final = {
    v.INT4MULTIRANGE: v.INT4, v.NUMMULTIRANGE: v.NUMERIC, v.TSMULTIRANGE: v.TIMESTAMP,
    v.TSTZMULTIRANGE: v.TIMESTAMPTZ, v.DATEMULTIRANGE: v.DATE, v.INT8MULTIRANGE: v.INT8,
}
INT2VECTOR, OIDVECTOR, TXID_SNAPSHOT, PG_SNAPSHOT = 22, 30, 2970, 5038
_OTHERS: Final[dict[int, BinaryDecoder]] = {
    INT2VECTOR: _vector(SCALARS[v.INT2], v.INT2), OIDVECTOR: _vector(SCALARS[v.OID], v.OID),
    TXID_SNAPSHOT: _snapshot,
    PG_SNAPSHOT: _snapshot,
}


def _builtins() -> dict[int, BinaryDecoder]:
    out = dict(_SCALARS)
    for oid, subtype in _RANGE_SUBTYPES.items():
        out[oid] = _range(_SCALARS[subtype])
    for oid, subtype in _MULTIRANGE_SUBTYPES.items():
        out[oid] = _multirange(_SCALARS[subtype])
    out |= _OTHERS
    for element, array in text_parsers.ARRAY_OIDS.items():
        out[array] = _Array(out[element], element)
    return out


_BUILTINS: Final = _builtins()


# --- compiled decoders ------------------------------------------------------------------------

_COMPILED_KINDS: Final[dict[BinaryDecoder, str]] = {
    _SCALARS[oid]: kind for oid, kind in (
        (v.BOOL, "bool"), (v.INT2, "int2"), (v.INT4, "int4"), (v.INT8, "int8"),
        (v.OID, "uint4"), (v.PG_LSN, "uint8"), (v.FLOAT4, "float4"), (v.FLOAT8, "float8"),
        (v.TEXT, "text"), (v.JSONB, "jsonb"), (v.BYTEA, "bytea"), (v.UUID, "uuid"),
        (v.NUMERIC, "numeric"), (v.DATE, "date"), (v.TIMESTAMP, "timestamp"),
        (v.TIMESTAMPTZ, "timestamptz"))}
"""The Python decoders whose format decoder/_fastrow.c also reads, by the name of its kind
there: the same function serves xid and cid (``uint4``), xid8, name, varchar, bpchar,
json, xml, enums and domains over these."""


def _compiled(decode: BinaryDecoder, checked: BinaryDecoder) -> BinaryDecoder | None:
    """The compiled decoder (decoder/_fastrow.c) of a column whose Python decoder is
    ``decode``, falling back to ``checked`` (``decode`` naming the type in its errors) for
    every value it cannot read exactly; None when C has no reader for the format, or when
    the compiled loop is not loaded."""
    if CompiledBinaryDecoder is None:
        return None
    kind = _COMPILED_KINDS.get(decode)
    if kind is not None:
        return CompiledBinaryDecoder(kind, checked)
    if isinstance(decode, _Array) and decode.element is not None:
        element = _COMPILED_KINDS.get(decode.element)
        if element is not None:
            return CompiledBinaryDecoder("array", checked, element, decode.element_oid)
    return None


# --- the types of one database ----------------------------------------------------------------

_ERRORS = (ValueError, LookupError, struct.error, OverflowError, TypeError)


class BinaryDecoders:
    """Binary decoders for the built-in types and those of a :class:`TypeRegistry`.

    :meth:`decoder_for` gives a column's decoder: it raises
    :class:`BinaryFormatError` naming the type on bytes it cannot read, and for a type
    without a binary decoder on every value.  Built once per OID, in a cache of the
    registry's (:meth:`TypeRegistry.derived`), rebuilt after the registry learns new types.
    """

    __slots__ = ("registry", "_built", "_building")

    def __init__(self, registry: TypeRegistry | None = None) -> None:
        self.registry = registry if registry is not None else TypeRegistry()
        self._built = self.registry.derived(self._from_oid)
        self._building: set[int] = set()  # the types being built: a cycle has no decoder

    def supports(self, oid: int) -> bool:
        """Whether values of the type (and of every type it is built from) decode."""
        return self._raw(oid) is not None

    def decoder_for(self, oid: int, name: str | None = None) -> BinaryDecoder:
        """The decoder of a column of type ``oid``, with the type's name in its errors
        (the registry's, else ``name``: the column's type name in the catalog)."""
        decode = self._raw(oid)
        if oid in self.registry or self.registry.shape(oid) is not None or not name:
            name = self.registry.type_name(oid)
        if decode is None:
            def undecodable(raw: bytes) -> Any:
                raise BinaryFormatError(name)

            return undecodable
        if decode is bytes:  # bytea: the bytes as they are
            return bytes

        def checked(raw: bytes) -> Any:
            try:
                return decode(raw)
            except _ERRORS as exc:
                raise BinaryFormatError(name, str(exc) or type(exc).__name__) from None

        return _compiled(decode, checked) or checked

    def _raw(self, oid: int) -> BinaryDecoder | None:
        decode = _BUILTINS.get(oid)
        if decode is not None:
            return decode
        if oid in self._building or self.registry.shape(oid) is None:
            return None
        return self._built.get(oid)

    def _from_oid(self, oid: int) -> BinaryDecoder | None:
        shape = self.registry.shape(oid)
        assert shape is not None  # _raw asks for registered types only
        self._building.add(oid)
        try:
            return self._from_shape(shape)
        finally:
            self._building.discard(oid)

    def _from_shape(self, shape: TypeShape) -> BinaryDecoder | None:
        kind = shape.kind
        if kind == "enum":
            return _TEXT
        if kind == "base":
            typname = (shape.name or "").rsplit(".", 1)[-1]
            return EXTENSIONS.get(typname)
        if kind == "text":
            return None
        if kind == "composite":
            fields = []
            for name, field_oid in shape.fields:
                field = self._raw(field_oid)
                if field is None:
                    return None
                fields.append((name, field_oid, field))
            return _composite(tuple(fields))
        part = self._raw(shape.of)
        if part is None:
            return None
        if kind == "domain":
            return part
        if kind == "array":
            return _Array(part, shape.of)
        if kind == "range":
            return _range(part)
        if kind == "multirange":
            return _multirange(part)
        return None


def decoder_for(oid: int, name: str | None = None) -> BinaryDecoder:
    """The binary decoder of a built-in type (see :meth:`BinaryDecoders.decoder_for`)."""
    return _DEFAULT.decoder_for(oid, name)


_DEFAULT: Final = BinaryDecoders()
