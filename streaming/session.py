"""A Spark session with the Kafka connector and Delta Lake.

The connector and Delta jars are resolved from Maven Central with ``mvn`` (see
:mod:`core.maven`) and handed to Spark as ``spark.jars``; jars that
pyspark already ships are left out.  On a cluster, submit with
``spark-submit --packages`` instead and pass ``master=None`` (README, "Spark on a cluster").

With ``spark_log``, Spark's own log lines (log4j2: Spark, Delta, Hadoop, the Kafka client)
go to that file through ``log4j2.properties`` beside this module, not to the terminal.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from core import maven
from core.errors import JavaMissingError
from core.java import java_binary

SPARK_VERSION = "4.0.0"
DELTA_VERSION = "4.0.0"
PACKAGES = [
    f"io.delta:delta-spark_2.13:{DELTA_VERSION}",
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    f"org.apache.spark:spark-avro_2.13:{SPARK_VERSION}",
    # the lake load's reads (streaming/jdbc_read.py)
    "org.postgresql:postgresql:42.7.14",
]
LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")


def connector_jars() -> list[Path]:
    import pyspark

    bundled = Path(pyspark.__file__).parent / "jars"
    return maven.resolve("spark-connectors", PACKAGES, exclude_from=bundled)


def build_session(app_name: str = "pgcdc", *, master: str | None = "local[2]",
                  extra_config: dict[str, str] | None = None,
                  spark_log: Path | None = None) -> Any:
    """Create (or return) the Spark session configured for Kafka and Delta.

    ``spark_log``: the file Spark's own log lines go to (WARN and above) instead of stderr.
    It takes effect when this call starts the driver's JVM (not under ``spark-submit``, whose
    ``--driver-java-options`` do the same: :func:`log_java_options`).
    """
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
        # expressions evaluated as they are, not compiled to Java first: a micro-batch's
        # plans differ per table (its columns), so each table's apply compiled its own
        # classes (Janino: a quarter of the driver JVM's CPU with 20 tables in a batch);
        # interpreted, 20 tables cost about 25 % less JVM CPU and a 90,000-event batch of one
        # table no more (docs/benchmarks.md, "Compiled or interpreted expressions")
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "2g",
        # the tables of a micro-batch are applied from several threads, each in a pool of
        # its own (streaming/apply.py): they share the executors instead of queueing
        "spark.scheduler.mode": "FAIR",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.databricks.delta.snapshotPartitions": "2",
        # the MERGE source is persisted and deterministic: no second copy
        "spark.databricks.delta.merge.materializeSource": "none",
    }
    config.update(extra_config or {})
    if spark_log is not None:
        options = config.get("spark.driver.extraJavaOptions", "")
        config["spark.driver.extraJavaOptions"] = f"{options} {log_java_options(spark_log)}"
    for key, value in config.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def log_java_options(spark_log: Path) -> str:
    """The driver's JVM options that send Spark's log lines to ``spark_log`` (created with its
    folder), as ``spark.driver.extraJavaOptions`` or ``spark-submit --driver-java-options``."""
    spark_log = spark_log.absolute()
    spark_log.parent.mkdir(parents=True, exist_ok=True)
    return " ".join(_java_option(name, value) for name, value in [
        ("log4j2.configurationFile", LOG4J2_CONFIG.as_uri()),
        ("pgcdc.spark.log", str(spark_log)),
    ])


def _java_option(name: str, value: str) -> str:
    """``-Dname=value``, quoted for Spark's option splitting when the value has a space."""
    option = f"-D{name}={value}"
    if not any(c.isspace() or c in "'\"\\" for c in option):
        return option
    return "'" + option.replace("'", "'\"'\"'") + "'"
