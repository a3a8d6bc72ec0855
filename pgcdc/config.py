"""Typed settings for ``pgcdc run``, ``snapshot``, ``status`` and ``slot``.

Three layers, later ones win: a TOML file (``--config`` or ``PGCDC_CONFIG``), the
environment (``PGCDC_<OPTION>``, the same names the flags have always read) and the
command-line flags.  The merged values are validated once, at start; an invalid value
stops with an error that names the key and where it came from::

    config key 'load.readers' must be >= 1 (got 0) in pgcdc.toml

Secrets are :class:`pydantic.SecretStr`; :func:`redact_dsn` removes a password from any
connection string before it is logged or printed.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from psycopg import conninfo
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from pgcdc.errors import ConfigError

ENV_PREFIX = "PGCDC_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _split_tables(value: object) -> object:
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()] or None
    return value


class SourceSettings(_Section):
    dsn: SecretStr
    password: SecretStr | None = None  # added to the DSN; keeps it out of the DSN itself
    slot: str = Field(default="pgcdc", min_length=1)
    publication: str = Field(default="pgcdc", min_length=1)
    tables: list[str] | None = None

    _tables = field_validator("tables", mode="before")(_split_tables)

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
    tombstones: bool = True
    transaction_topic: bool = False
    output: str = "-"


class StateSettings(_Section):
    progress_file: Path | None = None
    catalog_dir: Path | None = None
    load_state: Path | None = None


class LoadSettings(_Section):
    initial: bool = False
    readers: int = Field(default=4, ge=1)
    chunk_pages: int = Field(default=1024, ge=1)


class ServiceSettings(_Section):
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"
    max_lag_bytes: int | None = Field(default=None, ge=1)
    on_lag: Literal["warn", "stop"] = "warn"
    lag_interval: float = Field(default=5.0, gt=0)
    status_interval: float = Field(default=1.0, gt=0)


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
    _Key(("source", "slot"), "slot", "SLOT"),
    _Key(("source", "publication"), "publication", "PUBLICATION"),
    _Key(("source", "tables"), "tables", "TABLES"),
    _Key(("sink", "kind"), "sink", "SINK"),
    _Key(("sink", "bootstrap_servers"), "bootstrap_servers", "BOOTSTRAP_SERVERS"),
    _Key(("sink", "topic_prefix"), "topic_prefix", "TOPIC_PREFIX"),
    _Key(("sink", "format"), "format", "FORMAT"),
    _Key(("sink", "tombstones"), "no_tombstones", "TOMBSTONES", lambda value: not value),
    _Key(("sink", "transaction_topic"), "transaction_topic", "TRANSACTION_TOPIC"),
    _Key(("sink", "output"), "output", "OUTPUT"),
    _Key(("state", "progress_file"), "progress_file", "PROGRESS_FILE"),
    _Key(("state", "catalog_dir"), "catalog_dir", "CATALOG_DIR"),
    _Key(("state", "load_state"), "load_state", "LOAD_STATE"),
    _Key(("load", "initial"), "initial_load", "INITIAL_LOAD"),
    _Key(("load", "readers"), "readers", "READERS"),
    _Key(("load", "chunk_pages"), "chunk_pages", "CHUNK_PAGES"),
    _Key(("service", "metrics_port"), "metrics_port", "METRICS_PORT"),
    _Key(("service", "metrics_host"), "metrics_host", "METRICS_HOST"),
    _Key(("service", "max_lag_bytes"), "max_lag_bytes", "MAX_LAG_BYTES"),
    _Key(("service", "on_lag"), "on_lag", "ON_LAG"),
    _Key(("service", "lag_interval"), None, "LAG_INTERVAL"),
    _Key(("service", "status_interval"), None, "STATUS_INTERVAL"),
    _Key(("log", "level"), "log_level", "LOG_LEVEL"),
    _Key(("log", "format"), "log_format", "LOG_FORMAT"),
)
_SECRET_KEYS = frozenset({"source.dsn", "source.password"})


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
                merged.setdefault(section, {})[name] = value
                origin[f"{section}.{name}"] = f"in {config_file}"
    for key in KEYS:
        if key.env is not None and (value := environ.get(ENV_PREFIX + key.env)) is not None:
            merged.setdefault(key.path[0], {})[key.path[1]] = value
            origin[key.name] = f"from {ENV_PREFIX}{key.env}"
    for key in KEYS:
        if key.dest is not None and (value := flags.get(key.dest)) is not None:
            merged.setdefault(key.path[0], {})[key.path[1]] = key.from_flag(value)
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
    if kind == "missing":
        flag = next((k for k in KEYS if k.name == name), None)
        hint = ""
        if flag is not None and flag.dest is not None and flag.env is not None:
            hint = (f": pass --{flag.dest.replace('_', '-')}, set {ENV_PREFIX}{flag.env} "
                    "or put it in the config file")
        return f"config key '{name}' is required{hint}"
    if kind == "extra_forbidden":
        known = sorted(k.name for k in KEYS if k.path[0] == loc[0])
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
