"""``pgcdc spark --master spark://...`` on a real standalone cluster (issue 16.5): a master and
two workers from pyspark's distribution (pgcdc/services/spark_cluster.py), the lake and the
checkpoint in a folder every executor shares, and the lake equal to the source after it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from decoder.slot import current_wal_lsn
from pgcdc.clone import compare
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.services.spark_cluster import SparkCluster
from sinks.kafka import KafkaSink
from streaming import job

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]
TABLE = "public.accounts"


@pytest.fixture
def spark_cluster() -> Iterator[SparkCluster]:
    with SparkCluster(workers=2) as cluster:
        yield cluster


def _workload(conn: Conn, dsn: str, servers: str, prefix: str) -> None:
    """Inserts, updates (one of them of the key) and deletes, captured into Kafka."""
    conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2), "
                 "opened date)")
    sink = KafkaSink(servers, topic_prefix=prefix)
    pipeline = Pipeline(PipelineConfig(dsn, tables=[TABLE]), sink)
    pipeline.prepare()
    conn.execute("INSERT INTO accounts SELECT g, 'owner ' || g, g * 1.5, "
                 "date '2020-01-01' + g FROM generate_series(1, 400) g")
    conn.execute("UPDATE accounts SET balance = balance + 1, owner = NULL WHERE id % 3 = 0")
    conn.execute("UPDATE accounts SET id = 1000 WHERE id = 7")  # the key changes
    conn.execute("DELETE FROM accounts WHERE id % 11 = 0")
    pipeline.run(until_lsn=current_wal_lsn(conn))
    sink.close()


def test_spark_job_on_a_standalone_cluster(
        spark_cluster: SparkCluster, pg_conn: Conn, pg_dsn: str, kafka_servers: str,
        topic_prefix: str, spark: Any, tmp_path: Path) -> None:
    _workload(pg_conn, pg_dsn, kafka_servers, topic_prefix)
    shared = tmp_path / "shared"  # one machine: a local folder is shared by every executor
    lake, checkpoint = (shared / "lake").as_uri(), (shared / "checkpoint").as_uri()

    result = subprocess.run(
        [sys.executable, "-m", "pgcdc", "spark", "--master", spark_cluster.master_url,
         "--bootstrap-servers", kafka_servers, "--topic-prefix", topic_prefix,
         "--lake", lake, "--checkpoint", checkpoint, "--available-now",
         "--spark-log", str(tmp_path / "spark.log")],
        capture_output=True, text=True, timeout=400, check=False)
    assert result.returncode == 0, (result.stderr[-3000:], spark_cluster.log_tail())

    # the work ran on the cluster's executors: the app finished there, with an executor on
    # each worker that read from Kafka and wrote the lake
    (app,) = [a for a in spark_cluster.status()["completedapps"] if a["name"] == "pgcdc-apply"]
    for index in range(2):
        executor_logs = list((spark_cluster.worker_dir(index) / app["id"]).glob("*/stderr"))
        assert executor_logs, f"no executor of {app['id']} on worker {index}"
    tasks = "".join(p.read_text(errors="replace") for index in range(2)
                    for p in (spark_cluster.worker_dir(index) / app["id"]).glob("*/stderr"))
    assert "Finished task" in tasks

    config = job.JobConfig(kafka_servers, lake, checkpoint, topic_prefix=topic_prefix)
    with psycopg.connect(pg_dsn) as conn:
        results = compare(conn, spark, lake, job.read_catalog(spark, config).tables())
    (r,) = results
    assert (r.table, r.source.rows) == (TABLE, 400 - 36), r
    assert r.equal, r
