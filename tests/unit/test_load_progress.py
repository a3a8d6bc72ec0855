"""The initial load's progress report: rows and bytes per table, the summary."""

from __future__ import annotations

from loads.load_progress import LoadProgress, TableProgress


def test_lines_show_rows_bytes_and_chunks_of_each_loading_table() -> None:
    progress = LoadProgress(attempt=1)
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
    progress = LoadProgress(attempt=0, worker_rss=[50_000, 66_560])
    table = progress.tables[1] = TableProgress("public.t", 10, 1, size=8192)
    table.started = table.finished = progress.started
    table.rows, table.chunks_done, table.bytes_done = 10, 1, 8192
    summary = progress.summary()
    assert summary[0].startswith("initial load (attempt 0): 10 rows from 1 tables in ")
    assert summary[1] == "  2 worker processes, peak RSS 65 MiB (the largest)"
    assert summary[2].startswith("  public.t: 10 rows, 8.0 kB, 1/1 chunks, 0.0 s")
    assert summary[2].endswith(", done")


def _loading(estimate: int, chunks: int, size: int = 0) -> tuple[LoadProgress, TableProgress]:
    progress = LoadProgress(attempt=1)
    table = progress.tables[1] = TableProgress("public.big", estimate, chunks, size=size)
    table.started = progress.started
    return progress, table


def test_a_stale_estimate_is_replaced_by_the_rows_per_byte_read() -> None:
    # the case: reltuples said 38,007, the table held about 300,000 rows
    progress, table = _loading(38_007, 40, size=40 * 1024 * 1024)
    table.rows, table.chunks_done, table.bytes_done = 270_756, 36, 36 * 1024 * 1024
    line = progress.lines()[0]
    assert line == ("  public.big: 270,756 / ~300,840 rows (re-estimated; the statistics said "
                    "38,007), 36.0 MB / 40.0 MB (90%, chunk 36/40)")
    assert table.expected_rows == 300_840
    eta = progress.eta()
    assert eta is not None and eta > 0  # rows still expected, not "done" at 38,007


def test_a_stale_estimate_with_nothing_durable_yet_is_unknown() -> None:
    progress, table = _loading(100, 8, size=8 * 8192)
    table.rows = 5_000  # handed to the sink, no chunk durable yet
    assert progress.lines()[0].startswith(
        "  public.big: 5,000 / ? rows (the statistics said 100), ")
    assert "(0%, chunk 0/8)" in progress.lines()[0]


def test_no_count_above_its_estimate_and_no_percentage_above_100() -> None:
    for estimate in (-1, 0, 10, 1_000, 1_000_000):
        for size in (0, 1 << 20):
            progress, table = _loading(estimate, 4, size=size)
            for done in range(5):
                table.chunks_done, table.bytes_done = done, size * done // 4
                table.rows = 3_000 * done + 7
                expected = table.expected_rows
                assert expected is None or expected >= table.rows, (estimate, size, done)
                assert 0.0 <= table.fraction <= 0.99
                percent = int(progress.lines()[0].split("(")[-1].split("%")[0])
                assert 0 <= percent <= 99
    table.finished = table.started
    assert table.fraction == 1.0 and table.expected_rows == table.rows
