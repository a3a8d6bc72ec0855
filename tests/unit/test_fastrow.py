"""The compiled tuple loop (decoder/_fastrow.c) against its Python reference (decoder/tuples.py),
and the fused change decoder against parse() + RowDecoder."""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoder import pgoutput as pg
from decoder import tuples
from decoder.change import RowDecoder, decode_change
from decoder.errors import DecodeError
from decoder.pgoutput import UNCHANGED_TOAST
from snapshot_builder.catalog import Column, TableVersion
from tests.pgoutput_encoder import encode

pytestmark = pytest.mark.skipif(not tuples.COMPILED and os.environ.get("PGCDC_PURE_PYTHON") == "1",
                                reason="PGCDC_PURE_PYTHON=1: only the reference is loaded")

VALUES = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.text(st.characters(codec="utf-8"), max_size=12),
    st.binary(max_size=12),
)
TUPLES = st.lists(VALUES, max_size=8).map(tuple)


def _tuple_bytes(values: tuple[Any, ...]) -> bytes:
    # An Insert message is tag + oid + 'N' + TupleData: the tuple starts at 6.
    return encode(pg.Insert(None, 1, values))[6:]


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except (tuples.TupleError, tuples.PyTupleError) as exc:
        return "error", exc.args
    except IndexError as exc:
        return "index", str(exc)


def _fast() -> Any:
    from decoder import _fastrow

    return _fastrow


def test_the_compiled_loop_is_built() -> None:
    """`make setup` builds decoder/_fastrow.c; a silent fallback would hide a 2x slowdown."""
    assert tuples.COMPILED, "decoder._fastrow is not built: run `pip install -e .` with gcc present"


@given(TUPLES, st.binary(max_size=3))
def test_tuple_data_matches_the_reference(values: tuple[Any, ...], tail: bytes) -> None:
    buf = b"xy" + _tuple_bytes(values) + tail
    fast = _outcome(_fast().tuple_data, buf, 2, UNCHANGED_TOAST)
    assert fast == ("ok", (values, len(buf) - len(tail)))
    assert fast == _outcome(tuples.py_tuple_data, buf, 2, UNCHANGED_TOAST)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(TUPLES, st.data())
def test_malformed_tuples_fail_alike(values: tuple[Any, ...], data: st.DataObject) -> None:
    buf = bytearray(_tuple_bytes(values))
    if buf and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] = data.draw(st.integers(0, 255))
    cut = bytes(buf[: data.draw(st.integers(0, len(buf)))])
    fast = _outcome(_fast().tuple_data, cut, 0, UNCHANGED_TOAST)
    assert fast == _outcome(tuples.py_tuple_data, cut, 0, UNCHANGED_TOAST)
    columns = tuple((f"c{i}", None) for i in range(len(values)))
    fast_row = _outcome(_fast().decode_row, cut, 0, columns)
    assert fast_row == _outcome(tuples.py_decode_row, cut, 0, columns)


@given(TUPLES)
def test_decode_row_matches_the_reference(values: tuple[Any, ...]) -> None:
    buf = _tuple_bytes(values)
    columns = tuple((f"c{i}", None if i % 2 else str.upper) for i in range(len(values)))
    fast = _outcome(_fast().decode_row, buf, 0, columns)
    assert fast == _outcome(tuples.py_decode_row, buf, 0, columns)
    row, unchanged, end = fast[1]
    assert end == len(buf)
    assert unchanged == tuple(name for (name, _), v in zip(columns, values, strict=True)
                              if v is UNCHANGED_TOAST)
    assert set(row) == {name for (name, _), v in zip(columns, values, strict=True)
                        if v is not UNCHANGED_TOAST}


def test_decode_row_column_count_mismatch() -> None:
    buf = _tuple_bytes(("1", "2"))
    for fn in (_fast().decode_row, tuples.py_decode_row):
        with pytest.raises((tuples.TupleError, tuples.PyTupleError)) as info:
            fn(buf, 0, (("a", None),))
        assert info.value.args == ("tuple has 2 columns, its table version has 1", 2)


def test_decoder_exceptions_propagate() -> None:
    buf = _tuple_bytes(("x",))
    with pytest.raises(ArithmeticError):
        _fast().decode_row(buf, 0, (("a", Decimal),))


