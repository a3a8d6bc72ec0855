"""Debezium's source.snapshot marks of the initial load's reads (sinks/snapshot_marks.py):
every encoder, compiled or not, writes ``first``/``last`` for a marked read, ``true`` for
any other read and ``false`` for a change."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st

from decoder.change import READ, ChangeEvent
from loads.read_marks import copy_fields
from sinks.avro import AvroEncoder, value_schema
from sinks.debezium_json import JsonOptions
from sinks.envelope import JsonEncoder
from sinks.snapshot_marks import (
    FirstRead,
    IncrementalRead,
    LastRead,
    MarkedRead,
    mark,
    snapshot_of,
)
from tests.unit.test_debezium_json import ROW, TABLE

READ_EVENT = ChangeEvent(READ, TABLE, None, ROW, (), 90, 90, 7, 0, 700_000_000)
CASES = [(READ_EVENT, "true"), (mark(READ_EVENT, FirstRead), "first"),
         (mark(READ_EVENT, LastRead), "last"), (mark(READ_EVENT, IncrementalRead), "incremental"),
         (READ_EVENT._replace(op="c", xid=725), "false")]


def test_marks() -> None:
    for event, want in CASES:
        assert snapshot_of(event) == want
    marked = mark(mark(READ_EVENT, FirstRead), LastRead)
    assert type(marked) is LastRead and tuple(marked) == tuple(READ_EVENT)
    assert isinstance(marked, ChangeEvent) and isinstance(marked, MarkedRead)


@pytest.mark.parametrize("mode", ["debezium", "pgcdc"])
def test_json_source_snapshot(mode: str) -> None:
    encoder = JsonEncoder(JsonOptions(mode=mode, database="app"))  # type: ignore[arg-type]
    fast = encoder.encoder_for(TABLE, "s")  # compiled in Debezium's mode, when built
    for event, want in CASES:
        _, value = fast(event, 5)
        assert json.loads(value)["source"]["snapshot"] == want
        # the compiled path and the Python one agree, byte for byte
        assert value == encoder.value(event, server_name="s", now_ms=5)
    first, plain = fast(CASES[1][0], 5)[1], fast(READ_EVENT, 5)[1]
    assert first.replace(b'"snapshot":"first"', b'"snapshot":"true"') == plain


@pytest.mark.parametrize("compiled", [True, False])
def test_avro_source_snapshot(compiled: bool) -> None:
    encoder = AvroEncoder(compiled=compiled)
    schema = fastavro.parse_schema(value_schema(TABLE))
    for event, want in CASES:
        _, value = encoder.encode(event, server_name="s", now_ms=5)
        record: Any = fastavro.schemaless_reader(io.BytesIO(value), schema, None)
        assert record["source"]["snapshot"] == want


def test_read_frame_carries_the_mark() -> None:
    """The compiled load's frame (sinks/loadfast.py) for a marked row equals the encoder's."""
    encoder = AvroEncoder(compiled=False)
    first = encoder.read_frame(TABLE, "s", 90, 700_000_000, "first")
    true = encoder.read_frame(TABLE, "s", 90, 700_000_000)
    value = encoder.encode(mark(READ_EVENT, FirstRead), server_name="s", now_ms=5)[1]
    assert first[0] in value and true[0] not in value


@given(st.lists(st.one_of(st.none(), st.text()), min_size=1, max_size=5))
def test_copy_fields_reads_copy_text(fields: list[str | None]) -> None:
    """The worker's head row (read_marks.copy_fields) reads COPY's text as Copy.rows does."""
    line = ("\t".join("\\N" if f is None else f.replace("\\", "\\\\").replace("\t", "\\t")
                      .replace("\n", "\\n").replace("\r", "\\r").replace("\b", "\\b")
                      .replace("\f", "\\f").replace("\v", "\\v") for f in fields) + "\n")
    assert copy_fields(line.encode()) == fields
