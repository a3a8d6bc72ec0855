"""The load's row builder gives what the stream's RowDecoder gives for the same COPY text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decoder.change import RowDecoder
from decoder.type_registry import TypeRegistry
from loads.chunk_reader import row_builder
from snapshot_builder.catalog import Column, TableVersion

_REGISTRY = TypeRegistry()
_REGISTRY.register_enum(90001, name="mood")
_REGISTRY.register_array(90002, 90001, name="_mood")

# (column, strategy of its COPY text)
_COLUMNS = [
    (Column("id", 20, "int8", -1, True), st.integers(-2**63, 2**63 - 1).map(str)),
    (Column("n", 23, "int4", -1, False), st.integers(-2**31, 2**31 - 1).map(str)),
    (Column("price", 1700, "numeric", -1, False),
     st.decimals(allow_nan=False, allow_infinity=False, places=2).map(str)),
    (Column("note", 25, "text", -1, False), st.text()),
    (Column("ok", 16, "bool", -1, False), st.sampled_from(["t", "f"])),
    (Column("v", 701, "float8", -1, False),
     st.floats(allow_nan=False).map(repr).map(lambda r: r.replace("inf", "Infinity"))),
    (Column("items", 1007, "_int4", -1, False),
     st.lists(st.integers(-99, 99), max_size=4).map(lambda xs: "{" + ",".join(map(str, xs)) + "}")),
    (Column("m", 90001, "mood", -1, False), st.sampled_from(["sad", "ok", "happy"])),
    (Column("moods", 90002, "_mood", -1, False), st.sampled_from(["{}", "{sad,happy}"])),
    (Column("doc", 3802, "jsonb", -1, False), st.sampled_from(['{"a": [1, 2.50]}', "null"])),
]
_TABLE = TableVersion(1, "public", "t", "d", tuple(c for c, _ in _COLUMNS))
_ROWS = st.tuples(*(st.none() | strategy for _, strategy in _COLUMNS))


@given(_ROWS)
def test_row_builder_equals_the_row_decoder(raw: tuple[str | None, ...]) -> None:
    decoder = RowDecoder(_TABLE, _REGISTRY.decoder_for)
    expected, unchanged = decoder.decode(raw)
    assert unchanged == ()
    built = row_builder(decoder)(raw)
    assert built == expected
    assert list(built) == [c.name for c, _ in _COLUMNS]  # the column order too
    assert [type(v) for v in built.values()] == [type(v) for v in expected.values()]


def test_a_row_of_the_wrong_width_is_an_error() -> None:
    build = row_builder(RowDecoder(_TABLE, _REGISTRY.decoder_for))
    with pytest.raises(ValueError, match="a COPY row has 2 columns, the table version 10"):
        build(("1", "2"))