def test_position_outside_the_buffer() -> None:
    for fn in (_fast().tuple_data, tuples.py_tuple_data):
        with pytest.raises(IndexError):
            fn(b"\0\0", 3, UNCHANGED_TOAST)


# --- decode_change: the pipeline's path against parse() + RowDecoder ------------------------

def _table(ncols: int) -> TableVersion:
    # int4 and text columns in turn, the first is the key
    columns = tuple(Column(f"c{i}", 23 if i % 2 == 0 else 25, "int4" if i % 2 == 0 else "text",
                           -1, i == 0) for i in range(ncols))
    return TableVersion(16400, "s", "t", "d", columns)


def _cell(i: int) -> st.SearchStrategy[Any]:
    text = st.integers(-(2**40), 2**40).map(str) if i % 2 == 0 else st.text(max_size=8)
    return st.one_of(st.none(), st.just(UNCHANGED_TOAST), text)


@st.composite
def _changes(draw: st.DrawFn) -> tuple[TableVersion, bytes, bool]:
    streaming = draw(st.booleans())  # inside a streamed block: the xid after the tag
    xid = 77 if streaming else None
    ncols = draw(st.integers(1, 6))
    table = _table(ncols)
    row = st.tuples(*(_cell(i) for i in range(ncols)))
    kind = draw(st.sampled_from(["I", "UN", "UK", "UO", "DK", "DO"]))
    if kind == "I":
        message: pg.Message = pg.Insert(xid, table.oid, draw(row))
    elif kind == "UN":
        message = pg.Update(xid, table.oid, None, None, draw(row))
    elif kind[0] == "U":
        message = pg.Update(xid, table.oid, kind[1], draw(row), draw(row))
    else:
        message = pg.Delete(xid, table.oid, kind[1], draw(row))
    return table, encode(message, streaming=streaming), streaming


def _outcome_of(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except DecodeError as exc:
        return "decode-error", (str(exc), exc.tag, exc.offset)
    except ValueError as exc:
        return type(exc).__name__, None


def _reference(payload: bytes, table: TableVersion, streaming: bool) -> tuple[Any, ...]:
    decoder = RowDecoder(table)
    message = pg.parse(payload, streaming=streaming)
    if isinstance(message, pg.Insert):
        after, unchanged = decoder.decode(message.new)
        return ("c", table, None, after, unchanged)
    if isinstance(message, pg.Update):
        before = decoder.decode(message.old)[0] if message.old is not None else None
        after, unchanged = decoder.decode(message.new)
        return ("u", table, before, after, unchanged)
    assert isinstance(message, pg.Delete)
    return ("d", table, decoder.decode(message.old)[0], None, ())


@given(_changes())
def test_decode_change_equals_parse_and_decode(change: tuple[TableVersion, bytes, bool]) -> None:
    table, payload, streaming = change
    decoder = RowDecoder(table)
    assert decode_change(payload, lambda oid: (table, decoder), streaming=streaming) \
        == _reference(payload, table, streaming)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(_changes(), st.data())
def test_decode_change_fails_like_the_parser(change: tuple[TableVersion, bytes, bool],
                                             data: st.DataObject) -> None:
    table, payload, streaming = change
    buf = bytearray(payload)
    if data.draw(st.booleans()):
        at = data.draw(st.integers(1, len(buf) - 1))
        buf[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        buf.extend(data.draw(st.binary(min_size=1, max_size=3)))
    cut = bytes(buf[: data.draw(st.integers(1, len(buf)))])
    decoder = RowDecoder(table)
    fused = _outcome_of(lambda *a: decode_change(*a, streaming=streaming), cut,
                        lambda oid: (table, decoder))
    reference = _outcome_of(_reference, cut, table, streaming)
    if reference[0] == "ValueError" and fused[0] == "decode-error":
        # well-formed bytes whose column count is not the table's: the reference's zip()
        # says ValueError, the fused path names it
        assert "columns, its table version has" in fused[1][0]
    else:
        assert fused == reference


def test_change_before_its_relation() -> None:
    payload = encode(pg.Insert(None, 7, ("1",)))

    def unknown(oid: int) -> tuple[TableVersion, RowDecoder]:
        raise DecodeError(f"change for relation {oid} before its Relation message",
                          tag=None, offset=0)

    with pytest.raises(DecodeError, match="relation 7 before"):
        decode_change(payload, unknown)
