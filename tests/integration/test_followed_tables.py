"""A publication by table list follows a table dropped and created again under its name
(issue 15.3): PostgreSQL removes the dropped table from the publication, and without pgcdc's
trigger the new table would never be replicated, silently."""

from __future__ import annotations

import psycopg

from decoder.names import format_table_name
from decoder.slot import current_wal_lsn
from pgcdc.pipeline import Pipeline, PipelineConfig
from tests.recording_sink import RecordingSink

Conn = psycopg.Connection[tuple[object, ...]]


def _capture(dsn: str, conn: Conn, sink: RecordingSink, tables: list[str]) -> None:
    pipeline = Pipeline(PipelineConfig(dsn, tables=tables, status_interval=0.2), sink)
    pipeline.prepare()
    pipeline.run(until_lsn=current_wal_lsn(conn))


def _published(conn: Conn) -> list[str]:
    return [str(r[0]) for r in conn.execute(
        "SELECT format('%I.%I', schemaname, tablename) FROM pg_publication_tables "
        "WHERE pubname = 'pgcdc' ORDER BY 1").fetchall()]


def test_a_table_created_again_under_a_listed_name_is_published(pg_conn: Conn,
                                                                pg_dsn: str) -> None:
    name = 'odd "na;me'
    pg_conn.execute('CREATE TABLE "odd ""na;me" (id int PRIMARY KEY, v text)')
    pg_conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
    pg_conn.execute("CREATE TABLE bystander (id int PRIMARY KEY)")
    sink = RecordingSink()
    tables = [format_table_name("public", name), "public.other"]
    _capture(pg_dsn, pg_conn, sink, tables)
    pg_conn.execute('INSERT INTO "odd ""na;me" VALUES (1, \'first life\')')
    pg_conn.execute('DROP TABLE "odd ""na;me"')
    with pg_conn.transaction():  # rows written in the transaction that creates it
        pg_conn.execute('CREATE TABLE "odd ""na;me" (id bigint PRIMARY KEY, w text)')
        pg_conn.execute('INSERT INTO "odd ""na;me" VALUES (2, \'second life\')')
    pg_conn.execute('INSERT INTO "odd ""na;me" VALUES (3, \'later\')')
    pg_conn.execute("DROP TABLE other")
    pg_conn.execute("ALTER TABLE bystander RENAME TO other")  # a table renamed to the name
    pg_conn.execute("INSERT INTO other VALUES (9)")
    pg_conn.execute("CREATE TABLE unlisted (id int PRIMARY KEY)")  # never listed: left out
    pg_conn.execute("INSERT INTO unlisted VALUES (1)")
    _capture(pg_dsn, pg_conn, sink, tables)

    assert _published(pg_conn) == ['public."odd ""na;me"', "public.other"]
    mine = [(e.table.name, e.op, dict(e.after or {})) for e in sink.events]
    assert mine == [
        (name, "c", {"id": 1, "v": "first life"}),
        (name, "c", {"id": 2, "w": "second life"}),
        (name, "c", {"id": 3, "w": "later"}),
        ("other", "c", {"id": 9}),
    ]
    oids = {e.table.oid for e in sink.events if e.table.name == name}
    assert len(oids) == 2  # two tables, one name
