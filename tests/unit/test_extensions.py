"""hstore and PostGIS EWKB decoding (decoder/extensions.py), on hand-built values."""

from __future__ import annotations

import struct

import pytest

from decoder.extensions import BY_NAME, parse_ewkb, parse_hstore


@pytest.mark.parametrize(("text", "expected"), [
    ("", {}),
    ('"a"=>"1"', {"a": "1"}),
    ('"a"=>"1", "b"=>NULL', {"a": "1", "b": None}),
    ('"k\\"q"=>"v\\\\w", "NULL"=>"NULL"', {'k"q': "v\\w", "NULL": "NULL"}),
    ('"x y"=>"=>, \\""', {"x y": '=>, "'}),
    ('"ü"=>""', {"ü": ""}),
])
def test_hstore(text: str, expected: dict[str, str | None]) -> None:
    assert parse_hstore(text) == expected


@pytest.mark.parametrize("text", ['"a"=>', 'a=>"1"', '"a"=>"1" "b"=>"2"'])
def test_hstore_malformed_stays_text(text: str) -> None:
    with pytest.raises(ValueError, match="not an hstore"):
        parse_hstore(text)
    assert BY_NAME["hstore"](text) == text


def _wkb(kind: int, body: bytes, *, srid: int | None = None, z: bool = False,
         little: bool = True) -> bytes:
    e = "<" if little else ">"
    flags = kind | (0x80000000 if z else 0) | (0x20000000 if srid is not None else 0)
    head = struct.pack(f"{e}BI", 1 if little else 0, flags)
    return head + (struct.pack(f"{e}I", srid) if srid is not None else b"") + body


def _points(*points: tuple[float, ...], e: str = "<") -> bytes:
    return struct.pack(f"{e}I", len(points)) + b"".join(
        struct.pack(f"{e}{len(p)}d", *p) for p in points)


def test_point_with_srid() -> None:
    raw = _wkb(1, struct.pack("<2d", 1.5, -2.0), srid=4326)
    assert parse_ewkb(raw.hex().upper()) == {"type": "Point", "coordinates": [1.5, -2.0],
                                             "srid": 4326}


def test_big_endian_linestring_z() -> None:
    raw = _wkb(2, _points((0, 0, 1), (1, 1, 2), e=">"), z=True, little=False)
    assert parse_ewkb(raw.hex()) == {"type": "LineString",
                                     "coordinates": [[0, 0, 1], [1, 1, 2]]}


def test_polygon_multipoint_collection_and_empty_point() -> None:
    ring = _points((0, 0), (1, 0), (1, 1), (0, 0))
    polygon = _wkb(3, struct.pack("<I", 1) + ring)
    assert parse_ewkb(polygon.hex()) == {
        "type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]]]}
    multi = _wkb(4, struct.pack("<I", 2) + _wkb(1, struct.pack("<2d", 1, 2))
                 + _wkb(1, struct.pack("<2d", 3, 4)), srid=3857)
    assert parse_ewkb(multi.hex()) == {"type": "MultiPoint", "coordinates": [[1, 2], [3, 4]],
                                       "srid": 3857}
    empty = _wkb(1, struct.pack("<2d", float("nan"), float("nan")))
    collection = _wkb(7, struct.pack("<I", 2) + empty + polygon)
    assert parse_ewkb(collection.hex()) == {"type": "GeometryCollection", "geometries": [
        {"type": "Point", "coordinates": []},
        {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]]]}]}


@pytest.mark.parametrize("text", ["", "zz", _wkb(1, b"\0" * 8).hex(), _wkb(9, b"").hex(),
                                  _wkb(1, struct.pack("<2d", 1, 2)).hex() + "00"])
def test_malformed_geometry_stays_text(text: str) -> None:
    assert BY_NAME["geometry"](text) == text
