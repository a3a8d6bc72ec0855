"""``pgcdc spark``: apply the change topics to Delta tables with Spark Structured Streaming
(:mod:`streaming.job`), Spark's Kafka source configured from ``--kafka-properties`` and
``--kafka-option``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ConfigError
from pgcdc.state_paths import state_dir

if TYPE_CHECKING:
    import argparse

log = logging.getLogger(__name__)


def kafka_options(args: argparse.Namespace) -> dict[str, str]:
    """Kafka consumer properties for Spark (the Java client's names, without the ``kafka.``
    prefix Spark wants; it is added by the job): the file first, then each --kafka-option."""
    lines: list[tuple[str, str]] = []
    if args.kafka_properties is not None:
        try:
            text = Path(args.kafka_properties).read_text()
        except OSError as exc:
            msg = f"cannot read --kafka-properties {args.kafka_properties}: {exc.strerror}"
            raise ConfigError(msg) from None
        lines += [(line, f"line {n} of {args.kafka_properties}")
                  for n, line in enumerate(text.splitlines(), 1)
                  if line.strip() and not line.lstrip().startswith(("#", "!"))]
    lines += [(option, f"--kafka-option {option.partition('=')[0]}")
              for option in args.kafka_option]
    options: dict[str, str] = {}
    for line, where in lines:
        key, sep, value = line.partition("=")
        key = key.strip().removeprefix("kafka.")
        if not sep or not key:
            msg = f"{where}: expected KEY=VALUE, e.g. security.protocol=SASL_SSL"
            raise ConfigError(msg)
        options[key] = value.strip()
    return options


def spark_command(args: argparse.Namespace) -> int:
    """Start the streaming query and wait for it (``--available-now``: until it has read what
    Kafka holds)."""
    from streaming import job
    from streaming.session import build_session

    master = None if args.master == "none" else args.master
    spark_log = args.spark_log or state_dir() / f"{args.topic_prefix}.spark.log"
    log.info("spark's own log lines go to %s", spark_log)
    if not log.isEnabledFor(logging.DEBUG):  # py4j logs every callback at INFO
        logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = build_session("pgcdc-apply", master=master, spark_log=spark_log)
    config = job.JobConfig(args.bootstrap_servers, args.lake, args.checkpoint,
                           topic_prefix=args.topic_prefix,
                           trigger_seconds=None if args.available_now else args.trigger_seconds,
                           max_offsets_per_trigger=job.DEFAULT_MAX_OFFSETS
                           if args.max_offsets_per_trigger is None
                           else args.max_offsets_per_trigger,
                           changelog=args.changelog, optimize_every=args.optimize_every,
                           archive_dropped=args.archive_dropped,
                           kafka_options=kafka_options(args))
    query = job.start(spark, config)
    query.awaitTermination()
    return 0
