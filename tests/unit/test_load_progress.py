"""The initial load's progress report: rows and bytes per table, the summary."""

from __future__ import annotations

from snapshot_builder.load_progress import LoadProgress, TableProgress


def test_lines_show_rows_bytes_and_chunks_of_each_loading_table() -> None:
    progress = LoadProgress(generation=1)
    orders = progress.tables[1] = TableProgress("public.orders", 750_000, 12,
                                                size=96 * 1024 * 1024)
    orders.started = progress.started
    orders.rows, orders.chunks_done, orders.bytes_done = 125_000, 2, 16 * 1024 * 1024
    progress.tables[2] = TableProgress("public.customers", -1, 3)  # not started: no line
    lines = progress.lines()
    assert lines[0] == ("  public.orders: 125,000 / ~750,000 rows, 16.0 MB / 96.0 MB "
                        "(17%, chunk 2/12)")
    assert lines[1].startswith("load: 125,000 rows in ") and "0/2 tables done" in lines[1]
    assert len(lines) == 2


def test_summary_has_every_table_and_the_workers_memory() -> None:
    progress = LoadProgress(generation=0, worker_rss=[50_000, 66_560])
    table = progress.tables[1] = TableProgress("public.t", 10, 1, size=8192)
    table.started = table.finished = progress.started
    table.rows, table.chunks_done, table.bytes_done = 10, 1, 8192
    summary = progress.summary()
    assert summary[0].startswith("initial load (generation 0): 10 rows from 1 tables in ")
    assert summary[1] == "  2 worker processes, peak RSS 65 MiB (the largest)"
    assert summary[2].startswith("  public.t: 10 rows, 8.0 kB, 1/1 chunks, 0.0 s")
    assert summary[2].endswith(", done")
