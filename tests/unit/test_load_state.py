"""The initial load's plan and state: chunk ranges, read positions, the state file."""

from __future__ import annotations

from pathlib import Path

import pytest

from loads.load_state import (
    MAX_CHUNK_ROWS,
    Attempt,
    ChunkState,
    LoadState,
    LoadStateError,
    LoadStateStore,
    TableState,
    extend_tail,
    max_chunk_pages,
    ordinal,
    plan_chunks,
)


def test_chunks_cover_the_table_and_end_open() -> None:
    assert plan_chunks(0, 32) == [ChunkState(0, None)]
    assert plan_chunks(32, 32) == [ChunkState(0, None)]
    assert plan_chunks(100, 32) == [ChunkState(0, 32), ChunkState(32, 64), ChunkState(64, 96),
                                    ChunkState(96, None)]
    assert plan_chunks(100, 32, whole=True) == [ChunkState(0, None)]


def test_a_grown_table_splits_its_open_tail_keeping_its_state() -> None:
    table = TableState(1, "public", "t", 1, plan_chunks(100, 32))
    table.chunks[-1].done = 0
    extend_tail(table, 100, 32)  # not grown past the tail's chunk: unchanged
    assert table.chunks[-1] == ChunkState(96, None, 0)
    extend_tail(table, 200, 32)
    assert [(c.start, c.end, c.done) for c in table.chunks[3:]] == [
        (96, 128, 0), (128, 160, 0), (160, 192, 0), (192, None, 0)]


def test_positions_are_unique_and_later_attempts_sort_after() -> None:
    positions = {ordinal(a, c, r) for a in (0, 1, 255) for c in (0, 1, (1 << 31) - 1)
                 for r in (0, 1, MAX_CHUNK_ROWS - 1)}
    assert len(positions) == 27
    assert max(positions) < 1 << 63  # a BIGINT
    assert ordinal(1, 0, 0) > ordinal(0, (1 << 31) - 1, MAX_CHUNK_ROWS - 1)
    with pytest.raises(ValueError, match="out of range"):
        ordinal(256, 0, 0)
    with pytest.raises(ValueError, match="out of range"):
        ordinal(0, 0, MAX_CHUNK_ROWS)


def test_the_largest_chunk_fits_the_row_field() -> None:
    assert max_chunk_pages(8192) * 291 <= MAX_CHUNK_ROWS  # MaxHeapTuplesPerPage of 8 kB pages
    assert max_chunk_pages(32768) * 1165 <= MAX_CHUNK_ROWS


def test_state_round_trips_through_its_file(tmp_path: Path) -> None:
    store = LoadStateStore(tmp_path / "sub" / "load.json")
    assert store.load() is None
    state = LoadState("pgcdc", "7", "db", "pub", 0x16B3748, attempts=[Attempt("750", 1)],
                      tables={16384: TableState(16384, "public", "t", 16390,
                                                [ChunkState(0, 8, 0), ChunkState(8, None)])})
    store.save(state)
    assert store.load() == state
    assert state.load_lsn == 0x16B3747 and state.attempt == 0
    (tmp_path / "sub" / "load.json").write_text('{"format": 99}')
    with pytest.raises(LoadStateError, match="format 99"):
        store.load()


def test_a_state_file_from_before_the_attempts_were_named_so_still_reads(tmp_path: Path) -> None:
    """The file's list of the load's attempts was called "generations" before issue 19: a
    load resumed by this version reads it, and writes it under the new name."""
    path = tmp_path / "load.json"
    path.write_text('{"slot": "pgcdc", "system_identifier": "7", "database": "db", '
                    '"publication": "pub", "consistent_point": 100, "status": "loading", '
                    '"generations": [{"xmin": "750", "started": 1}, {"xmin": "760", '
                    '"started": 2}], "tables": {}, "format": 1}')
    store = LoadStateStore(path)
    state = store.load()
    assert state is not None
    assert state.attempts == [Attempt("750", 1), Attempt("760", 2)] and state.attempt == 1
    store.save(state)
    assert '"attempts":' in path.read_text() and '"generations"' not in path.read_text()
    assert store.load() == state
