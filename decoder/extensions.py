"""Values of two extensions' types, structured: ``hstore`` and PostGIS ``geometry``/``geography``.

Their OIDs differ in every database, so :func:`decoder.types.load_types`
registers them by name (:data:`BY_NAME`) when a table uses them.

* ``hstore`` -> ``dict[str, str | None]``.  Its text is ``"k"=>"v", "n"=>NULL``;
  inside quotes a backslash escapes the next character.
* ``geometry`` and ``geography`` -> a GeoJSON geometry (RFC 7946 shapes: ``type``
  and ``coordinates``, or ``geometries`` for a collection), plus ``srid`` when the
  value has one.  The server prints a geometry as hex EWKB (PostGIS's extended
  well-known binary: byte order, a type with Z / M / SRID flags, an optional SRID,
  then the coordinates).  Z is kept as a third coordinate; M values are dropped
  (GeoJSON has no place for them).  An empty point (NaN coordinates) has no
  coordinates.

Text these parsers do not read stays text, as for every other type.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from typing import Any, Final

from decoder.text_parsers import or_text  # text the parser cannot read stays text

# --- hstore -------------------------------------------------------------------------------------

_QUOTED = r'"((?:[^"\\]|\\.)*)"'
_PAIR: Final = re.compile(rf'\s*{_QUOTED}\s*=>\s*(?:NULL|{_QUOTED})\s*(,|$)', re.DOTALL)
_ESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)


def _unescape(text: str) -> str:
    return _ESCAPE.sub(r"\1", text) if "\\" in text else text


def parse_hstore(text: str) -> dict[str, str | None]:
    """``"a"=>"1", "b"=>NULL`` -> ``{"a": "1", "b": None}``; ``ValueError`` if malformed."""
    out: dict[str, str | None] = {}
    pos = 0
    if not text.strip():
        return out
    while pos < len(text):
        match = _PAIR.match(text, pos)
        if match is None:
            msg = f"not an hstore at {pos}: {text[pos:pos + 40]!r}"
            raise ValueError(msg)
        key, value = match.group(1), match.group(2)
        out[_unescape(key)] = None if value is None else _unescape(value)
        pos = match.end()
    return out


# --- PostGIS EWKB --------------------------------------------------------------------------------

_Z_FLAG, _M_FLAG, _SRID_FLAG = 0x80000000, 0x40000000, 0x20000000
_KINDS: Final = {1: "Point", 2: "LineString", 3: "Polygon", 4: "MultiPoint",
                 5: "MultiLineString", 6: "MultiPolygon", 7: "GeometryCollection"}


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            msg = "EWKB cut short"
            raise ValueError(msg)
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values


def _geometry(r: _Reader, top: bool) -> dict[str, Any]:
    (order,) = r.take("B")
    if order not in (0, 1):
        msg = f"EWKB byte order {order}"
        raise ValueError(msg)
    e = "<" if order == 1 else ">"
    (raw_kind,) = r.take(f"{e}I")
    # ISO WKB says Z and M by adding 1000 / 2000 / 3000 to the type; EWKB by flag bits
    iso, kind = divmod(raw_kind & 0x0FFFFFFF, 1000)
    has_z = bool(raw_kind & _Z_FLAG) or iso in (1, 3)
    has_m = bool(raw_kind & _M_FLAG) or iso in (2, 3)
    name = _KINDS.get(kind)
    if name is None:
        msg = f"EWKB geometry type {kind} is not one GeoJSON has"
        raise ValueError(msg)
    srid = r.take(f"{e}I")[0] if raw_kind & _SRID_FLAG else None
    dims = 2 + has_z + has_m
    point = f"{e}{dims}d"

    def coordinates() -> list[float]:
        values = r.take(point)
        return list(values[:3] if has_z else values[:2])

    def points() -> list[list[float]]:
        (count,) = r.take(f"{e}I")
        return [coordinates() for _ in range(count)]

    out: dict[str, Any] = {"type": name}
    if kind == 1:
        xy = coordinates()
        out["coordinates"] = [] if all(math.isnan(v) for v in xy) else xy
    elif kind == 2:
        out["coordinates"] = points()
    elif kind == 3:
        (rings,) = r.take(f"{e}I")
        out["coordinates"] = [points() for _ in range(rings)]
    else:
        (count,) = r.take(f"{e}I")
        parts = [_geometry(r, top=False) for _ in range(count)]
        if kind == 7:
            out["geometries"] = parts
        else:
            out["coordinates"] = [part["coordinates"] for part in parts]
    if top and srid is not None:
        out["srid"] = srid
    return out


def parse_ewkb(text: str) -> dict[str, Any]:
    """Hex EWKB (what ``geometry_out`` prints) as a GeoJSON geometry dict."""
    reader = _Reader(bytes.fromhex(text))
    geometry = _geometry(reader, top=True)
    if reader.pos != len(reader.data):
        msg = f"{len(reader.data) - reader.pos} bytes after the geometry"
        raise ValueError(msg)
    return geometry


BY_NAME: Final[dict[str, Callable[[str], Any]]] = {
    "hstore": or_text(parse_hstore),
    "geometry": or_text(parse_ewkb),
    "geography": or_text(parse_ewkb),
}
"""Decoders of extension base types, by ``pg_type.typname``."""
