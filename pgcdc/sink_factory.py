"""The sink the configuration names (``--sink kafka|jsonl|null``, ``--exactly-once``,
``--format``, ``--avro-types``), built for the stream, the initial load and its workers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.errors import ConfigError

if TYPE_CHECKING:
    from pgcdc.config import Settings
    from sinks.avro_logical import LogicalTypes
    from sinks.sink import Sink


def _logical_types(settings: Settings) -> LogicalTypes | None:
    """Typed Avro's types (``--avro-types logical``); None for ``--avro-types text``."""
    if settings.sink.avro_types != "logical":
        return None
    from sinks.avro_logical import LogicalTypes

    return LogicalTypes.reading(settings.source.conninfo())


def build_sink(settings: Settings) -> Sink:
    """A new sink as configured; a property librdkafka refuses is a configuration error."""
    sink: Sink
    cfg = settings.sink
    json_options = cfg.json_options(settings.source.database())
    if cfg.kind == "kafka":
        if not cfg.bootstrap_servers:
            msg = ("--sink kafka needs --bootstrap-servers (or PGCDC_BOOTSTRAP_SERVERS, or "
                   "sink.bootstrap_servers in the config file)")
            raise ConfigError(msg)
        from confluent_kafka import KafkaException

        from sinks.kafka import KafkaSink

        if cfg.exactly_once:
            from sinks.kafka_txn import TransactionalKafkaSink

            try:
                return TransactionalKafkaSink(
                    cfg.bootstrap_servers, slot=settings.source.slot,
                    topic_prefix=cfg.topic_prefix, transactional_id=cfg.transactional_id,
                    commit_interval_ms=cfg.commit_interval_ms, commit_events=cfg.commit_events,
                    value_format=cfg.format, tombstones=cfg.tombstones,
                    transaction_topic=cfg.transaction_topic, client_config=cfg.kafka_config(),
                    json_options=json_options, schema_registry=cfg.schema_registry(),
                    logical=_logical_types(settings))
            except KafkaException as exc:  # librdkafka refused a property of sink.kafka
                msg = (f"config key 'sink.kafka' is not accepted by librdkafka: "
                       f"{exc.args[0].str()}; fix the property (CONFIGURATION.md of librdkafka "
                       "lists them)")
                raise ConfigError(msg) from None
        try:
            sink = KafkaSink(cfg.bootstrap_servers, topic_prefix=cfg.topic_prefix,
                             value_format=cfg.format, tombstones=cfg.tombstones,
                             transaction_topic=cfg.transaction_topic,
                             client_config=cfg.kafka_config(), json_options=json_options,
                             schema_registry=cfg.schema_registry(),
                             logical=_logical_types(settings))
        except KafkaException as exc:  # librdkafka refused a property of sink.kafka
            msg = (f"config key 'sink.kafka' is not accepted by librdkafka: {exc.args[0].str()}; "
                   "fix the property (CONFIGURATION.md of librdkafka lists them)")
            raise ConfigError(msg) from None
    elif cfg.exactly_once:
        msg = f"--exactly-once needs --sink kafka (got --sink {cfg.kind})"
        raise ConfigError(msg)
    elif cfg.kind == "jsonl":
        from sinks.jsonlines import JsonLinesSink

        sink = JsonLinesSink(cfg.output, options=json_options)
    else:
        from sinks.null import NullSink

        sink = NullSink()
    return sink
