"""A renamed table's lake table follows its name (issue 15): real PostgreSQL -> pgcdc (DDL
capture) -> Kafka -> apply_batch / the streaming job -> Delta, compared with the source.

``ALTER TABLE ... RENAME TO`` and ``SET SCHEMA`` change the table's topic and its lake
location; the rows applied before the rename move with the lake table (and its
``__tombstones`` and ``__changelog``) to the new location, whether the rename falls between
two micro-batches or inside one, back to an earlier name, into the name of a dropped table,
in a cycle of names, and after a driver killed between the moves.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psycopg
import pytest

from core.wire import table_topic_pattern
from decoder.slot import current_wal_lsn
from pgcdc.clone import compare
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.kafka import KafkaBroker
from sinks.kafka import KafkaSink
from streaming import evolution, job, multiset, ownership
from streaming.apply import apply_batch, table_path
from streaming.compaction import companions
from streaming.evolution import OID_PROPERTY
from tests.recording_sink import NoSink

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]


def _prepare(dsn: str, history: Path) -> None:
    """The publication (FOR ALL TABLES) and the slot, before the rows are written."""
    Pipeline(PipelineConfig(dsn, catalog_dir=history), NoSink()).prepare()


def _stream(dsn: str, servers: str, prefix: str, conn: Conn, history: Path) -> None:
    """``pgcdc run`` with DDL capture until everything written so far is in Kafka."""
    sink = KafkaSink(servers, topic_prefix=prefix)
    pipeline = Pipeline(PipelineConfig(dsn, catalog_dir=history, capture_ddl=True), sink)
    pipeline.prepare()
    pipeline.run(until_lsn=current_wal_lsn(conn))
    sink.close()


class _Lake:
    """The change topics applied batch by batch, as the job does (each batch the records
    that arrived since the last, the catalog read again)."""

    def __init__(self, spark: Any, servers: str, prefix: str, tmp_path: Path) -> None:
        self.spark, self.servers, self.prefix = spark, servers, prefix
        self.uri = (tmp_path / "lake").as_uri()
        self.config = job.JobConfig(servers, self.uri, (tmp_path / "cp").as_uri(),
                                    topic_prefix=prefix, changelog=True)
        self.seen: Any = None
        self.batch_id = 0
        self.last: Any = None

    def topics(self) -> Any:
        frame = (self.spark.read.format("kafka")
                 .option("kafka.bootstrap.servers", self.servers)
                 .option("subscribePattern", table_topic_pattern(self.prefix))
                 .option("startingOffsets", "earliest").option("includeHeaders", "true").load())
        return self.spark.createDataFrame(frame.collect(), frame.schema)

    def apply(self) -> dict[str, int]:
        everything = self.topics()
        batch = everything if self.seen is None else everything.join(
            self.seen.select("topic", "partition", "offset"), ["topic", "partition", "offset"],
            "left_anti")
        self.seen, self.last = everything, batch
        applied = apply_batch(self.spark, batch, self.batch_id, catalog=self.catalog(),
                              lake=self.uri, app_id="rename", changelog=True)
        self.batch_id += 1
        return applied

    def replay(self) -> None:
        """The last batch again (a retry after a crash)."""
        apply_batch(self.spark, self.last, self.batch_id - 1, catalog=self.catalog(),
                    lake=self.uri, app_id="rename", changelog=True)

    def catalog(self) -> Any:
        return job.read_catalog(self.spark, self.config)

    def check(self, dsn: str, names: list[str], gone: list[str]) -> None:
        """Every table equal to the source at its newest name's location, each holding its
        own OID with its companions beside it; nothing at the locations in ``gone``."""
        tables = self.catalog().tables()
        assert sorted(t.qualified_name for t in tables) == sorted(names)
        with psycopg.connect(dsn) as conn:
            results = compare(conn, self.spark, self.uri, tables)
        assert all(r.equal for r in results), results
        assert all(r.source.rows > 0 for r in results)
        for spec in tables:
            path = table_path(self.uri, spec)
            props = self.spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
            assert {r["key"]: r["value"] for r in props}[OID_PROPERTY] == str(spec.oid)
            assert all(_exists(c) for c in companions(path)), path
        for leaf in gone:
            assert not any(_exists(c) for c in companions(f"{self.uri}/{leaf}")), leaf


def _local(uri: str) -> str:
    return urlparse(uri).path


def _exists(uri: str) -> bool:
    return os.path.exists(_local(uri))


def _rows(conn: Conn, table: str, first: int, last: int, tag: str) -> None:
    conn.execute(f"INSERT INTO {table} SELECT g, '{tag}' || g FROM generate_series({first}, "
                 f"{last}) g")


def _churn(conn: Conn, table: str, key: int, tag: str) -> None:
    """An update and a delete of rows written earlier (the delete leaves a tombstone)."""
    conn.execute(f"UPDATE {table} SET v = '{tag}' WHERE id = {key}")
    conn.execute(f"DELETE FROM {table} WHERE id = {key + 1}")


@pytest.mark.parametrize(("ddl", "within"), [
    ("ALTER TABLE t RENAME TO t2", False),
    ("ALTER TABLE t SET SCHEMA s2", False),
    ("ALTER TABLE t RENAME TO t2", True),
], ids=["rename", "set-schema", "rename-within-a-batch"])
def test_renamed_table_moves_with_its_rows(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path, ddl: str, within: bool) -> None:
    """Rows applied under the old name, then the rename and rows under the new one in a later
    batch (``within``: changes before the rename, the rename and changes after it in one
    batch): the lake table at the new location equals the source, none at the old one."""
    history = tmp_path / "catalog"
    pg_conn.execute("CREATE SCHEMA s2")
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    _prepare(pg_dsn, history)
    _rows(pg_conn, "t", 1, 8, "a")
    _churn(pg_conn, "t", 1, "a!")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, history)
    lake = _Lake(spark, kafka_servers, topic_prefix, tmp_path)
    assert set(lake.apply()) == {"public.t"}
    lake.check(pg_dsn, ["public.t"], [])

    if within:
        _churn(pg_conn, "t", 3, "b!")
        _rows(pg_conn, "t", 9, 10, "b")
    pg_conn.execute(ddl)
    name = "s2.t" if "SCHEMA" in ddl else "public.t2"
    _churn(pg_conn, name, 5, "c!")
    _rows(pg_conn, name, 11, 12, "c")
    pg_conn.execute(f"UPDATE {name} SET v = 'c?' WHERE id = 1")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, history)
    assert set(lake.apply()) == {name}
    lake.check(pg_dsn, [name], ["public.t"])
    lake.replay()
    lake.check(pg_dsn, [name], ["public.t"])
    # the changelog moved too: it holds every event, under both names
    changelog = spark.read.format("delta").load(f"{lake.uri}/{name}__changelog")
    assert changelog.count() == lake.seen.where("value IS NOT NULL").count()


def test_renamed_back_swapped_and_into_a_dropped_tables_name(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str, spark: Any,
        tmp_path: Path) -> None:
    """Across four batches: ``t`` renamed to ``t2`` and back; ``a`` and ``b`` swap names
    through a third (each lake table's location is the other's); ``u``, created before
    ``d``, takes ``d``'s name once ``d`` is dropped (it replaces it, though born earlier);
    ``quiet`` renamed with no event after the rename (it moves all the same)."""
    history = tmp_path / "catalog"
    for table in ("t", "a", "b", "u", "d", "quiet"):
        pg_conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    _prepare(pg_dsn, history)
    for table in ("t", "a", "b", "u", "d", "quiet"):
        _rows(pg_conn, table, 1, 6, table)
        _churn(pg_conn, table, 1, f"{table}!")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, history)
    lake = _Lake(spark, kafka_servers, topic_prefix, tmp_path)
    lake.apply()
    initial = ["public.t", "public.a", "public.b", "public.u", "public.d", "public.quiet"]
    lake.check(pg_dsn, initial, [])

    pg_conn.execute("ALTER TABLE t RENAME TO t2")
    _churn(pg_conn, "t2", 3, "t2!")
    pg_conn.execute("ALTER TABLE a RENAME TO swap")
    pg_conn.execute("ALTER TABLE b RENAME TO a")
    pg_conn.execute("ALTER TABLE swap RENAME TO b")
    _churn(pg_conn, "a", 3, "was b")
    _churn(pg_conn, "b", 3, "was a")
    pg_conn.execute("DROP TABLE d")
    pg_conn.execute("ALTER TABLE u RENAME TO d")
    _churn(pg_conn, "d", 3, "was u")
    pg_conn.execute("ALTER TABLE quiet RENAME TO hushed")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, history)
    lake.apply()
    names = ["public.t2", "public.a", "public.b", "public.d", "public.hushed"]
    lake.check(pg_dsn, names, ["public.t", "public.u", "public.quiet"])
    parked = _local(f"{lake.uri}/_renaming")  # where a or b waited during the swap
    assert not os.path.exists(parked) or not os.listdir(parked)
    lake.replay()
    lake.check(pg_dsn, names, ["public.t", "public.u", "public.quiet"])

    pg_conn.execute("ALTER TABLE t2 RENAME TO t")
    _churn(pg_conn, "t", 5, "t again")
    _stream(pg_dsn, kafka_servers, topic_prefix, pg_conn, history)
    lake.apply()
    names = ["public.t", "public.a", "public.b", "public.d", "public.hushed"]
    lake.check(pg_dsn, names, ["public.t2", "public.u", "public.quiet"])


def _restart_driver(spark: Any) -> None:
    """What a new driver process starts from: no table state cached."""
    for state in (evolution._STATE, ownership._SETTLED, multiset._APPLIED):
        state.clear()
    ownership._RETIRED.clear()
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


@dataclass
class _KilledMoves:
    """The source, its topics and the lake the three killed-driver cases start from: ``t``'s
    rows applied by the streaming job, then ``t`` renamed and changed, captured into Kafka;
    the lake and the checkpoint as that first run left them kept in ``pristine``."""

    dsn: str
    lake: _Lake
    config: job.JobConfig
    lake_dir: Path
    checkpoint_dir: Path
    pristine: Path

    def restore(self) -> None:
        """The lake and the checkpoint back as the first run left them, at the same paths
        (so the same Delta application id), for the next case."""
        for target in (self.lake_dir, self.checkpoint_dir):
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(self.pristine / target.name, target)


@pytest.fixture(scope="module")
def killed_moves(module_pg_dsn: str, kafka_broker: KafkaBroker, spark: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> _KilledMoves:
    """What the three cases of :func:`test_driver_killed_between_the_moves` share (they
    differ only in what the killed driver had moved), prepared once for the module."""
    tmp_path = tmp_path_factory.mktemp("killed_moves")
    servers, prefix = kafka_broker.bootstrap_servers, "killedmoves"
    history = tmp_path / "catalog"
    with psycopg.connect(module_pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        _prepare(module_pg_dsn, history)
        _rows(conn, "t", 1, 8, "a")
        _churn(conn, "t", 1, "a!")
        _stream(module_pg_dsn, servers, prefix, conn, history)
        lake = _Lake(spark, servers, prefix, tmp_path)
        config = job.JobConfig(servers, lake.uri, (tmp_path / "cp").as_uri(),
                               topic_prefix=prefix, trigger_seconds=None, changelog=True)
        job.start(spark, config).awaitTermination()
        lake.check(module_pg_dsn, ["public.t"], [])

        conn.execute("ALTER TABLE t RENAME TO t2")
        _churn(conn, "t2", 3, "b!")
        _rows(conn, "t2", 9, 10, "b")
        _stream(module_pg_dsn, servers, prefix, conn, history)
    pristine = tmp_path / "pristine"
    for name in ("lake", "cp"):
        shutil.copytree(tmp_path / name, pristine / name)
    return _KilledMoves(module_pg_dsn, lake, config, tmp_path / "lake", tmp_path / "cp",
                        pristine)


@pytest.mark.parametrize("moved", [["", "__tombstones"], ["__tombstones"], [""]],
                         ids=["table-first", "companion-first", "table-only"])
def test_driver_killed_between_the_moves(killed_moves: _KilledMoves, spark: Any,
                                         moved: list[str]) -> None:
    """The streaming job (available-now) applies rows of ``t``; ``t`` is renamed and
    changed; a driver killed while it moved the lake table left some of the directories
    at the new location (moved here by hand); the job run again finishes the move.
    (The first run, the rename and its capture are the module's ``killed_moves``: each case
    starts from a copy of the lake and the checkpoint that run left.)"""
    killed_moves.restore()
    lake, config = killed_moves.lake, killed_moves.config
    old, new = _local(f"{lake.uri}/public.t"), _local(f"{lake.uri}/public.t2")
    assert os.path.isdir(old) and not os.path.exists(new)
    for suffix in moved:
        shutil.move(old + suffix, new + suffix)
    _restart_driver(spark)
    job.start(spark, config).awaitTermination()
    lake.check(killed_moves.dsn, ["public.t2"], ["public.t"])
    changelog = spark.read.format("delta").load(f"{lake.uri}/public.t2__changelog")
    assert changelog.count() == lake.topics().where("value IS NOT NULL").count()
