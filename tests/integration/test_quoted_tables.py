"""--tables with quoted identifiers (issue 18): a publication pgcdc creates from
``public."my,table"``, ``public."we""ird"`` and ``"Odd.Schema"."Mixed Case"`` holds exactly
those tables, and their changes stream; look-alike tables left out stay out."""

from __future__ import annotations

import psycopg

from pgcdc import cli
from pgcdc.config import load_settings
from pgcdc.pipeline import Pipeline, PipelineConfig
from tests.recording_sink import RecordingSink
from tests.running import running, wait

Conn = psycopg.Connection[tuple[object, ...]]

TABLES = 'public."my,table", public."we""ird","Odd.Schema"."Mixed Case"'
WANTED = {("public", "my,table"), ("public", 'we"ird'), ("Odd.Schema", "Mixed Case")}


def test_quoted_names_in_tables_are_published_and_streamed(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute('CREATE SCHEMA "Odd.Schema"')
    for schema, table in [*WANTED, ("public", "my"), ("public", "table"), ("public", "we"),
                          ("public", "mixed case")]:
        pg_conn.execute(psycopg.sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(
            psycopg.sql.Identifier(schema, table)))
    flags = vars(cli._parser().parse_args(["run", "--dsn", pg_dsn, "--tables", TABLES]))
    tables = load_settings(flags, environ={}).source.tables
    sink = RecordingSink()
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=tables, status_interval=0.2), sink)
    pipeline.prepare()
    published = {(str(s), str(t)) for s, t in pg_conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = 'pgcdc'")}
    assert published == WANTED
    with running(pipeline):
        for schema, table in sorted(WANTED) + [("public", "my"), ("public", "mixed case")]:
            pg_conn.execute(psycopg.sql.SQL("INSERT INTO {} VALUES (1)").format(
                psycopg.sql.Identifier(schema, table)))
        wait(lambda: len({(e.table.schema, e.table.name) for e in sink.events}) >= 3,
             what="an insert from each quoted table")
        pg_conn.execute('INSERT INTO public."we""ird" VALUES (2)')  # a marker: later than all
        wait(lambda: any(e.after == {"id": 2} for e in sink.events), what="the marker")
    got = sorted((e.table.schema, e.table.name, e.after and e.after["id"]) for e in sink.events)
    assert got == sorted([(s, t, 1) for s, t in WANTED] + [("public", 'we"ird', 2)])
