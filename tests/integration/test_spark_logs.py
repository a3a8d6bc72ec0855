"""A quiet terminal (issue 16.6): ``pgcdc spark`` sends Spark's own log lines (log4j2) to
``--spark-log``, so that its stderr holds nothing but pgcdc's own lines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from decoder.slot import current_wal_lsn
from pgcdc.pipeline import Pipeline, PipelineConfig
from sinks.kafka import KafkaSink

pytestmark = pytest.mark.spark

Conn = psycopg.Connection[tuple[object, ...]]

# a log4j line at WARN or above as any layout prints it: "... WARN Logger: ..." / "ERROR ..."
_SPARK_LINE = re.compile(r"(^|\s)(WARN|ERROR|FATAL)\s+\S+:")


def test_spark_log_lines_go_to_the_log_file_not_stderr(
        pg_conn: Conn, pg_dsn: str, kafka_servers: str, topic_prefix: str,
        tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    sink = KafkaSink(kafka_servers, topic_prefix=topic_prefix)
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.t"]), sink)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g")
    pg_conn.execute("UPDATE t SET v = 'w' WHERE id % 5 = 0")
    pg_conn.execute("DELETE FROM t WHERE id % 7 = 0")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    sink.close()

    spark_log = tmp_path / "logs" / "spark.log"  # its folder does not exist yet
    lake = tmp_path / "lake"
    result = subprocess.run(
        [sys.executable, "-m", "pgcdc", "spark", "--bootstrap-servers", kafka_servers,
         "--topic-prefix", topic_prefix, "--lake", lake.as_uri(),
         "--checkpoint", (tmp_path / "checkpoint").as_uri(), "--available-now",
         "--spark-log", str(spark_log), "--log-level", "info"],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (lake / "public.t" / "_delta_log").is_dir()  # the job did run

    spark_lines = [line for line in result.stderr.splitlines() if _SPARK_LINE.search(line)]
    assert spark_lines == [], result.stderr[-3000:]
    assert f"spark's own log lines go to {spark_log}" in result.stderr  # pgcdc's own lines stay
    assert "INFO streaming.job: batch 0 applied" in result.stderr
    assert " py4j." not in result.stderr  # its INFO lines (per callback) are below --log-level
    logged = spark_log.read_text()
    assert re.search(r"^\S+ \S+ WARN \S+: ", logged, re.MULTILINE), logged[-3000:]
