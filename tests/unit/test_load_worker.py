"""A load worker's per-batch step: the catalog generation in shared memory decides whether its
row decoders (and the sink's knowledge of published versions) are rebuilt; a halt stops it."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

from decoder.generation import SharedGeneration
from loads.chunk_reader import Halted
from loads.load_worker import WorkerSetup, _Reader
from sinks.null import NullSink
from snapshot_builder.catalog import Column, TableVersion

TABLE = TableVersion(7, "public", "t", "d", (Column("id", 23, "int4", -1, True),
                                           Column("note", 25, "text", -1, False)))


class _Publishing(NullSink):
    def __init__(self) -> None:
        super().__init__()
        self.published: list[tuple[int, str]] = []

    def publish_table(self, table: TableVersion, lsn: int) -> None:
        self.published.append((table.oid, table.version))


def _reader() -> tuple[_Reader, _Publishing, SharedGeneration, Any]:
    context = multiprocessing.get_context("spawn")
    shared, halt = SharedGeneration(context, 3), context.Event()
    sink = _Publishing()
    setup = WorkerSetup("", "", "", (), 99, 0, 0, 10, 1.0)
    # no custom type in TABLE: the reader never needs its connection here
    return _Reader(0, setup, None, sink, None, halt, shared), sink, shared, halt  # type: ignore[arg-type]


def test_decoders_live_for_one_generation() -> None:
    reader, sink, shared, _ = _reader()
    first = reader.decoder_for(TABLE)
    assert reader.decoder_for(TABLE) is first  # the next batch, same generation
    assert sink.published == [(7, TABLE.version)]
    factory = reader.factory
    shared.bump_to(4)  # a committed catalog change
    second = reader.decoder_for(TABLE)
    assert second is not first and reader.factory is not factory  # types read again too
    assert reader.decoders.purges == 1 and reader.decoders.generation == 4
    assert sink.published == [(7, TABLE.version)] * 2  # published again before it is used
    assert second.decode(("1", "x"))[0] == {"id": 1, "note": "x"}


def test_a_halt_stops_the_next_batch() -> None:
    reader, _, _, halt = _reader()
    reader.decoder_for(TABLE)
    halt.set()
    with pytest.raises(Halted):
        reader.decoder_for(TABLE)


def test_an_error_that_does_not_pickle_keeps_its_text_and_its_kind() -> None:
    from core.errors import TerminalError, TransientError
    from loads.load_worker import _portable
    from sinks.kafka import KafkaUnreachableError

    class Odd(TerminalError):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a} and {b}")

    unreachable = _portable(KafkaUnreachableError("k:9092", "timed out"))
    assert isinstance(unreachable, TransientError)
    assert "cannot reach Kafka at k:9092: timed out" in str(unreachable)
    odd = _portable(Odd(1, 2))
    assert isinstance(odd, TerminalError) and str(odd) == "Odd: 1 and 2"
    plain = ValueError("x")
    assert _portable(plain) is plain
