"""A Spark session with the Kafka connector and Delta Lake.

The connector and Delta jars are resolved from Maven Central with ``mvn`` (see
:mod:`pgcdc.services.maven`) and handed to Spark as ``spark.jars``; jars that
pyspark already ships are left out.  On a cluster, submit with
``spark-submit --packages`` instead and pass ``master=None``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pgcdc.errors import JavaMissingError
from pgcdc.services import maven
from pgcdc.services.kafka import java_binary

SPARK_VERSION = "4.0.0"
DELTA_VERSION = "4.0.0"
PACKAGES = [
    f"io.delta:delta-spark_2.13:{DELTA_VERSION}",
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    f"org.apache.spark:spark-avro_2.13:{SPARK_VERSION}",
]


def connector_jars() -> list[Path]:
    import pyspark

    bundled = Path(pyspark.__file__).parent / "jars"
    return maven.resolve("spark-connectors", PACKAGES, exclude_from=bundled)


def build_session(app_name: str = "pgcdc", *, master: str | None = "local[2]",
                  extra_config: dict[str, str] | None = None) -> Any:
    """Create (or return) the Spark session configured for Kafka and Delta."""
    from pyspark.sql import SparkSession

    try:
        java = java_binary()
    except JavaMissingError:
        raise
    os.environ.setdefault("JAVA_HOME", str(Path(os.path.realpath(java)).parent.parent))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
        builder = builder.config("spark.jars", ",".join(str(j) for j in connector_jars()))
    config = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "2",
        # adaptive execution runs every shuffle stage as a job of its own and re-plans between
        # them: with a few thousand rows per micro-batch that is most of a batch's time
        # (a catch-up of 270,020 events in 10,000-offset batches: 339 Spark jobs instead of
        # 445, 122 s instead of 222 s; docs/benchmarks.md)
        "spark.sql.adaptive.enabled": "false",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "2g",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.databricks.delta.snapshotPartitions": "2",
        # the MERGE source is persisted and deterministic: no second copy
        "spark.databricks.delta.merge.materializeSource": "none",
    }
    config.update(extra_config or {})
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
