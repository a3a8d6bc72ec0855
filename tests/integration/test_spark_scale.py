"""The Spark apply at scale (T19): a micro-batch touching many tables, applied with its tables
side by side, equals the source; a batch an earlier run planned larger than the bound is
applied in bounded pieces and equals the source too."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from decoder.slot import current_wal_lsn
from pgcdc.clone import compare
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.kafka import KafkaBroker
from sinks.kafka import KafkaSink
from streaming import apply, job
from tests.recording_sink import NoSink

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]

TABLES = 13
STILL = 12  # the table whose rows never leave their keys


@dataclass(frozen=True)
class _Captured:
    """Where the workload is: the source database and the topic prefix it was captured to."""

    dsn: str
    servers: str
    prefix: str


@pytest.fixture(scope="module")
def captured(module_pg_dsn: str, kafka_broker: KafkaBroker) -> _Captured:
    """The workload, written and captured once for the module: its tests only read the
    source and the topics, each into a lake and a checkpoint of its own."""
    servers, prefix = kafka_broker.bootstrap_servers, "scale"
    with psycopg.connect(module_pg_dsn, autocommit=True) as conn:
        _workload(conn, module_pg_dsn, servers, prefix)
    return _Captured(module_pg_dsn, servers, prefix)


def _workload(pg_conn: Conn, pg_dsn: str, servers: str, prefix: str) -> list[str]:
    """``TABLES`` small tables, each with inserts, updates, deletes and a key change; one
    keyless; one truncated midway; one (``STILL``) with inserts and updates of other columns
    only; all captured into Kafka."""
    names = [f"public.s{i}" for i in range(TABLES)]
    for i in range(TABLES):
        if i == 7:  # a keyless table among them: a multiset
            pg_conn.execute(f"CREATE TABLE s{i} (id int, v text)")
            pg_conn.execute(f"ALTER TABLE s{i} REPLICA IDENTITY FULL")
        else:
            pg_conn.execute(f"CREATE TABLE s{i} (id int PRIMARY KEY, v text)")
    Pipeline(PipelineConfig(pg_dsn, tables=names), NoSink()).prepare()
    for i in range(TABLES):
        pg_conn.execute(f"INSERT INTO s{i} SELECT g, 'v' || g FROM generate_series(1, 20) g")
        pg_conn.execute(f"UPDATE s{i} SET v = 'u' WHERE id % 3 = 0")
        if i == STILL:
            continue
        pg_conn.execute(f"DELETE FROM s{i} WHERE id % 5 = 0")
        if i != 7:
            pg_conn.execute(f"UPDATE s{i} SET id = id + 100 WHERE id = 1")  # the key moves
    pg_conn.execute("TRUNCATE s3")
    pg_conn.execute("INSERT INTO s3 VALUES (1, 'after')")
    sink = KafkaSink(servers, topic_prefix=prefix)
    Pipeline(PipelineConfig(pg_dsn, tables=names), sink).run(
        until_lsn=current_wal_lsn(pg_conn))
    sink.close()
    return names


def _equal(spark: Any, pg_dsn: str, config: job.JobConfig) -> None:
    specs = job.read_catalog(spark, config).tables()
    assert len(specs) == TABLES
    with psycopg.connect(pg_dsn) as conn:
        results = compare(conn, spark, config.lake, specs)
    assert all(r.source.rows > 0 for r in results if r.table != "public.s3")
    assert [r for r in results if not r.equal] == []


def test_one_batch_over_many_tables(captured: _Captured, spark: Any, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # the batch's events kept in several pieces (a few versions each), as a batch over a
    # hundred tables is
    monkeypatch.setattr(apply, "KEEP_VERSIONS", 5)
    pg_dsn = captured.dsn
    config = job.JobConfig(captured.servers, (tmp_path / "lake").as_uri(),
                           (tmp_path / "cp").as_uri(), topic_prefix=captured.prefix,
                           trigger_seconds=None)
    batches: list[dict[str, int]] = []
    query = job.start(spark, config, lambda _, applied: batches.append(applied))
    query.awaitTermination(600)
    assert query.exception() is None
    assert len(batches) == 1 and len(batches[0]) == TABLES  # every table in one batch
    _equal(spark, pg_dsn, config)
    # each table's MERGE committed with the batch's idempotent-write ids, and only it: the
    # ids of one table's thread never reach another's (a table created with them would
    # skip its MERGE)
    for name in batches[0]:
        txns = _transactions(tmp_path / "lake" / name)
        assert txns[0] == [], name  # CREATE TABLE
        assert [t for v in sorted(txns) for t in txns[v]] == [(job.app_id(config), 0)], name


def _transactions(table: Path) -> dict[int, list[tuple[str, int]]]:
    """Per Delta commit of a table, its (appId, version) transaction ids."""
    out: dict[int, list[tuple[str, int]]] = {}
    for path in (table / "_delta_log").glob("*.json"):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line]
        out[int(path.stem)] = [(a["txn"]["appId"], int(a["txn"]["version"]))
                               for a in actions if "txn" in a]
    return out


def test_oversized_planned_batch_is_applied_in_pieces(
        captured: _Captured, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A checkpoint holds a planned batch of every offset (an unbounded run that failed in
    it); the next run, bounded, meets it as planned and applies it in pieces."""
    pg_dsn, kafka_servers, topic_prefix = captured.dsn, captured.servers, captured.prefix
    lake, checkpoint = (tmp_path / "lake").as_uri(), (tmp_path / "cp").as_uri()
    unbounded = job.JobConfig(kafka_servers, lake, checkpoint, topic_prefix=topic_prefix,
                              trigger_seconds=None, max_offsets_per_trigger=0)

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the driver fails inside the batch")

    monkeypatch.setattr(job, "apply_batch", failing)
    first = job.start(spark, unbounded)
    with pytest.raises(Exception, match="fails inside the batch"):
        first.awaitTermination(600)
    monkeypatch.undo()
    assert not (tmp_path / "lake").exists()

    bounded = job.JobConfig(kafka_servers, lake, checkpoint, topic_prefix=topic_prefix,
                            trigger_seconds=None, max_offsets_per_trigger=400)
    # the planned batch is measured from its plan, without a read, to the offsets a read finds
    planned: list[Any] = []
    plan = job.planned_ranges

    def measured(batch: Any) -> Any:
        ranges = plan(batch)
        planned.append((ranges, job.batch_ranges(batch)))
        return ranges

    monkeypatch.setattr(job, "planned_ranges", measured)
    batches: list[int] = []
    with caplog.at_level(logging.INFO, logger="streaming.job"):
        second = job.start(spark, bounded, lambda batch_id, _: batches.append(batch_id))
        second.awaitTermination(600)
    assert second.exception() is None
    assert batches == [0]  # the planned batch, run as planned, none after it
    assert len(planned) == 1 and planned[0][0] is not None
    assert planned[0][0] == planned[0][1] and sum(h - lo for lo, h in planned[0][0].values()) > 400
    split = [r.getMessage() for r in caplog.records if "more than max_offsets" in r.message]
    assert len(split) == 1, split
    pieces = [r for r in caplog.records if "batch 0: piece" in r.getMessage()]
    assert len(pieces) > 1
    _equal(spark, pg_dsn, bounded)


