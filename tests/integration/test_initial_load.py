"""The initial load against real PostgreSQL and Kafka: a consistent clone under concurrent writes,
read versions equal to streamed Relation versions, and a crash during the load that resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core import failpoints
from core.wire import topic_name
from decoder.change import READ, ChangeEvent
from decoder.lsn import format_lsn
from decoder.slot import current_wal_lsn, slot_info
from loads.initial_load import InitialLoad, LoadConfig
from loads.load_state import CHUNK_BITS, ROW_BITS, LoadStateStore
from pgcdc.exit_codes import EXIT_TERMINAL, EXIT_TRANSIENT
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka import KafkaSink
from tests.oracle import Writer, read_topic
from tests.recording_sink import RecordingSink

Conn = psycopg.Connection[tuple[object, ...]]

ROWS = 20_000


def _ledger(conn: Conn, rows: int = ROWS) -> Writer:
    """``ledger`` with ``rows`` rows, and a writer that updates and deletes them too."""
    conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, version int NOT NULL, payload text)")
    conn.execute("INSERT INTO ledger SELECT g, 1, repeat('s', g %% 200) "
                 "FROM generate_series(1, %s) g", (rows,))
    conn.execute("VACUUM ANALYZE ledger")
    writer = Writer(conn.info.dsn, seed=rows)
    writer.rows = dict.fromkeys(range(1, rows + 1), 1)
    writer.next_id = rows + 1
    return writer


def _fold(events: list[dict[str, Any]]) -> dict[int, tuple[int, str | None]]:
    """The topic folded by key in (commit_lsn, ordinal) order, as a consumer applies it."""
    rows: dict[int, tuple[int, str | None]] = {}
    positions = sorted(events, key=lambda e: (e["source"]["commit_lsn"], e["source"]["ordinal"]))
    for event in positions:
        if event["op"] == "d":
            rows.pop(event["key"]["id"], None)
        else:
            after = event["after"]
            rows[after["id"]] = (after["version"], after["payload"])
    return rows


def _source(conn: Conn) -> dict[int, tuple[int, str | None]]:
    return {int(i): (int(v), p) for i, v, p in  # type: ignore[call-overload]
            conn.execute("SELECT id, version, payload FROM ledger").fetchall()}


def _catch_up(dsn: str, sink: KafkaSink | RecordingSink, conn: Conn) -> Pipeline:
    pipeline = Pipeline(PipelineConfig(dsn, tables=["public.ledger"], status_interval=0.2), sink)
    pipeline.prepare()
    pipeline.run(until_lsn=current_wal_lsn(conn))
    return pipeline


def _attempt(event: dict[str, Any]) -> int:
    return int(event["source"]["ordinal"]) >> (CHUNK_BITS + ROW_BITS)


def _chunk(event: dict[str, Any]) -> int:
    return int(event["source"]["ordinal"]) >> ROW_BITS & ((1 << CHUNK_BITS) - 1)


@pytest.mark.parametrize("workers", [0, 2], ids=["threads", "2-workers"])
def test_consistent_clone_under_concurrent_writes(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                                  topic_prefix: str, tmp_path: Path,
                                                  workers: int) -> None:
    writer = _ledger(pg_conn)
    factory = partial(KafkaSink, kafka_servers, topic_prefix=topic_prefix)
    sink = factory()
    load = InitialLoad(LoadConfig(pg_dsn, tmp_path / "load.json", tables=["public.ledger"],
                                  readers=3, chunk_pages=16, workers=workers,
                                  sink_factory=factory), sink)
    assert load.pending()
    writer.start(pause=0.002)
    try:
        summary = load.run()
        time.sleep(0.5)  # and after the load, before streaming
    finally:
        writer.stop()
    assert summary.complete and not summary.resumed
    table = next(iter(summary.state.tables.values()))
    assert len(table.chunks) > 10 and table.complete
    assert not load.pending()
    slot = slot_info(pg_conn, "pgcdc")
    assert slot is not None and slot.two_phase
    assert slot.confirmed_flush_lsn == summary.state.consistent_point  # nothing flushed by the load

    _catch_up(pg_dsn, sink, pg_conn)
    sink.close()
    events = read_topic(kafka_servers, topic_name(topic_prefix, "public", "ledger"))
    reads = [e for e in events if e["op"] == READ]
    streamed = [e for e in events if e["op"] != READ]
    assert len(reads) == table.rows and ROWS // 2 < len(reads) < ROWS * 2
    assert {e["source"]["commit_lsn"] for e in reads} == {summary.state.consistent_point - 1}
    assert len({e["source"]["ordinal"] for e in reads}) == len(reads)
    assert min(e["source"]["commit_lsn"] for e in streamed) >= summary.state.consistent_point
    assert writer.ledger.transactions > 20 and len(streamed) > 20
    assert _fold(events) == _source(pg_conn)
    # every worker read chunks, each through its own producer, and reported its peak memory
    assert len(summary.progress.worker_rss) == workers
    assert all(0 < rss < 1024 * 1024 for rss in summary.progress.worker_rss)


def test_read_versions_and_values_equal_streamed_ones(pg_conn: Conn, pg_dsn: str,
                                                      tmp_path: Path) -> None:
    pg_conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    pg_conn.execute("CREATE DOMAIN short AS varchar(8) CHECK (length(VALUE) < 8)")
    pg_conn.execute("""CREATE TABLE a (id int PRIMARY KEY, gone int, name varchar(20),
                       m mood, moods mood[], s short, price numeric(10,2), at timestamptz,
                       span interval, raw bytea, tags text[], doc jsonb, r int4range,
                       twice int GENERATED ALWAYS AS (id * 2) STORED)""")
    pg_conn.execute("ALTER TABLE a DROP COLUMN gone")
    pg_conn.execute("CREATE TABLE b (k text, n int, v float8, PRIMARY KEY (k, n))")
    pg_conn.execute("CREATE TABLE c (x int, y text)")
    pg_conn.execute("ALTER TABLE c REPLICA IDENTITY FULL")
    pg_conn.execute("CREATE TABLE d (u int NOT NULL, w text, hidden text)")
    pg_conn.execute("CREATE UNIQUE INDEX d_u ON d (u)")
    pg_conn.execute("ALTER TABLE d REPLICA IDENTITY USING INDEX d_u")
    pg_conn.execute("""INSERT INTO a (id, name, m, moods, s, price, at, span, raw, tags, doc, r)
                       VALUES (1, 'ä''b', 'ok', '{sad,happy}', 'abc', 12.5,
                               '2024-02-29 10:11:12.5+02', '1 mon 2 days 00:00:01.5',
                               '\\x00ff', '{"a,b",NULL}', '{"k": [1, 2.50]}', '[1,5)')""")
    pg_conn.execute("INSERT INTO b VALUES ('x', 1, 0.1), ('y', 2, 'NaN')")
    pg_conn.execute("INSERT INTO c VALUES (1, 'one')")
    pg_conn.execute("INSERT INTO d VALUES (7, 'w', 'not published')")
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE a, b, c, d")

    loaded = RecordingSink()
    summary = InitialLoad(LoadConfig(pg_dsn, tmp_path / "load.json", readers=2), loaded).run()
    assert summary.complete
    assert {t.name for t in loaded.tables} == {"a", "b", "c", "d"}

    # the same rows again through the stream: every table sends its Relation message
    for statement in ("UPDATE a SET name = name", "UPDATE b SET v = v WHERE k = 'x'",
                      "UPDATE c SET y = y", "UPDATE d SET w = w"):
        pg_conn.execute(statement)
    streamed = RecordingSink()
    pipeline = Pipeline(PipelineConfig(pg_dsn, status_interval=0.2), streamed)
    pipeline.prepare()
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    versions = {t.oid: t.version for t in loaded.tables}
    assert {t.oid: t.version for t in streamed.tables} == versions
    assert {e.table.oid: e.table.version for e in streamed.events} == versions

    def by_key(events: list[ChangeEvent]) -> dict[tuple[int, str], dict[str, Any] | None]:
        return {(e.table.oid, json.dumps(e.key, sort_keys=True)): e.after for e in events}

    reads = by_key([e for e in loaded.events if e.op == READ])
    assert all(e.op == "u" for e in streamed.events)
    changed = by_key(streamed.events)
    assert changed.keys() <= reads.keys()
    assert {k: reads[k] for k in changed} == changed  # identical values, snapshot or stream


class _Pgcdc:
    """``python -m pgcdc`` as a separate process, to crash it for real."""

    def __init__(self, dsn: str, servers: str, prefix: str, tmp: Path, *,
                 chunk_pages: int = 16) -> None:
        self.common = ["--dsn", dsn, "--tables", "public.ledger", "--bootstrap-servers", servers,
                       "--topic-prefix", prefix, "--load-state", str(tmp / "load.json"),
                       "--progress-file", str(tmp / "progress.json"),
                       "--catalog-dir", str(tmp / "catalog"), "--readers", "2",
                       "--workers", "2", "--chunk-pages", str(chunk_pages)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, command: list[str], fail_point: str | None = None) -> None:
        env = dict(os.environ)
        env.pop("PGCDC_FAIL_POINT", None)
        if fail_point:
            env["PGCDC_FAIL_POINT"] = fail_point
        self.proc = subprocess.Popen([sys.executable, "-m", "pgcdc", *command, *self.common],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait(self, timeout: float) -> tuple[int, str]:
        assert self.proc is not None
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err.decode(errors="replace")

    def stop_after_catch_up(self, conn: Conn, target: int, timeout: float) -> str:
        """Wait until the slot confirmed ``target``, then SIGTERM: exit 0; its stderr."""
        deadline = time.monotonic() + timeout
        while (info := slot_info(conn, "pgcdc")) is None \
                or (info.confirmed_flush_lsn or 0) < target:
            assert self.proc is not None and self.proc.poll() is None, self.wait(5)
            assert time.monotonic() < deadline, "pgcdc did not catch up"
            time.sleep(0.2)
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code, err = self.wait(60)
        assert code == 0, err
        return err


def test_kill_during_load_resumes_and_keeps_durable_chunks(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        tmp_path: Path) -> None:
    writer = _ledger(pg_conn)
    pgcdc = _Pgcdc(pg_dsn, kafka_servers, topic_prefix, tmp_path)
    writer.start(pause=0.002)
    try:
        pgcdc.start(["snapshot"], fail_point="after_snapshot_chunk:6")
        code, err = pgcdc.wait(timeout=60)
        assert code == failpoints.EXIT_CODE, f"the fail point was not reached ({code}):\n{err}"
        crashed = LoadStateStore(tmp_path / "load.json").load()
        assert crashed is not None and crashed.status == "loading"
        table = next(iter(crashed.tables.values()))
        done = [i for i, c in enumerate(table.chunks) if c.done == 0]
        assert len(done) >= 6 and len(done) < len(table.chunks) and not table.complete
        time.sleep(0.5)  # writes between the crash and the resume move rows between chunks

        # the slot did not move; `run --initial-load` finishes the load, then streams
        info = slot_info(pg_conn, "pgcdc")
        assert info is not None and info.confirmed_flush_lsn == crashed.consistent_point
        pgcdc.start(["run", "--initial-load"])
        deadline = time.monotonic() + 60
        while True:
            state = LoadStateStore(tmp_path / "load.json").load()
            if state is not None and state.status == "complete":
                break
            assert pgcdc.proc is not None and pgcdc.proc.poll() is None, pgcdc.wait(5)
            assert time.monotonic() < deadline, "the resumed load did not complete"
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        writer.stop()
    err = pgcdc.stop_after_catch_up(pg_conn, current_wal_lsn(pg_conn), timeout=60)
    assert "initial load (attempt 1)" in err

    reads = _resumed_reads(pg_conn, kafka_servers, topic_prefix, done)
    assert {e["source"]["commit_lsn"] for e in reads} == {crashed.consistent_point - 1}
    # the snapshot marks across the crash (read_marks.py): the first attempt's "first"
    # was durable before its chunks were done, so the resumed one writes none; only the
    # attempt that completes writes "last"
    marked = {mark: [_attempt(e) for e in reads if e["source"]["snapshot"] == mark]
              for mark in ("first", "last")}
    assert marked == {"first": [0], "last": [1]}
    assert {e["source"]["snapshot"] for e in reads} == {"first", "true", "last"}


def _resumed_reads(conn: Conn, servers: str, prefix: str,
                   done: list[int]) -> list[dict[str, Any]]:
    """The topic, folded by key, equals the source, and the resumed load (attempt 1) read
    the chunks attempt 0 had made durable (``done``) again only in part; its read events."""
    events = read_topic(servers, topic_name(prefix, "public", "ledger"))
    assert _fold(events) == _source(conn)
    reads = [e for e in events if e["op"] == READ]
    first = [e for e in reads if _attempt(e) == 0 and _chunk(e) in done]
    again = [e for e in reads if _attempt(e) == 1 and _chunk(e) in done]
    assert first and len(again) < len(first) / 4, "durable chunks were read again in full"
    return reads


def _workers(pid: int) -> list[int]:
    """The load's worker processes: ``spawn`` children of ``pid`` (not its resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def test_a_worker_killed_mid_load_resumes(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                          topic_prefix: str, tmp_path: Path) -> None:
    """kill -9 of one worker process while chunks are being loaded: the load stops with a
    transient error naming the worker, the chunks already durable stay done, and the next
    run resumes them under a new snapshot and ends equal to the source."""
    writer = _ledger(pg_conn)
    pgcdc = _Pgcdc(pg_dsn, kafka_servers, topic_prefix, tmp_path, chunk_pages=1)
    store = LoadStateStore(tmp_path / "load.json")
    writer.start(pause=0.002)
    try:
        pgcdc.start(["snapshot"])
        assert pgcdc.proc is not None
        deadline = time.monotonic() + 60
        while True:  # a page per chunk: hundreds of checkpoints, the kill lands in between
            state = store.load()
            if state is not None and state.tables and sum(
                    c.done == 0 for t in state.tables.values() for c in t.chunks) >= 3:
                break
            assert pgcdc.proc.poll() is None, pgcdc.wait(5)
            assert time.monotonic() < deadline, "no chunk became durable"
            time.sleep(0.02)
        workers = _workers(pgcdc.proc.pid)
        assert len(workers) == 2, workers
        os.kill(workers[0], signal.SIGKILL)
        code, err = pgcdc.wait(timeout=60)
        assert code == EXIT_TRANSIENT, err
        assert f"(pid {workers[0]}) ended with exit code -9" in err, err

        crashed = store.load()
        assert crashed is not None and crashed.status == "loading"
        table = next(iter(crashed.tables.values()))
        done = [i for i, c in enumerate(table.chunks) if c.done == 0]
        assert len(done) >= 3 and not table.complete
        # the load stopped when the worker died, not once the other one had read everything
        assert len(done) < len(table.chunks) - 10
        info = slot_info(pg_conn, "pgcdc")
        assert info is not None and info.confirmed_flush_lsn == crashed.consistent_point

        pgcdc.start(["snapshot"])  # resumes: attempt 1
        code, err = pgcdc.wait(timeout=120)
        assert code == 0, err
        assert "initial load (attempt 1)" in err and "2 worker processes" in err
        time.sleep(0.5)
    finally:
        writer.stop()
    resumed = store.load()
    assert resumed is not None and resumed.status == "complete"
    pgcdc.start(["run"])
    pgcdc.stop_after_catch_up(pg_conn, current_wal_lsn(pg_conn), timeout=90)

    _resumed_reads(pg_conn, kafka_servers, topic_prefix, done)


