"""Typed settings for ``pgcdc run``, ``snapshot``, ``status`` and ``slot``.

Three layers, later ones win: a TOML file (``--config`` or ``PGCDC_CONFIG``), the
environment (``PGCDC_<OPTION>``, the same names the flags have always read) and the
command-line flags.  The merged values are validated once, at start; an invalid value
stops with an error that names the key and where it came from::

    config key 'load.readers' must be >= 1 (got 0) in pgcdc.toml

Secrets are :class:`pydantic.SecretStr`; :func:`redact_dsn` removes a password from any
connection string before it is logged or printed.  A secret may also come from a file
(``source.password_file``, ``sink.kafka."sasl.password_file"``, ...): the file holds the
value alone, a trailing newline is dropped, and it is read once, at start.

``[sink.kafka]`` passes librdkafka properties (``security.protocol``, ``ssl.ca.location``,
``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ...) to the producer and the admin
client; ``PGCDC_KAFKA_<PROPERTY>`` sets one from the environment, dots written as
underscores (``PGCDC_KAFKA_SASL_PASSWORD``, ``PGCDC_KAFKA_SASL_PASSWORD_FILE``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import psycopg
from psycopg import conninfo
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from core.errors import ConfigError
from decoder.names import TableNameError, parse_table_name, split_table_list

if TYPE_CHECKING:
    from sinks.debezium_json import JsonOptions
    from sinks.registry import SchemaRegistry

ENV_PREFIX = "PGCDC_"
KAFKA_ENV_PREFIX = ENV_PREFIX + "KAFKA_"

# librdkafka properties whose values are secrets: SecretStr, never printed, may come from a
# file named by '<property>_file'
KAFKA_SECRETS = frozenset({"sasl.password", "ssl.key.password", "ssl.keystore.password",
                           "ssl.key.pem", "sasl.oauthbearer.client.secret"})
# properties pgcdc sets itself: its delivery guarantee rests on them
_KAFKA_RESERVED = {
    "bootstrap.servers": "is set by sink.bootstrap_servers (--bootstrap-servers): move it there",
    "enable.idempotence": "is always true in pgcdc (its producer is idempotent): remove it",
    "acks": "is always 'all' in pgcdc (durable means every in-sync replica): remove it",
    "transactional.id": "is set by sink.transactional_id (--transactional-id) with "
                        "sink.exactly_once: move it there",
}
_KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_KAFKA_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
_KAFKA_PROPERTY = re.compile(r"[a-z][a-z0-9]*(?:\.[a-z0-9]+)*")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _split_tables(value: object) -> object:
    """A comma-separated list split at commas outside double quotes; each name readable
    as ``schema.table`` with quoted parts (decoder/names.py), or a configuration error."""
    try:
        if isinstance(value, str):
            names = split_table_list(value)
            for name in names:
                parse_table_name(name)
            return names or None
        if isinstance(value, list):
            for name in value:
                if isinstance(name, str):
                    parse_table_name(name)
    except TableNameError as exc:
        _fail("source.tables", f"cannot be read: {exc}")
    return value


def _fail(key: str, reason: str) -> NoReturn:
    """Raise a validation error about one key; :func:`_describe` prints it as it is."""
    error = PydanticCustomError("pgcdc_key", "{key} {reason}", {"key": key, "reason": reason})
    raise error


def _read_secret(key: str, value: object) -> SecretStr:
    """The secret held by the file ``value`` names (a trailing newline dropped)."""
    if not isinstance(value, str | Path):
        _fail(key, "must be the path of a file holding the secret")
    try:
        text = Path(value).read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        _fail(key, f"names {value}, which pgcdc cannot read ({reason}): "
                   "fix the path or the file's permissions")
    if not text:
        _fail(key, f"names {value}, which is empty: write the secret into it")
    return SecretStr(text)


_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


class SourceSettings(_Section):
    dsn: SecretStr
    password: SecretStr | None = None  # added to the DSN; keeps it out of the DSN itself
    password_file: Path | None = None  # read at start into ``password``
    slot: str = Field(default="pgcdc", min_length=1)
    publication: str = Field(default="pgcdc", min_length=1)
    tables: list[str] | None = None
    # seconds of silence after which the replication connection is dead; 0: never
    receive_timeout: float = Field(default=60.0, ge=0)
    # pgoutput's origin filter (PostgreSQL 16+): "none" leaves out changes that came from
    # another node through logical replication; "any" (the server's default) keeps them
    origin: Literal["any", "none"] | None = None
    # pgoutput's binary option (PostgreSQL 14+): "auto" streams binary when every published
    # column type has a binary decoder in pgcdc, text otherwise (decoder/transfer.py); the
    # common types decode in C in both formats (docs/benchmarks.md, "Binary values")
    binary: Literal["auto", "on", "off"] = "auto"

    _tables = field_validator("tables", mode="before")(_split_tables)

    @field_validator("dsn")
    @classmethod
    def _dsn(cls, value: SecretStr) -> SecretStr:
        """A connection string libpq can parse, with values it accepts (checked here, so that
        a typo is a configuration error, not a failed connection to retry)."""
        try:
            options = conninfo.conninfo_to_dict(value.get_secret_value())
        except psycopg.ProgrammingError as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "unreadable"
            _fail("source.dsn", f"is not a connection string libpq reads ({reason}): write "
                                "key=value pairs (host=db dbname=app user=cdc) or a "
                                "postgresql:// URI")
        sslmode = options.get("sslmode")
        if sslmode is not None and sslmode not in _SSLMODES:
            _fail("source.dsn", f"has sslmode={sslmode}: use one of {', '.join(_SSLMODES)}")
        for port in str(options.get("port") or "").split(","):
            if port and not (port.strip().isdigit() and 0 < int(port) < 65536):
                _fail("source.dsn", f"has port={options['port']}: a port is a number from 1 "
                                    "to 65535 (one per host, separated by commas)")
        return value

    @model_validator(mode="before")
    @classmethod
    def _password_from_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("password_file") is not None:
            if data.get("password") is not None:
                _fail("source.password_file", "and source.password are both set: keep one")
            data = dict(data, password=_read_secret("source.password_file",
                                                    data["password_file"]))
        return data

    def database(self) -> str:
        """The database the DSN names, as libpq picks it: ``dbname``, else ``PGDATABASE``,
        else the user name (``source.db`` of the JSON envelope)."""
        options = conninfo.conninfo_to_dict(self.dsn.get_secret_value())
        name = options.get("dbname")
        if name and "=" not in str(name) and "://" not in str(name):
            return str(name)
        user = options.get("user") or os.environ.get("PGUSER")
        if user is None:
            import getpass

            try:
                user = getpass.getuser()
            except (KeyError, OSError):  # a uid without a name: libpq would fail too
                user = ""
        return os.environ.get("PGDATABASE") or str(user)

    def conninfo(self) -> str:
        """The connection string to connect with (the password included)."""
        dsn = self.dsn.get_secret_value()
        if self.password is None:
            return dsn
        return conninfo.make_conninfo(dsn, password=self.password.get_secret_value())


class SinkSettings(_Section):
    kind: Literal["kafka", "jsonl", "null"] = "kafka"
    bootstrap_servers: str | None = None
    topic_prefix: str = Field(default="pgcdc", min_length=1)
    format: Literal["avro", "json"] = "avro"
    # how format json writes values (sinks/debezium_json.py): Debezium's encodings under
    # its four settings (defaults as Debezium's), or pgcdc's own ISO strings (json_mode
    # pgcdc: the JSON pgcdc's Spark job reads)
    json_mode: Literal["debezium", "pgcdc"] = "debezium"
    # format avro's column types (sinks/avro_logical.py): every type Avro has no primitive
    # for as a string (text, the default), or typed Avro with logical types (logical)
    avro_types: Literal["text", "logical"] = "text"
    decimal_handling_mode: Literal["precise", "double", "string"] = "precise"
    time_precision_mode: Literal["adaptive", "adaptive_time_microseconds", "connect",
                                 "isostring"] = "adaptive"
    interval_handling_mode: Literal["numeric", "string"] = "numeric"
    binary_handling_mode: Literal["bytes", "base64", "base64-url-safe", "hex"] = "bytes"
    tombstones: bool = True
    transaction_topic: bool = False
    output: str = "-"
    # exactly-once for read_committed consumers: Kafka transactions (docs/exactly-once.md)
    exactly_once: bool = False
    transactional_id: str | None = Field(default=None, min_length=1)  # default from prefix, slot
    commit_interval_ms: int = Field(default=1000, ge=1)
    commit_events: int = Field(default=10_000, ge=1)
    kafka: dict[str, str | SecretStr] = Field(default_factory=dict)  # librdkafka properties
    # Avro in the Confluent wire format, schemas registered in this registry (its
    # Confluent-compatible API's base URL, user:password@ allowed; sinks/registry.py)
    schema_registry_url: SecretStr | None = None
    schema_registry_user: str | None = Field(default=None, min_length=1)
    schema_registry_password: SecretStr | None = None
    schema_registry_password_file: Path | None = None  # read at start into the password
    schema_registry_ca: Path | None = None  # the CA of an https registry (default: the system's)

    @model_validator(mode="before")
    @classmethod
    def _registry_password_from_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("schema_registry_password_file") is not None:
            if data.get("schema_registry_password") is not None:
                _fail("sink.schema_registry_password_file",
                      "and sink.schema_registry_password are both set: keep one")
            data = dict(data, schema_registry_password=_read_secret(
                "sink.schema_registry_password_file", data["schema_registry_password_file"]))
        return data

    @model_validator(mode="after")
    def _avro_types(self) -> SinkSettings:
        if self.avro_types != "text" and self.format != "avro":
            _fail("sink.avro_types", f"types Avro's columns: it goes with format avro "
                                     f"(--format avro), not {self.format}")
        return self

    @model_validator(mode="after")
    def _registry(self) -> SinkSettings:
        if self.schema_registry_url is None:
            for name in ("schema_registry_user", "schema_registry_password",
                         "schema_registry_ca"):
                if getattr(self, name) is not None:
                    _fail(f"sink.{name}", "goes with sink.schema_registry_url "
                                          "(--schema-registry-url): set it or drop this")
            return self
        if self.format != "avro":
            _fail("sink.schema_registry_url", "writes Avro in the Confluent wire format: it "
                                              "goes with format avro (--format avro)")
        if self.kind != "kafka":
            _fail("sink.schema_registry_url", f"goes with the Kafka sink, not {self.kind}")
        if self.schema_registry_ca is not None and not self.schema_registry_ca.exists():
            _fail("sink.schema_registry_ca", f"names {self.schema_registry_ca}, which does "
                                             "not exist: fix the path")
        try:
            self.schema_registry()
        except ConfigError as exc:
            _fail("sink.schema_registry_url", f"cannot be used: {exc}")
        return self

    def schema_registry(self) -> SchemaRegistry | None:
        """The registry client ``schema_registry_url`` asks for (None: no registry)."""
        if self.schema_registry_url is None:
            return None
        from sinks.registry import SchemaRegistry

        password = self.schema_registry_password
        return SchemaRegistry(self.schema_registry_url.get_secret_value(),
                              user=self.schema_registry_user,
                              password=None if password is None else password.get_secret_value(),
                              ca=self.schema_registry_ca)

    @field_validator("kafka", mode="before")
    @classmethod
    def _kafka_properties(cls, value: object) -> dict[str, str | SecretStr]:
        return kafka_properties(value)

    @model_validator(mode="after")
    def _json_modes(self) -> SinkSettings:
        defaults = {"decimal_handling_mode": "precise", "time_precision_mode": "adaptive",
                    "interval_handling_mode": "numeric", "binary_handling_mode": "bytes"}
        if self.json_mode == "pgcdc":
            for name, default in defaults.items():
                if getattr(self, name) != default:
                    _fail(f"sink.{name}", "applies to Debezium's encoding, not to json_mode "
                                          "pgcdc: drop it or use json_mode debezium")
        return self

    def json_options(self, database: str) -> JsonOptions:
        """How ``format json`` writes values, ``database`` as ``source.db``."""
        from sinks.debezium_json import JsonOptions

        return JsonOptions(mode=self.json_mode, decimal=self.decimal_handling_mode,
                           time=self.time_precision_mode,
                           interval=self.interval_handling_mode,
                           binary=self.binary_handling_mode, database=database)

    def kafka_config(self) -> dict[str, str]:
        """The librdkafka properties to give the Kafka clients (secrets revealed)."""
        return {k: v.get_secret_value() if isinstance(v, SecretStr) else v
                for k, v in self.kafka.items()}


def flatten_properties(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"sasl": {"mechanism": "PLAIN"}}`` (TOML's dotted keys) -> ``{"sasl.mechanism": ...}``."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, Mapping):
            out.update(flatten_properties(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


def kafka_properties(value: object) -> dict[str, str | SecretStr]:
    """Validate librdkafka properties: names, values, the reserved ones, secrets (from their
    ``_file`` when given) as SecretStr, and the security settings that must go together."""
    if not isinstance(value, Mapping):
        _fail("sink.kafka", "must be a table of librdkafka properties ([sink.kafka])")
    flat = flatten_properties(value)
    props: dict[str, str | SecretStr] = {}
    for key, item in flat.items():
        name = f"sink.kafka.{key}"
        base = key.removesuffix("_file")
        if not _KAFKA_PROPERTY.fullmatch(base):
            _fail(name, "is not a librdkafka property name (lowercase words joined by "
                        "dots, e.g. security.protocol)")
        if base != key:
            if base not in KAFKA_SECRETS:
                _fail(name, "is not a setting: only secrets are read from files ("
                      + ", ".join(sorted(f"{s}_file" for s in KAFKA_SECRETS)) + ")")
            if base in flat:
                _fail(name, f"and sink.kafka.{base} are both set: keep one")
            props[base] = _read_secret(name, item)
            continue
        if key in _KAFKA_RESERVED:
            _fail(name, _KAFKA_RESERVED[key])
        if isinstance(item, SecretStr):
            text = item.get_secret_value()
        elif isinstance(item, bool):
            text = "true" if item else "false"
        elif isinstance(item, str | int | float):
            text = str(item)
        else:
            _fail(name, "must be a string, a number or true/false")
        props[key] = SecretStr(text) if key in KAFKA_SECRETS else text
    _check_kafka_security(props)
    return props


def _check_kafka_security(props: Mapping[str, str | SecretStr]) -> None:
    def plain(key: str) -> str | None:
        item = props.get(key)
        return item if isinstance(item, str) else None

    protocol = (plain("security.protocol") or "PLAINTEXT").upper()
    if protocol not in _KAFKA_PROTOCOLS:
        _fail("sink.kafka.security.protocol",
              f"must be one of {', '.join(_KAFKA_PROTOCOLS)} (got {protocol!r})")
    mechanism = plain("sasl.mechanism") or plain("sasl.mechanisms")
    if protocol.startswith("SASL_"):
        if mechanism is None:
            _fail("sink.kafka.sasl.mechanism",
                  f"is required with security.protocol={protocol}: one of "
                  + ", ".join(_KAFKA_MECHANISMS))
        if mechanism not in _KAFKA_MECHANISMS:  # librdkafka: case matters
            _fail("sink.kafka.sasl.mechanism",
                  f"must be one of {', '.join(_KAFKA_MECHANISMS)} (got {mechanism!r})")
        if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            for key in ("sasl.username", "sasl.password"):
                if key not in props:
                    env = KAFKA_ENV_PREFIX + key.upper().replace(".", "_")
                    also = f", sink.kafka.{key}_file or {env}_FILE" \
                        if key in KAFKA_SECRETS else ""
                    _fail(f"sink.kafka.{key}", f"is required with sasl.mechanism={mechanism}: "
                                               f"set it (or {env}{also})")
    for key, item in props.items():
        if key.endswith(".location") and isinstance(item, str) and item != "probe" \
                and not Path(item).exists():
            _fail(f"sink.kafka.{key}", f"names {item}, which does not exist: fix the path")


class StateSettings(_Section):
    progress_file: Path | None = None
    catalog_dir: Path | None = None
    load_state: Path | None = None
    incremental_state: Path | None = None  # incremental snapshots (default <slot>.incremental.json)


class LoadSettings(_Section):
    initial: bool = False
    readers: int = Field(default=4, ge=1)
    workers: int | None = Field(default=None, ge=0)  # processes; None: one per CPU; 0: threads
    # pages per chunk; None: the load's own default (1024 into Kafka, 16384 into the lake)
    chunk_pages: int | None = Field(default=None, ge=1)
    incremental: bool = False  # pgcdc run serves incremental snapshots (pgcdc.signal)
    incremental_chunk_rows: int = Field(default=1024, ge=1)


DEFAULT_MAX_LAG_BYTES = 10 * 1024**3
DEFAULT_HEARTBEAT_INTERVAL = 60.0


class ServiceSettings(_Section):
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"
    # the WAL-retention guard, on by default: past this lag, on_lag acts (warn: a log line and
    # a count, /health/ready 503); 10 GiB is a fraction of a managed server's disk; 0: off
    max_lag_bytes: int = Field(default=DEFAULT_MAX_LAG_BYTES, ge=0)
    on_lag: Literal["warn", "stop"] = "warn"
    lag_interval: float = Field(default=5.0, gt=0)
    status_interval: float = Field(default=1.0, gt=0)
    # heartbeats, on by default: pg_logical_emit_message (EXECUTE granted to PUBLIC, no
    # table, no extra privilege) every minute; 0: off
    heartbeat_interval: float = Field(default=DEFAULT_HEARTBEAT_INTERVAL, ge=0)
    # a stop (SIGTERM) waits this long for the sink; then pgcdc exits 4 saying what it left
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)
    max_retries: int = Field(default=0, ge=0)  # failures in a row before giving up; 0: never
    retry_max_delay: float = Field(default=30.0, gt=0)  # the backoff's cap, seconds
    # no acknowledgement for this long while the sink holds messages: a stall (warned once,
    # counted, /health/ready 503); 0: not watched
    sink_stall_seconds: float = Field(default=30.0, ge=0)


class LogSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "WARNING"
    format: Literal["text", "json"] = "text"

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


class Settings(_Section):
    source: SourceSettings
    sink: SinkSettings = Field(default_factory=SinkSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    load: LoadSettings = Field(default_factory=LoadSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    log: LogSettings = Field(default_factory=LogSettings)


@dataclass(frozen=True, slots=True)
class _Key:
    """One setting: its key, the flag (argparse ``dest``) and environment name that set it."""

    path: tuple[str, str]
    dest: str | None
    env: str | None
    from_flag: Callable[[Any], Any] = lambda value: value

    @property
    def name(self) -> str:
        return ".".join(self.path)


KEYS: tuple[_Key, ...] = (
    _Key(("source", "dsn"), "dsn", "DSN"),
    _Key(("source", "password"), None, "PASSWORD"),
    _Key(("source", "password_file"), None, "PASSWORD_FILE"),
    _Key(("source", "slot"), "slot", "SLOT"),
    _Key(("source", "publication"), "publication", "PUBLICATION"),
    _Key(("source", "tables"), "tables", "TABLES"),
    _Key(("source", "receive_timeout"), "receive_timeout", "RECEIVE_TIMEOUT"),
    _Key(("source", "origin"), "origin", "ORIGIN"),
    _Key(("source", "binary"), "binary", "BINARY"),
    _Key(("sink", "kind"), "sink", "SINK"),
    _Key(("sink", "bootstrap_servers"), "bootstrap_servers", "BOOTSTRAP_SERVERS"),
    _Key(("sink", "topic_prefix"), "topic_prefix", "TOPIC_PREFIX"),
    _Key(("sink", "format"), "format", "FORMAT"),
    _Key(("sink", "json_mode"), "json_mode", "JSON_MODE"),
    _Key(("sink", "avro_types"), "avro_types", "AVRO_TYPES"),
    _Key(("sink", "decimal_handling_mode"), "decimal_handling_mode", "DECIMAL_HANDLING_MODE"),
    _Key(("sink", "time_precision_mode"), "time_precision_mode", "TIME_PRECISION_MODE"),
    _Key(("sink", "interval_handling_mode"), "interval_handling_mode",
         "INTERVAL_HANDLING_MODE"),
    _Key(("sink", "binary_handling_mode"), "binary_handling_mode", "BINARY_HANDLING_MODE"),
    _Key(("sink", "tombstones"), "no_tombstones", "TOMBSTONES", lambda value: not value),
    _Key(("sink", "transaction_topic"), "transaction_topic", "TRANSACTION_TOPIC"),
    _Key(("sink", "output"), "output", "OUTPUT"),
    _Key(("sink", "exactly_once"), "exactly_once", "EXACTLY_ONCE"),
    _Key(("sink", "transactional_id"), "transactional_id", "TRANSACTIONAL_ID"),
    _Key(("sink", "commit_interval_ms"), "commit_interval_ms", "COMMIT_INTERVAL_MS"),
    _Key(("sink", "commit_events"), None, "COMMIT_EVENTS"),
    _Key(("sink", "schema_registry_url"), "schema_registry_url", "SCHEMA_REGISTRY_URL"),
    _Key(("sink", "schema_registry_user"), "schema_registry_user", "SCHEMA_REGISTRY_USER"),
    _Key(("sink", "schema_registry_password"), "schema_registry_password",
         "SCHEMA_REGISTRY_PASSWORD"),
    _Key(("sink", "schema_registry_password_file"), None, "SCHEMA_REGISTRY_PASSWORD_FILE"),
    _Key(("sink", "schema_registry_ca"), "schema_registry_ca", "SCHEMA_REGISTRY_CA"),
    _Key(("state", "progress_file"), "progress_file", "PROGRESS_FILE"),
    _Key(("state", "catalog_dir"), "catalog_dir", "CATALOG_DIR"),
    _Key(("state", "load_state"), "load_state", "LOAD_STATE"),
    _Key(("load", "initial"), "initial_load", "INITIAL_LOAD"),
    _Key(("load", "readers"), "readers", "READERS"),
    _Key(("load", "workers"), "workers", "WORKERS"),
    _Key(("load", "chunk_pages"), "chunk_pages", "CHUNK_PAGES"),
    _Key(("state", "incremental_state"), "incremental_state", "INCREMENTAL_STATE"),
    _Key(("load", "incremental"), "incremental_snapshots", "INCREMENTAL"),
    _Key(("load", "incremental_chunk_rows"), "incremental_chunk_rows", "INCREMENTAL_CHUNK_ROWS"),
    _Key(("service", "metrics_port"), "metrics_port", "METRICS_PORT"),
    _Key(("service", "metrics_host"), "metrics_host", "METRICS_HOST"),
    _Key(("service", "max_lag_bytes"), "max_lag_bytes", "MAX_LAG_BYTES"),
    _Key(("service", "on_lag"), "on_lag", "ON_LAG"),
    _Key(("service", "lag_interval"), None, "LAG_INTERVAL"),
    _Key(("service", "status_interval"), None, "STATUS_INTERVAL"),
    _Key(("service", "heartbeat_interval"), "heartbeat_interval", "HEARTBEAT_INTERVAL"),
    _Key(("service", "shutdown_grace_seconds"), "shutdown_grace_seconds",
         "SHUTDOWN_GRACE_SECONDS"),
    _Key(("service", "max_retries"), "max_retries", "MAX_RETRIES"),
    _Key(("service", "retry_max_delay"), "retry_max_delay", "RETRY_MAX_DELAY"),
    _Key(("service", "sink_stall_seconds"), "sink_stall_seconds", "SINK_STALL_SECONDS"),
    _Key(("log", "level"), "log_level", "LOG_LEVEL"),
    _Key(("log", "format"), "log_format", "LOG_FORMAT"),
)
_SECRET_KEYS = frozenset({"source.dsn", "source.password", "sink.kafka",
                          "sink.schema_registry_url", "sink.schema_registry_password"})
_TABLES = ("sink.kafka",)  # keys whose value is a table of their own


def _put(values: dict[str, Any], name: str, value: Any, *, prefix: str,
         earlier: Collection[str]) -> None:
    """Set one key of a later layer; a secret that an ``earlier`` layer set gives way to its
    ``_file`` and the other way round (both in one layer: validation says keep one)."""
    other = name.removesuffix("_file") if name.endswith("_file") else f"{name}_file"
    if f"{prefix}{other}" in earlier:
        values.pop(other, None)
    values[name] = value


def _kafka_env_property(variable: str) -> str:
    """``PGCDC_KAFKA_SASL_PASSWORD_FILE`` -> ``sasl.password_file``."""
    name = variable.removeprefix(KAFKA_ENV_PREFIX).lower()
    if name.endswith("_file"):
        return name.removesuffix("_file").replace("_", ".") + "_file"
    return name.replace("_", ".")


def load_settings(flags: Mapping[str, Any], *, config_file: Path | None = None,
                  environ: Mapping[str, str] | None = None) -> Settings:
    """Merge the TOML file, ``PGCDC_*`` variables and the flags given (``None``: not given),
    in that order of precedence, and validate the result once.

    Raises :class:`ConfigError` naming the first invalid key and where its value came from.
    """
    environ = os.environ if environ is None else environ
    merged: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}
    if config_file is not None:
        for section, values in _read_file(config_file).items():
            if not isinstance(values, dict):
                merged[section] = values  # validation names it
                origin[section] = f"in {config_file}"
                continue
            for name, value in values.items():
                if f"{section}.{name}" in _TABLES and isinstance(value, dict):
                    value = flatten_properties(value)
                    for prop in value:
                        origin[f"{section}.{name}.{prop}"] = f"in {config_file}"
                merged.setdefault(section, {})[name] = value
                origin[f"{section}.{name}"] = f"in {config_file}"
    earlier = set(origin)
    for key in KEYS:
        if key.env is not None and (value := environ.get(ENV_PREFIX + key.env)) is not None:
            _put(merged.setdefault(key.path[0], {}), key.path[1], value,
                 prefix=f"{key.path[0]}.", earlier=earlier)
            origin[key.name] = f"from {ENV_PREFIX}{key.env}"
    for variable in sorted(v for v in environ if v.startswith(KAFKA_ENV_PREFIX)):
        kafka = merged.setdefault("sink", {}).setdefault("kafka", {})
        if isinstance(kafka, dict):  # else validation names the file's sink.kafka
            prop = _kafka_env_property(variable)
            _put(kafka, prop, environ[variable], prefix="sink.kafka.", earlier=earlier)
            origin[f"sink.kafka.{prop}"] = f"from {variable}"
    earlier = set(origin)
    for key in KEYS:
        if key.dest is not None and (value := flags.get(key.dest)) is not None:
            _put(merged.setdefault(key.path[0], {}), key.path[1], key.from_flag(value),
                 prefix=f"{key.path[0]}.", earlier=earlier)
            origin[key.name] = f"from --{key.dest.replace('_', '-')}"
    merged.setdefault("source", {})  # a missing DSN is reported as 'source.dsn'
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, origin, config_file)) from None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        msg = f"config file {path} does not exist: create it or fix --config / PGCDC_CONFIG"
        raise ConfigError(msg) from None
    except tomllib.TOMLDecodeError as exc:
        msg = f"config file {path} is not valid TOML: {exc}"
        raise ConfigError(msg) from None


def _describe(exc: ValidationError, origin: Mapping[str, str], config_file: Path | None) -> str:
    error = exc.errors()[0]
    loc = [str(part) for part in error["loc"]]
    name = ".".join(loc[:2])
    where = origin.get(name) or origin.get(loc[0]) or ""
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "pgcdc_key":
        name = str(ctx["key"])
        where = origin.get(name) or origin.get(name.rsplit(".", 1)[0]) or where
        return f"config key '{name}' {ctx['reason']} {where}".rstrip()
    if kind == "missing":
        flag = next((k for k in KEYS if k.name == name), None)
        hint = ""
        if flag is not None and flag.dest is not None and flag.env is not None:
            hint = (f": pass --{flag.dest.replace('_', '-')}, set {ENV_PREFIX}{flag.env} "
                    "or put it in the config file")
        return f"config key '{name}' is required{hint}"
    if kind == "extra_forbidden":
        known = sorted([k.name for k in KEYS if k.path[0] == loc[0]]
                       + [f"{t}.*" for t in _TABLES if t.startswith(f"{loc[0]}.")])
        also = f" (known: {', '.join(known)})" if known else ""
        return f"config key '{name}' is not a pgcdc setting{also} {where}".rstrip()
    reasons = {
        "greater_than_equal": f"must be >= {ctx.get('ge')}",
        "greater_than": f"must be > {ctx.get('gt')}",
        "less_than_equal": f"must be <= {ctx.get('le')}",
        "literal_error": f"must be one of {ctx.get('expected')}",
        "int_parsing": "must be an integer",
        "int_type": "must be an integer",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "float_parsing": "must be a number",
        "string_too_short": "must not be empty",
        "model_type": "must be a table of keys",
    }
    reason = reasons.get(kind, str(error["msg"]).lower())
    got = "" if name in _SECRET_KEYS else f" (got {error['input']!r})"
    return f"config key '{name}' {reason}{got} {where}".rstrip()


_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")


def redact_dsn(text: str) -> str:
    """``text`` with every connection-string password replaced by ``***`` (key=value form,
    URI user-info and ``?password=`` parameters)."""
    return _URI_PASSWORD.sub(r"\1***@", _KV_PASSWORD.sub(r"\1***", text))