def test_pieces_cover_the_ranges_in_order() -> None:
    ranges = {("a", 0): (10, 1010), ("a", 1): (0, 3), ("b", 0): (5, 6)}
    cut = job.pieces(ranges, 300)
    assert len(cut) == 4  # 1,004 offsets, at most about 300 each
    for where, (low, high) in ranges.items():
        slices = [p[where] for p in cut if where in p]
        assert slices[0][0] == low and slices[-1][1] == high
        assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))
    assert job.pieces(ranges, 300) == cut  # the same pieces on a replay
    assert job.pieces(ranges, 5000) == [ranges]


def test_updates_that_keep_their_keys_move_no_row(captured: _Captured, spark: Any,
                                                 tmp_path: Path) -> None:
    """The batch's summary knows which tables' updates may have moved a row to another key
    (an update with an old image, :data:`streaming.apply.MAY_MOVE`): the apply looks for
    old keys to delete, and writes tombstones, only for those and for tables with deletes."""
    from core.wire import topic_name
    from streaming import decode

    config = job.JobConfig(captured.servers, (tmp_path / "lake").as_uri(),
                           (tmp_path / "cp").as_uri(), topic_prefix=captured.prefix)
    catalog = job.read_catalog(spark, config)
    topics = [topic_name(captured.prefix, "public", f"s{i}") for i in range(TABLES)]
    batch = job._kafka_batch(spark, config, {"subscribe": ",".join(topics),
                                             "startingOffsets": "earliest",
                                             "endingOffsets": "latest",
                                             "includeHeaders": "true"})
    events = decode.parse_envelopes(batch, catalog)
    summary = apply.summarize(events, catalog)
    names = {spec.oid: spec.name for spec in catalog.tables()}
    moving = {names[oid]: found.may_move for oid, found in summary.items()}
    assert all("u" in found.ops for found in summary.values())
    # every table's key moved once, but STILL's; the keyless one's updates have old images
    assert moving == {f"s{i}": i != STILL for i in range(TABLES)}