def test_streaming_waits_for_an_unfinished_load(pg_conn: Conn, pg_dsn: str,
                                                tmp_path: Path) -> None:
    """``pgcdc run`` without ``--initial-load`` after a load was killed: it refuses, naming
    the load, and leaves the slot where the load needs it (streamed, the slot moved on and
    the table the load had not read never reached the lake: found by hand, 1,500 of 3,000
    rows missing); once the load is finished, it streams."""
    for name in ("a", "b"):
        pg_conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
        pg_conn.execute(f"INSERT INTO {name} SELECT g, 'v' || g FROM generate_series(1, 500) g")
    out = tmp_path / "events.jsonl"
    common = ["--dsn", pg_dsn, "--tables", "public.a,public.b", "--sink", "jsonl", "--output",
              str(out), "--load-state", str(tmp_path / "load.json"),
              "--progress-file", str(tmp_path / "progress.json"),
              "--catalog-dir", str(tmp_path / "catalog")]
    load = [sys.executable, "-m", "pgcdc", "snapshot", *common, "--readers", "1",
            "--chunk-pages", "1"]
    crash = subprocess.run(load, env={**os.environ, "PGCDC_FAIL_POINT": "after_snapshot_chunk:1"},
                           capture_output=True, timeout=120, check=False)
    assert crash.returncode == failpoints.EXIT_CODE, crash.stderr.decode()
    consistent = json.loads((tmp_path / "load.json").read_text())["consistent_point"]
    pg_conn.execute("UPDATE a SET v = 'changed' WHERE id <= 10")
    until = format_lsn(current_wal_lsn(pg_conn))
    stream = [sys.executable, "-m", "pgcdc", "run", *common, "--until-lsn", until]

    refused = subprocess.run(stream, capture_output=True, timeout=120, check=False)
    assert refused.returncode == EXIT_TERMINAL, refused.stderr.decode()
    message = refused.stderr.decode()
    assert "initial load of slot 'pgcdc' is unfinished" in message, message
    assert "pgcdc snapshot" in message and "--incremental-snapshots" in message
    info = slot_info(pg_conn, "pgcdc")
    assert info is not None and info.confirmed_flush_lsn == consistent  # not moved

    finished = subprocess.run(load, capture_output=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stderr.decode()
    streamed = subprocess.run(stream, capture_output=True, timeout=120, check=False)
    assert streamed.returncode == 0, streamed.stderr.decode()
    events = [e for e in map(json.loads, out.read_text().splitlines()) if "op" in e]
    reads = {(e["source"]["table"], e["after"]["id"]) for e in events if e["op"] == "r"}
    assert len(reads) == 1000
    assert sum(e["op"] == "u" for e in events) == 10


def test_row_moved_into_a_done_chunk_keeps_its_toasted_value(pg_conn: Conn, pg_dsn: str,
                                                             tmp_path: Path) -> None:
    """An update after the crash moves a row into a chunk that is already done, leaving its
    TOASTed column out of the stream (unchanged): the resumed load must read it again."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, pad text, big text) "
                    "WITH (fillfactor = 100)")
    pg_conn.execute("ALTER TABLE t ALTER big SET STORAGE EXTERNAL")
    pg_conn.execute("INSERT INTO t SELECT g, repeat('p', 1000), repeat(md5(g::text), 100) "
                    "FROM generate_series(1, 60) g")
    # fill the last page exactly, so that later the only page with room is the freed page 0
    per_page = pg_conn.execute("SELECT count(*) FROM t WHERE ctid < '(1,0)'").fetchone()
    assert per_page is not None
    missing = -60 % int(per_page[0])
    pg_conn.execute("INSERT INTO t SELECT g, repeat('p', 1000), repeat(md5(g::text), 100) "
                    "FROM generate_series(61, 60 + %s) g", (missing,))
    out = tmp_path / "events.jsonl"
    argv = [sys.executable, "-m", "pgcdc", "snapshot", "--dsn", pg_dsn, "--tables", "public.t",
            "--sink", "jsonl", "--output", str(out), "--load-state", str(tmp_path / "load.json"),
            "--progress-file", str(tmp_path / "progress.json"),
            "--catalog-dir", str(tmp_path / "catalog"), "--readers", "1", "--chunk-pages", "1"]
    crash = subprocess.run(argv, env={**os.environ, "PGCDC_FAIL_POINT": "after_snapshot_chunk:1"},
                           capture_output=True, timeout=60, check=False)
    assert crash.returncode == failpoints.EXIT_CODE, crash.stderr.decode()
    # the crashed load's readers may outlive it by a moment, their snapshots keeping the rows
    # deleted below from VACUUM: wait until no other session of this database holds one
    deadline = time.monotonic() + 30
    while pg_conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                          "current_database() AND pid <> pg_backend_pid() "
                          "AND backend_xmin IS NOT NULL").fetchone() != (0,):
        assert time.monotonic() < deadline, "the crashed load's sessions did not end"
        time.sleep(0.1)

    # free space in page 0 (done), then update rows of later pages until one lands there;
    # where the free space map sends an update depends on the server's state, so free more
    # space and try again a few times before giving up
    moved = None
    for attempt in range(4):
        pg_conn.execute("DELETE FROM t WHERE id IN "
                        "(SELECT id FROM t WHERE ctid < '(1,0)' LIMIT 3)")
        pg_conn.execute("VACUUM (DISABLE_PAGE_SKIPPING) t")
        with psycopg.connect(pg_dsn, autocommit=True) as fresh:  # no target page cached
            keys = fresh.execute("SELECT id FROM t WHERE ctid >= '(3,0)' ORDER BY id "
                                 "OFFSET %s", (attempt * 5,)).fetchall()
            for (key,) in keys:
                row = fresh.execute("UPDATE t SET pad = repeat('q', 1000) WHERE id = %s "
                                    "RETURNING ctid::text", (key,)).fetchone()
                assert row is not None
                if str(row[0]).startswith("(0,"):
                    moved = key
                    break
        if moved is not None:
            break
    assert moved is not None, "no updated row landed in the done chunk"

    resume = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    assert resume.returncode == 0, resume.stderr.decode()
    pg_conn.execute("UPDATE t SET pad = repeat('r', 1000) WHERE id = %s", (moved,))
    pg_conn.execute("DELETE FROM t WHERE id = 50")

    from sinks.jsonlines import JsonLinesSink

    sink = JsonLinesSink(str(out))
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"], status_interval=0.2), sink)
    pipeline.prepare()
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()

    events = [json.loads(line) for line in out.read_text().splitlines()]
    events = [e for e in events if "op" in e]
    moved_reads = [e for e in events if e["op"] == READ and e["after"]["id"] == moved]
    assert any(_attempt(e) == 1 for e in moved_reads), "the moved row was not read again"
    rows: dict[int, dict[str, Any]] = {}
    for event in sorted(events, key=lambda e: (e["source"]["commit_lsn"],
                                               e["source"]["ordinal"])):
        key = (event["after"] or event["before"])["id"]
        if event["op"] == "d":
            rows.pop(key, None)
        else:
            kept = {c: rows.get(key, {}).get(c) for c in event["unchanged"]}
            rows[key] = {**event["after"], **kept}
    source = {int(i): {"id": i, "pad": p, "big": b}  # type: ignore[call-overload]
              for i, p, b in pg_conn.execute("SELECT id, pad, big FROM t").fetchall()}
    assert rows == source


def test_ddl_between_the_snapshot_and_the_stream(pg_conn: Conn, pg_dsn: str, kafka_servers: str,
                                                 topic_prefix: str, tmp_path: Path) -> None:
    """`pgcdc snapshot`, then a column added and written, then `pgcdc run`: the load started
    the catalog history at the consistent point, so the stream decodes the rows before the
    ALTER with the old version and the rows after it with the new one."""
    _ledger(pg_conn, rows=200)
    pgcdc = _Pgcdc(pg_dsn, kafka_servers, topic_prefix, tmp_path)
    pgcdc.start(["snapshot"])
    code, err = pgcdc.wait(timeout=120)
    assert code == 0, err
    assert (tmp_path / "catalog").exists(), "the load did not start the catalog history"
    pg_conn.execute("UPDATE ledger SET version = 2 WHERE id = 1")
    pg_conn.execute("ALTER TABLE ledger ADD COLUMN note text")
    pg_conn.execute("UPDATE ledger SET version = 3, note = 'after' WHERE id = 2")
    target = current_wal_lsn(pg_conn)
    pgcdc.start(["run"])
    pgcdc.stop_after_catch_up(pg_conn, target, timeout=90)
    events = read_topic(kafka_servers, topic_name(topic_prefix, "public", "ledger"))
    updates = {e["after"]["id"]: e for e in events if e["op"] == "u"}
    assert "note" not in updates[1]["after"]
    assert updates[2]["after"]["note"] == "after"
    assert updates[1]["source"]["table_version"] != updates[2]["source"]["table_version"]
    assert _fold(events) == _source(pg_conn)
