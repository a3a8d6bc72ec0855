"""The time-travel catalog on a real server: DDL captured in the WAL, interleaved with DML."""

from __future__ import annotations

from pathlib import Path

import psycopg
import psycopg.sql
import pytest

from decoder.slot import current_wal_lsn, drop_slot
from pgcdc.pipeline import Pipeline, PipelineConfig, ShutdownIncompleteError
from snapshot_builder.builder import BuilderState, CatalogMismatchError
from snapshot_builder.history import CatalogError, PutTable
from tests.recording_sink import RecordingSink
from tests.running import run_held, running, wait

Conn = psycopg.Connection[tuple[object, ...]]


def _pipeline(dsn: str, sink: RecordingSink, tables: list[str], **options: object) -> Pipeline:
    config = PipelineConfig(dsn, tables=tables, status_interval=0.2)
    for key, value in options.items():
        setattr(config, key, value)
    pipeline = Pipeline(config, sink)
    pipeline.prepare()
    return pipeline


def _cols(event: object) -> list[str]:
    return [c.name for c in event.table.columns]  # type: ignore[attr-defined]


def test_ddl_and_dml_in_one_transaction(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"])
    assert pipeline.builder.state is BuilderState.CONSISTENT
    before_ddl = current_wal_lsn(pg_conn)
    with pg_conn.transaction():
        pg_conn.execute("INSERT INTO t VALUES (1, 'old')")
        pg_conn.execute("ALTER TABLE t ADD COLUMN n int NOT NULL DEFAULT 7")
        pg_conn.execute("COMMENT ON TABLE t IS 'has n now'")
        pg_conn.execute("INSERT INTO t VALUES (2, 'new', 8)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))

    first, second = sink.events
    assert _cols(first) == ["id", "v"] and first.after == {"id": 1, "v": "old"}
    assert _cols(second) == ["id", "v", "n"] and second.after == {"id": 2, "v": "new", "n": 8}
    assert first.table.version != second.table.version
    assert first.commit_lsn == second.commit_lsn
    history = pipeline.builder.history
    old = history.table_at(first.table.oid, before_ddl)
    new = history.table_at(first.table.oid, first.commit_lsn)
    assert old is not None and [c.name for c in old.columns] == ["id", "v"]
    assert new is not None and new.comment == "has n now"
    assert new.columns[2].not_null is True and new.columns[2].default == "7"
    assert second.table == history.table_at(first.table.oid, first.commit_lsn) or \
        second.table.layout == new.layout


def test_ddl_in_a_rolled_back_subtransaction_disappears(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"])
    start_version = pipeline.builder.history.latest.version
    with pg_conn.transaction():
        pg_conn.execute("SAVEPOINT s")
        pg_conn.execute("ALTER TABLE t ADD COLUMN gone text")
        pg_conn.execute("ROLLBACK TO SAVEPOINT s")
        pg_conn.execute("INSERT INTO t VALUES (1)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert [_cols(e) for e in sink.events] == [["id"]]
    assert pipeline.builder.history.latest.version == start_version


def test_ddl_inside_a_streamed_transaction(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    pg_conn.execute("CREATE TABLE u (id int PRIMARY KEY, pad text)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t", "public.u"], decoding_work_mem="64kB",
                         spill_memory=16 << 10)
    with psycopg.connect(pg_dsn) as long, psycopg.connect(pg_dsn, autocommit=True) as short:
        long.execute("INSERT INTO t SELECT g, repeat('a', 100) FROM generate_series(1, 2000) g")
        long.execute("ALTER TABLE t ADD COLUMN extra int")
        short.execute("INSERT INTO u VALUES (-1, 'short')")  # commits first (t is locked)
        long.execute("INSERT INTO t SELECT g, 'b', g FROM generate_series(2001, 4000) g")
        long.commit()
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert pipeline.progress.streamed_transactions >= 1
    assert sink.events[0].key == {"id": -1} and _cols(sink.events[0]) == ["id", "pad"]
    long_events = sink.events[1:]
    assert [_cols(e) for e in long_events[:2000]] == [["id", "pad"]] * 2000
    assert [_cols(e) for e in long_events[2000:]] == [["id", "pad", "extra"]] * 2000
    assert long_events[-1].after == {"id": 4000, "pad": "b", "extra": 4000}


def test_rename_retype_drop_and_recreate(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    sink = RecordingSink()
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR ALL TABLES")
    pipeline = _pipeline(pg_dsn, sink, [], create_publication=False)
    pg_conn.execute("INSERT INTO t VALUES (1, 1)")
    pg_conn.execute("ALTER TABLE t RENAME TO t2")
    pg_conn.execute("INSERT INTO t2 VALUES (2, 2)")
    pg_conn.execute("ALTER TABLE t2 ALTER COLUMN v TYPE bigint")
    pg_conn.execute("INSERT INTO t2 VALUES (3, 3)")
    pg_conn.execute("DROP TABLE t2")
    pg_conn.execute("CREATE TABLE t2 (id int PRIMARY KEY, v bigint)")
    pg_conn.execute("INSERT INTO t2 VALUES (4, 4)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    a, b, c, d = (e.table for e in sink.events)
    assert (a.name, b.name, c.name, d.name) == ("t", "t2", "t2", "t2")
    assert a.oid == b.oid == c.oid != d.oid, "a rename keeps identity, drop-and-create does not"
    assert a.layout == b.layout and a.meta != b.meta
    assert b.layout != c.layout and c.columns[1].type_oid == 20
    assert c.layout == d.layout  # identical definitions, identical layout
    history = pipeline.builder.history
    assert history.latest.table(a.oid) is None  # dropped
    assert history.table_at(a.oid, sink.events[2].commit_lsn) == c


def test_a_column_dropped_and_added_again_is_a_new_version(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"])
    pg_conn.execute("INSERT INTO t VALUES (1, 1)")
    pg_conn.execute("ALTER TABLE t DROP COLUMN v")
    pg_conn.execute("ALTER TABLE t ADD COLUMN v int")  # row 1 has no v any more
    pg_conn.execute("INSERT INTO t VALUES (2, 2)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    before, after = (e.table for e in sink.events)
    assert before.layout == after.layout  # the same names, types and order ...
    assert before.version != after.version  # ... but v is another column
    assert [c.attnum for c in before.columns] == [1, 2]
    assert [c.attnum for c in after.columns] == [1, 3]


def test_a_composite_type_changed_while_streaming(pg_conn: Conn, pg_dsn: str) -> None:
    """A column type's change leaves the table's version as it was, so only the catalog
    generation tells the row decoders to rebuild (seed 000): a committed change before
    the next batch, the open transaction's own at the change that made it."""
    pg_conn.execute("CREATE TYPE pair AS (a int, b text)")
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, p pair)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"])
    pg_conn.execute("INSERT INTO t VALUES (1, ROW(1, 'x'))")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    pg_conn.execute("ALTER TYPE pair ADD ATTRIBUTE c bool")
    pg_conn.execute("INSERT INTO t VALUES (2, ROW(2, 'y', true))")
    with pg_conn.transaction():
        pg_conn.execute("ALTER TYPE pair RENAME ATTRIBUTE b TO label")
        pg_conn.execute("INSERT INTO t VALUES (3, ROW(3, 'z', false))")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert [e.after for e in sink.events] == [
        {"id": 1, "p": {"a": 1, "b": "x"}},
        {"id": 2, "p": {"a": 2, "b": "y", "c": True}},
        {"id": 3, "p": {"a": 3, "label": "z", "c": False}}]
    assert pipeline._decoders.rebuilds >= 2


def test_enum_value_added(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, m mood)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"])
    pg_conn.execute("INSERT INTO t VALUES (1, 'ok')")
    pg_conn.execute("ALTER TYPE mood ADD VALUE 'happy'")
    pg_conn.execute("INSERT INTO t VALUES (2, 'happy')")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert [e.after["m"] for e in sink.events if e.after] == ["ok", "happy"]
    assert sink.events[0].table.version == sink.events[1].table.version


def test_restart_between_ddl_and_the_next_dml(pg_conn: Conn, pg_dsn: str,
                                              tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    first = RecordingSink()
    pipeline = _pipeline(pg_dsn, first, ["public.t"], catalog_dir=tmp_path / "catalog")
    pg_conn.execute("ALTER TABLE t ADD COLUMN v text")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert first.events == []
    versions = pipeline.builder.history.latest.version

    second = RecordingSink()
    restarted = _pipeline(pg_dsn, second, ["public.t"], catalog_dir=tmp_path / "catalog")
    assert restarted.builder.state is BuilderState.CONSISTENT
    assert restarted.builder.history.latest.version == versions
    pg_conn.execute("INSERT INTO t VALUES (1, 'x')")
    restarted.run(until_lsn=current_wal_lsn(pg_conn))
    (event,) = second.events
    assert _cols(event) == ["id", "v"] and event.after == {"id": 1, "v": "x"}
    assert event.table == restarted.builder.history.latest.table(event.table.oid)


def test_attach_to_a_slot_created_elsewhere_with_open_transactions(
        pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE t")
    pg_conn.execute("SELECT pg_create_logical_replication_slot('pgcdc', 'pgoutput', false, true)")
    with psycopg.connect(pg_dsn) as open_txn:
        open_txn.execute("INSERT INTO t VALUES (1)")  # running while pgcdc attaches
        sink = RecordingSink()
        pipeline = _pipeline(pg_dsn, sink, ["public.t"])
        assert pipeline.builder.state is BuilderState.FULL_SNAPSHOT
        open_txn.commit()
    pg_conn.execute("INSERT INTO t VALUES (2)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert [e.key for e in sink.events] == [{"id": 1}, {"id": 2}]
    assert pipeline.builder.state is BuilderState.CONSISTENT


def test_ddl_without_the_trigger_is_an_error_not_a_guess(pg_conn: Conn, pg_dsn: str) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"])
    pg_conn.execute("ALTER EVENT TRIGGER pgcdc_ddl DISABLE")
    try:
        pg_conn.execute("ALTER TABLE t ADD COLUMN sneaky int")
        pg_conn.execute("INSERT INTO t VALUES (1, 1)")
        with pytest.raises(CatalogMismatchError, match="without the pgcdc event trigger"):
            pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    finally:
        pg_conn.execute("ALTER EVENT TRIGGER pgcdc_ddl ENABLE")


def test_catalog_rebuilt_from_kafka_equals_the_builders(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str) -> None:
    from sinks.kafka import KafkaSink
    from snapshot_builder.history import CatalogHistory, Entry
    from tests.oracle import raw_records

    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    pg_conn.execute("CREATE TABLE u (id int PRIMARY KEY)")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.t", "public.u"]), sink)
    pipeline.prepare()
    lsns = [current_wal_lsn(pg_conn)]
    for ddl, table in (("ALTER TABLE t ADD COLUMN w text", "t"),
                       ("ALTER TABLE t RENAME TO t2", "t2"),
                       ("ALTER TABLE u ADD COLUMN x int", "t2"), ("DROP TABLE u", "t2"),
                       ("ALTER TABLE t2 ALTER COLUMN v TYPE bigint", "t2")):
        pg_conn.execute(ddl)
        pg_conn.execute(psycopg.sql.SQL("INSERT INTO {} (id, v) VALUES (%s, 1)").format(
            psycopg.sql.Identifier(table)), (len(lsns),))
        lsns.append(current_wal_lsn(pg_conn))
    pipeline.run(until_lsn=lsns[-1])
    sink.close()

    records = raw_records(kafka_servers, sink.catalog_history_topic, timeout=60)
    entries = sorted({int(r.key): Entry.from_json(r.value.decode()) for r in records}.items())
    rebuilt = CatalogHistory()
    for version, entry in entries:
        rebuilt.append(entry.change, lsn=entry.lsn, commit_time=entry.commit_time,
                       expected_version=version - 1)
    own = pipeline.builder.history
    assert rebuilt.latest.version == own.latest.version >= 6
    probes = set(lsns) | {e.lsn for e in own.entries()} | {e.lsn - 1 for e in own.entries()}
    for lsn in sorted(p for p in probes if p >= own.base.lsn):
        assert rebuilt.catalog_at(lsn) == own.catalog_at(lsn), lsn


def _type_oid(conn: Conn, name: str) -> int:
    row = conn.execute("SELECT %s::regtype::oid::bigint", (name,)).fetchone()
    assert row is not None
    return int(str(row[0]))


def test_types_are_catalog_objects_versioned_even_when_unused(
        pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    from pgcdc.status import status_report

    pg_conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, m mood)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"], catalog_dir=tmp_path / "catalog")
    mood = _type_oid(pg_conn, "mood")
    baseline = pipeline.builder.history.latest.type(mood)
    assert baseline is not None and baseline.labels == ("sad", "ok")  # read at the start
    array = pipeline.builder.history.latest.type(_type_oid(pg_conn, "mood[]"))
    assert array is not None and array.kind == "array" and array.base_oid == mood

    lsns = [current_wal_lsn(pg_conn)]
    statements = [
        "ALTER TYPE mood ADD VALUE 'happy'",
        "ALTER TYPE mood RENAME VALUE 'sad' TO 'blue'",
        "CREATE DOMAIN positive AS int NOT NULL CHECK (VALUE > 0)",
        "CREATE TYPE pair AS (a int, b text)",
        "ALTER TYPE pair ADD ATTRIBUTE c bool",
        "CREATE TYPE floatrange AS RANGE (subtype = float8)",
        "ALTER TYPE pair RENAME TO couple",
        "DROP TYPE couple",
    ]
    for statement in statements:
        pg_conn.execute(statement)
        lsns.append(current_wal_lsn(pg_conn))
    positive, floatrange = _type_oid(pg_conn, "positive"), _type_oid(pg_conn, "floatrange")
    pg_conn.execute("INSERT INTO t VALUES (1, 'happy')")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    history = pipeline.builder.history

    def at(oid: int, step: int) -> object:
        return history.type_at(oid, lsns[step])

    labels = [getattr(at(mood, i), "labels", None) for i in range(3)]
    assert labels == [("sad", "ok"), ("sad", "ok", "happy"), ("blue", "ok", "happy")]
    domain = history.type_at(positive, lsns[3])
    assert domain is not None and domain.kind == "domain" and domain.base_oid == 23
    assert domain.not_null is True and domain.constraints == ("CHECK ((VALUE > 0))",)
    assert at(positive, 2) is None  # not yet created
    pair_oid = next(t.oid for t in history.catalog_at(lsns[4]).types.values()
                    if t.name == "pair")
    pair, grown = history.type_at(pair_oid, lsns[4]), history.type_at(pair_oid, lsns[5])
    assert pair is not None and [a.name for a in pair.attributes] == ["a", "b"]
    assert grown is not None and [a.name for a in grown.attributes] == ["a", "b", "c"]
    renamed = history.type_at(pair_oid, lsns[7])
    assert renamed is not None and renamed.name == "couple"  # a rename keeps identity
    assert history.type_at(pair_oid, lsns[8]) is None  # dropped
    ranged = history.type_at(floatrange, lsns[6])
    assert ranged is not None and ranged.kind == "range" and ranged.base_oid == 701
    assert history.latest.type(_type_oid(pg_conn, "int4")) is not None  # built-in, one API
    (event,) = sink.events
    column = event.table.columns[1]
    described = history.catalog_at(event.commit_lsn).column_type(column)
    assert described is not None and described.labels == ("blue", "ok", "happy")
    assert not any(t.name == "t" for t in history.latest.types.values())  # a row type isn't

    report = status_report(pg_dsn, "pgcdc", tmp_path / "progress.json", tmp_path / "catalog")
    assert report["builder_state"] == "consistent"
    assert report["catalog_version"] == history.latest.version
    assert report["catalog_types"] == len(history.latest.types) >= 5


def test_ddl_sent_again_after_a_restart_before_the_flush(pg_conn: Conn, pg_dsn: str,
                                                         tmp_path: Path) -> None:
    """The history was persisted, the sink never acknowledged: the slot sends both DDL
    transactions again, and the history neither doubles nor rejects them."""
    import threading
    import time

    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    held = RecordingSink(hold=True)
    first = _pipeline(pg_dsn, held, ["public.t"], catalog_dir=tmp_path / "catalog",
                      shutdown_grace=0.5)
    pg_conn.execute("ALTER TABLE t ADD COLUMN a int")
    pg_conn.execute("INSERT INTO t VALUES (1, 1)")
    pg_conn.execute("ALTER TABLE t ADD COLUMN b int")
    pg_conn.execute("INSERT INTO t VALUES (2, 2, 2)")
    stop = threading.Event()
    incomplete: list[ShutdownIncompleteError] = []
    runner = threading.Thread(target=run_held, args=(first, stop, incomplete))
    runner.start()
    deadline = time.monotonic() + 60
    while len(held.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    runner.join(timeout=60)
    assert not runner.is_alive() and len(held.events) == 2
    assert len(incomplete) == 1  # the stop says it left the two events undelivered
    versions = first.builder.history.latest.version

    second = RecordingSink()
    restarted = _pipeline(pg_dsn, second, ["public.t"], catalog_dir=tmp_path / "catalog")
    # what Pipeline._start_builder is to pass (pgcdc/pipeline.py is not this change's):
    # the slot's position, so that what comes again decodes with the catalog of its place
    from decoder.slot import slot_info

    info = slot_info(pg_conn, "pgcdc")
    assert info is not None and info.confirmed_flush_lsn is not None
    restarted.builder.resume(info.confirmed_flush_lsn)
    restarted.run(until_lsn=current_wal_lsn(pg_conn))
    assert [_cols(e) for e in second.events] == [["id", "a"], ["id", "a", "b"]]
    assert restarted.builder.history.latest.version == versions
    assert [e.table.version for e in second.events] == [e.table.version for e in held.events]


def test_ddl_sent_again_after_a_reconnect_before_the_flush(pg_conn: Conn, pg_dsn: str,
                                                           tmp_path: Path) -> None:
    """The same within one run: the replication connection is lost (a walsender killed, the
    server crashed: bench seed 62000186) after both DDL transactions were decoded and
    their versions persisted, none durable in the sink; the pipeline reconnects from the
    durable position and decodes what comes again with the catalog of its place (it stopped
    with "DDL happened without the pgcdc event trigger", exit 3)."""

    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    held = RecordingSink(hold=True)
    pipeline = _pipeline(pg_dsn, held, ["public.t"], catalog_dir=tmp_path / "catalog")
    pg_conn.execute("ALTER TABLE t ADD COLUMN a int")
    pg_conn.execute("INSERT INTO t VALUES (1, 1)")
    pg_conn.execute("ALTER TABLE t ADD COLUMN b int")
    pg_conn.execute("INSERT INTO t VALUES (2, 2, 2)")
    target = current_wal_lsn(pg_conn)
    with running(pipeline):
        wait(lambda: len(held.events) == 2, what="both changes")
        versions = pipeline.builder.history.latest.version
        killed = pg_conn.execute("SELECT pg_terminate_backend(active_pid) FROM "
                                 "pg_replication_slots WHERE slot_name = 'pgcdc'").fetchall()
        assert killed == [(True,)]
        wait(lambda: len(held.events) == 4, what="both sent again, on the new connection")
        held.release()
        wait(lambda: pipeline.progress.durable_lsn >= target, what="the stream durable")
    assert pipeline.progress.reconnects == 1
    assert [_cols(e) for e in held.events] == [["id", "a"], ["id", "a", "b"]] * 2
    assert [e.table.version for e in held.events[2:]] == [e.table.version
                                                          for e in held.events[:2]]
    assert pipeline.builder.history.latest.version == versions


def test_compaction_driven_by_the_slot(pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    """The history is compacted below the slot's restart_lsn as the server reports it, and
    a restart afterwards resumes and decodes as before."""
    from decoder.slot import slot_info
    from snapshot_builder.builder import RetentionPolicy

    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"], catalog_dir=tmp_path / "catalog")
    for i in range(10):
        pg_conn.execute(psycopg.sql.SQL("ALTER TABLE t ADD COLUMN {} int").format(
            psycopg.sql.Identifier(f"c{i}")))
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    old_versions = pipeline.builder.history.latest.version
    for _ in range(3):  # the server moves restart_lsn at its running-transactions records
        pg_conn.execute("CHECKPOINT")
        pg_conn.execute("INSERT INTO t (id) VALUES (-1) ON CONFLICT (id) DO NOTHING")
        pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    pg_conn.execute("ALTER TABLE t ADD COLUMN last int")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    info = slot_info(pg_conn, "pgcdc")
    assert info is not None and info.restart_lsn is not None
    history = pipeline.builder.history
    expected = history.catalog_at(info.restart_lsn).version
    assert expected >= old_versions, "restart_lsn did not pass the first DDL"

    policy = RetentionPolicy(keep_versions=0, min_drop=1)
    dropped = pipeline.builder.compact_for_slot(lambda: pg_conn, "pgcdc", policy, every=0)
    assert dropped == expected > 0 and history.base.version == expected
    assert history.base.lsn <= info.restart_lsn
    assert pipeline.builder.compact_for_slot(lambda: pg_conn, "pgcdc", policy) == 0  # rate
    assert pipeline.builder.compact_for_slot(lambda: pg_conn, "pgcdc", policy, every=0,
                                             stored_lsn=history.base.lsn - 1) == 0

    second = RecordingSink()
    restarted = _pipeline(pg_dsn, second, ["public.t"], catalog_dir=tmp_path / "catalog")
    assert restarted.builder.history.base.version == expected
    pg_conn.execute("INSERT INTO t (id, last) VALUES (1, 7)")
    restarted.run(until_lsn=current_wal_lsn(pg_conn))
    (event,) = second.events
    assert _cols(event)[-1] == "last" and event.after is not None and event.after["last"] == 7


def test_an_older_capture_without_types_is_upgraded_in_place(pg_conn: Conn) -> None:
    from snapshot_builder import ddl

    ddl.install(pg_conn)
    assert ddl.current(pg_conn)
    pg_conn.execute("DROP FUNCTION pgcdc.emit_type(oid)")  # as an older pgcdc left it
    pg_conn.execute("DROP FUNCTION pgcdc.type_definition(oid) CASCADE")
    pg_conn.execute(ddl.INSTALL_SQL.split("CREATE OR REPLACE FUNCTION pgcdc.type_definition")[0])
    assert ddl.installed(pg_conn) and not ddl.current(pg_conn)
    ddl.install(pg_conn)
    assert ddl.current(pg_conn)
    pg_conn.execute("CREATE TYPE mood AS ENUM ('a')")  # the trigger captures types again


def test_capture_4_is_upgraded_to_follow_publication_membership(pg_conn: Conn) -> None:
    """Capture 5 describes tables on ALTER PUBLICATION ... DROP TABLE (issue 15): an
    installation of capture 4 is not current, and installing upgrades its functions."""
    from snapshot_builder import ddl

    ddl.install(pg_conn)
    pg_conn.execute("COMMENT ON FUNCTION pgcdc.on_ddl() IS 'pgcdc DDL capture 4'")
    assert ddl.installed(pg_conn) and not ddl.current(pg_conn)
    ddl.install(pg_conn)
    assert ddl.current(pg_conn)
    body = pg_conn.execute("SELECT prosrc FROM pg_proc WHERE oid = "
                           "to_regprocedure('pgcdc.on_drop()')").fetchone()
    assert body is not None and "pg_publication_rel" in str(body[0])


def test_publication_column_list_with_ddl_capture(pg_conn: Conn, pg_dsn: str) -> None:
    """A publication that lists columns publishes only those: the captured definition is
    restricted to them at the baseline, at every DDL and when the list itself changes, so
    it agrees with the stream's Relation messages (it used to be a mismatch error)."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, shown text, secret text)")
    pg_conn.execute("CREATE PUBLICATION listed FOR TABLE t (id, shown)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"], publication="listed")
    oid = pg_conn.execute("SELECT 't'::regclass::oid").fetchone()[0]  # type: ignore[index]
    baseline = pipeline.builder.catalog.table(oid)
    assert baseline is not None and [c.name for c in baseline.columns] == ["id", "shown"]
    pg_conn.execute("INSERT INTO t VALUES (1, 'a', 'x')")
    pg_conn.execute("ALTER TABLE t ADD COLUMN more int, ALTER COLUMN shown SET NOT NULL")
    pg_conn.execute("INSERT INTO t VALUES (2, 'b', 'y', 5)")
    pg_conn.execute("ALTER PUBLICATION listed SET TABLE t (id, shown, more)")
    pg_conn.execute("INSERT INTO t VALUES (3, 'c', 'z', 6)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))

    assert [e.after for e in sink.events] == [
        {"id": 1, "shown": "a"}, {"id": 2, "shown": "b"}, {"id": 3, "shown": "c", "more": 6}]
    assert [_cols(e) for e in sink.events] == [["id", "shown"], ["id", "shown"],
                                               ["id", "shown", "more"]]
    assert sink.events[1].table.columns[1].not_null is True  # the captured definition
    latest = pipeline.builder.catalog.table(oid)
    assert latest is not None and [c.name for c in latest.columns] == ["id", "shown", "more"]


def test_the_catalog_folder_belongs_to_one_slot(pg_conn: Conn, pg_dsn: str,
                                                tmp_path: Path) -> None:
    """A catalog folder records its server, database and slot: another slot's history, or
    that of a slot dropped and created again (DDL in between would be missing), is refused
    with the fix, never decoded with."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    folder = tmp_path / "catalog"
    first = _pipeline(pg_dsn, RecordingSink(), ["public.t"], catalog_dir=folder)
    first.run(until_lsn=current_wal_lsn(pg_conn))
    assert first.builder.history.latest.version > 0
    assert (folder / "catalog.owner").exists()
    with pytest.raises(CatalogError, match="holds the history of slot 'pgcdc'.*not of slot "
                                           "'other'"):
        _pipeline(pg_dsn, RecordingSink(), ["public.t"], catalog_dir=folder, slot="other")
    slots = pg_conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()
    assert slots == [("pgcdc",)]  # refused before a slot was created
    drop_slot(pg_conn, "pgcdc")
    pg_conn.execute("ALTER TABLE t ADD COLUMN v text")  # while no slot records it
    with pytest.raises(CatalogError, match="earlier slot \"pgcdc\", which is gone"):
        _pipeline(pg_dsn, RecordingSink(), ["public.t"], catalog_dir=folder)
    assert pg_conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)


def test_temporary_tables_stay_out_of_the_catalog(pg_conn: Conn, pg_dsn: str,
                                                  tmp_path: Path) -> None:
    """A session's temporary table (``pg_temp_N``) is nobody else's: no version, no drop."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    sink = RecordingSink()
    pipeline = _pipeline(pg_dsn, sink, ["public.t"], catalog_dir=tmp_path / "catalog")
    baseline = pipeline.builder.history.latest.version
    pg_conn.execute("CREATE TEMPORARY TABLE scratch (id int PRIMARY KEY, v text)")
    pg_conn.execute("ALTER TABLE scratch ADD COLUMN w int DEFAULT 1")
    pg_conn.execute("DROP TABLE scratch")
    pg_conn.execute("ALTER TABLE t ADD COLUMN note text")  # a change that does count
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    history = pipeline.builder.history
    names = {table.qualified_name for entry in history.entries()
             for table in [getattr(entry.change, "table", None)] if table is not None}
    assert names == {"public.t"}, names
    assert history.latest.version == baseline + 1


def test_slot_drop_all_removes_ddl_capture(pg_conn: Conn, pg_dsn: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``pgcdc slot drop --all``: the event triggers and the pgcdc schema go with the last
    slot of the database, and the output says what was removed and what was kept."""
    from pgcdc import cli

    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    _pipeline(pg_dsn, RecordingSink(), ["public.t"], catalog_dir=tmp_path / "catalog")
    _pipeline(pg_dsn, RecordingSink(), ["public.t"], slot="other", publication="other",
              catalog_dir=tmp_path / "other")
    base = ["slot", "drop", "--yes", "--all", "--dsn", pg_dsn]
    assert cli.main([*base, "--slot", "other"]) == 0
    assert "kept DDL capture: slot(s) pgcdc" in capsys.readouterr().out

    def triggers() -> int:
        row = pg_conn.execute("SELECT count(*) FROM pg_event_trigger "
                              "WHERE evtname LIKE 'pgcdc%'").fetchone()
        return int(str(row[0])) if row else -1

    assert triggers() == 3
    assert cli.main(base) == 0
    out = capsys.readouterr().out
    assert "removed event trigger pgcdc_ddl" in out and "removed schema pgcdc" in out
    assert triggers() == 0
    row = pg_conn.execute("SELECT to_regnamespace('pgcdc') IS NULL").fetchone()
    assert row == (True,)


def test_ddl_capture_serves_every_role(pg_conn: Conn, pg_dsn: str) -> None:
    """Installed by a superuser, DDL capture fires for every role's DDL: a role that is not
    one creates, alters and drops its tables (they failed with "permission denied for schema
    pgcdc") and they are captured; a type's owner alters a type that partitions it does not
    own use (their TRUNCATE trigger is made as the installer); a TRUNCATE of one partition
    alone, which pgoutput never sends under a publication via the root, is announced with
    its published ancestors, and the pipeline counts the root as not followed (no
    incremental snapshots)."""
    role = pg_conn.execute("SELECT 'app_' || md5(current_database())").fetchone()
    assert role is not None
    app = psycopg.sql.Identifier(str(role[0]))
    pg_conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN").format(app))
    try:
        pg_conn.execute(psycopg.sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(app))
        pg_conn.execute("CREATE TYPE mood AS ENUM ('a')")
        pg_conn.execute(psycopg.sql.SQL("ALTER TYPE mood OWNER TO {}").format(app))
        pg_conn.execute("CREATE TABLE pr (id int, r int, m mood, PRIMARY KEY (id, r)) "
                        "PARTITION BY RANGE (r)")
        pg_conn.execute("CREATE TABLE pr1 PARTITION OF pr FOR VALUES FROM (0) TO (10)")
        pg_conn.execute("CREATE PUBLICATION viaroot FOR TABLE pr "
                        "WITH (publish_via_partition_root = true)")
        pg_conn.execute("INSERT INTO pr VALUES (1, 1, 'a'), (2, 2, 'a')")
        sink = RecordingSink()
        pipeline = _pipeline(pg_dsn, sink, [], publication="viaroot",
                             create_publication=False)
        pg_conn.execute("DROP TRIGGER pgcdc_truncate ON pr1")  # as if made before it
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("SET ROLE {}").format(app))
            conn.execute("CREATE TABLE mine (id int PRIMARY KEY)")
            conn.execute("ALTER TABLE mine ADD COLUMN v text")
            conn.execute("ALTER TYPE mood ADD VALUE 'b'")
            conn.execute("DROP TABLE mine")
        made = pg_conn.execute("SELECT count(*) FROM pg_trigger "
                               "WHERE tgname = 'pgcdc_truncate' AND tgrelid = 'pr1'::regclass")
        assert made.fetchone() == (1,)
        pg_conn.execute("TRUNCATE pr1")
        pipeline.run(until_lsn=current_wal_lsn(pg_conn))
        assert pipeline.progress.rewrites == {"public.pr:not_followed": 1}
        names = {t.name for t in pipeline.builder.history.latest.tables.values()}
        assert "mine" not in names and {"pr", "pr1"} <= names
        assert any(isinstance(e.change, PutTable) and e.change.table.name == "mine"
                   and [c.name for c in e.change.table.columns] == ["id", "v"]
                   for e in pipeline.builder.history.entries())
    finally:
        pg_conn.execute("DROP PUBLICATION IF EXISTS viaroot")
        pg_conn.execute("DROP TABLE IF EXISTS pr")
        pg_conn.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(app))
        pg_conn.execute(psycopg.sql.SQL("DROP ROLE {}").format(app))
