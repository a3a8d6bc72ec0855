"""``pgcdc snapshot-table`` reads its TABLE names as ``--tables`` does (issue 18;
decoder/names.py): a part double-quoted as in SQL, an unquoted one taken as written, case
kept; a name it cannot read exits 2 with the form.  The running pgcdc then reads the named
table: its read events arrive."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from decoder.change import READ
from pgcdc.cli import main
from tests.integration.test_incremental_snapshot import _done, _streaming, _until
from tests.recording_sink import RecordingSink

Conn = psycopg.Connection[tuple[object, ...]]

ODD = '"Odd.Schema"."we""ird, name"'  # a dot, a double quote and a comma: quoted


def test_snapshot_table_names_as_tables_reads_them(pg_conn: Conn, pg_dsn: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pg_conn.execute('CREATE TABLE public."Orders" (id int PRIMARY KEY)')
    pg_conn.execute('CREATE SCHEMA "Odd.Schema"')
    pg_conn.execute(f"CREATE TABLE {ODD} (id int PRIMARY KEY)")
    pg_conn.execute('INSERT INTO public."Orders" SELECT generate_series(1, 3)')
    pg_conn.execute(f"INSERT INTO {ODD} SELECT generate_series(1, 4)")
    sink = RecordingSink()
    with _streaming(pg_dsn, sink, tmp_path / "inc.json", tables=["public.Orders", ODD],
                    chunk_size=100) as (_, incremental):
        # public.Orders is "Orders", as for --tables (SQL would fold it to orders)
        assert main(["snapshot-table", "--dsn", pg_dsn, "public.Orders", ODD]) == 0
        _until(lambda: len(_done(incremental)) == 2, "both snapshots")
        assert main(["snapshot-table", "--dsn", pg_dsn, 'public."Orders']) == 2
        assert main(["snapshot-table", "--dsn", pg_dsn, "--cancel", "public.Orders"]) == 0
    err = capsys.readouterr().err
    assert "unterminated double quote" in err and 'public."my,table"' in err, err
    assert [d["status"] for d in _done(incremental)] == ["complete", "complete"]
    reads = {(e.table.schema, e.table.name): e for e in sink.events if e.op == READ}
    assert set(reads) == {("public", "Orders"), ("Odd.Schema", 'we"ird, name')}
    counts = [sum(1 for e in sink.events if e.op == READ and e.table.name == name)
              for name in ("Orders", 'we"ird, name')]
    assert counts == [3, 4]
    signals = pg_conn.execute("SELECT type, data->'tables' FROM pgcdc.signal ORDER BY id"
                              ).fetchall()
    assert signals == [("execute-snapshot", ['public."Orders"', ODD]),
                       ("stop-snapshot", ['public."Orders"'])]
