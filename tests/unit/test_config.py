"""Settings: file < environment < flags, validation naming the key, secrets kept out of output."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from pgcdc import cli
from pgcdc.config import load_settings, redact_dsn
from pgcdc.errors import ConfigError

DSN = "host=db user=cdc dbname=app"


def _flags(*argv: str) -> dict[str, Any]:
    """What ``pgcdc run ARGV`` hands to load_settings."""
    return vars(cli._parser().parse_args(["run", *argv]))


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pgcdc.toml"
    path.write_text(text)
    return path


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = _file(tmp_path, f"""
[source]
dsn = "{DSN}"
slot = "from_file"
publication = "pub_file"
tables = ["public.a", "public.b"]

[sink]
kind = "jsonl"
topic_prefix = "file_prefix"

[load]
readers = 2
chunk_pages = 8
""")
    env = {"PGCDC_SLOT": "from_env", "PGCDC_TOPIC_PREFIX": "env_prefix", "PGCDC_READERS": "3"}
    settings = load_settings(_flags("--slot", "from_flag", "--readers", "5"),
                             config_file=config, environ=env)
    assert settings.source.slot == "from_flag"  # flag beats env and file
    assert settings.load.readers == 5
    assert settings.sink.topic_prefix == "env_prefix"  # env beats file
    assert settings.source.publication == "pub_file"  # file beats the default
    assert settings.source.tables == ["public.a", "public.b"]
    assert settings.load.chunk_pages == 8
    assert settings.sink.kind == "jsonl"
    assert settings.sink.format == "avro"  # default
    assert settings.source.conninfo() == DSN


def test_existing_flags_and_variables_keep_their_meaning() -> None:
    env = {"PGCDC_DSN": DSN, "PGCDC_TABLES": "public.x, s.y", "PGCDC_SINK": "null",
           "PGCDC_CHUNK_PAGES": "16", "PGCDC_FAIL_POINT": "ignored_here"}
    settings = load_settings(_flags("--no-tombstones", "--transaction-topic", "--initial-load",
                                    "--progress-file", "/tmp/p.json"), environ=env)
    assert settings.source.tables == ["public.x", "s.y"]
    assert settings.sink.kind == "null"
    assert settings.sink.tombstones is False
    assert settings.sink.transaction_topic is True
    assert settings.load.initial is True
    assert settings.load.chunk_pages == 16
    assert settings.state.progress_file == Path("/tmp/p.json")
    # flags not given leave the defaults alone
    plain = load_settings(_flags("--dsn", DSN), environ={})
    assert plain.sink.tombstones is True
    assert plain.load.initial is False
    assert plain.service.metrics_port is None
    assert plain.service.metrics_host == "127.0.0.1"
    assert plain.log.level == "WARNING"


def test_invalid_value_names_key_value_and_file(tmp_path: Path) -> None:
    config = _file(tmp_path, f'[source]\ndsn = "{DSN}"\n[load]\nreaders = 0\n')
    with pytest.raises(ConfigError) as exc:
        load_settings(_flags(), config_file=config, environ={})
    assert str(exc.value) == f"config key 'load.readers' must be >= 1 (got 0) in {config}"


def test_invalid_value_names_the_variable_or_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config key 'service.on_lag' must be one of "
                                          r".*'warn'.*'stop'.* \(got 'panic'\) from "
                                          r"PGCDC_ON_LAG$"):
        load_settings(_flags(), environ={"PGCDC_DSN": DSN, "PGCDC_ON_LAG": "panic"})
    with pytest.raises(ConfigError, match=r"^config key 'service.metrics_port' must be <= "
                                          r"65535 \(got 70000\) from --metrics-port$"):
        load_settings(_flags("--metrics-port", "70000"), environ={"PGCDC_DSN": DSN})
    with pytest.raises(ConfigError, match=r"^config key 'load.readers' must be an integer "
                                          r"\(got 'many'\) from PGCDC_READERS$"):
        load_settings(_flags(), environ={"PGCDC_DSN": DSN, "PGCDC_READERS": "many"})


def test_missing_dsn_and_unknown_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config key 'source.dsn' is required: pass --dsn, "
                                          r"set PGCDC_DSN"):
        load_settings(_flags(), environ={})
    config = _file(tmp_path, f'[source]\ndsn = "{DSN}"\n[sink]\npartitions = 3\n')
    with pytest.raises(ConfigError, match=r"^config key 'sink.partitions' is not a pgcdc "
                                          r"setting .* in .*pgcdc.toml$"):
        load_settings(_flags(), config_file=config, environ={})
    broken = _file(tmp_path, "[source\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_settings(_flags(), config_file=broken, environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(_flags(), config_file=tmp_path / "nope.toml", environ={})


def test_secrets_stay_out_of_errors_and_reprs(tmp_path: Path) -> None:
    config = _file(tmp_path, '[source]\ndsn = 17\npassword = "hunter2"\n')
    with pytest.raises(ConfigError) as exc:
        load_settings(_flags(), config_file=config, environ={})
    assert "source.dsn" in str(exc.value) and "17" not in str(exc.value)
    settings = load_settings(_flags(), environ={"PGCDC_DSN": "host=db password=s3cret",
                                                "PGCDC_PASSWORD": "hunter2"})
    assert "s3cret" not in repr(settings) and "hunter2" not in repr(settings)
    assert "hunter2" in settings.source.conninfo()  # but it reaches the connection
    assert "hunter2" not in redact_dsn(settings.source.conninfo())


@pytest.mark.parametrize(("text", "expected"), [
    ("host=db password=hunter2 user=u", "host=db password=*** user=u"),
    ("host=db password = 'a b\\' c' user=u", "host=db password = *** user=u"),
    ("postgresql://cdc:hunter2@db:5432/app", "postgresql://cdc:***@db:5432/app"),
    ("postgres://db/app?user=u&password=hunter2&sslmode=require",
     "postgres://db/app?user=u&password=***&sslmode=require"),
    ("host=db user=u", "host=db user=u"),
])
def test_redact_dsn(text: str, expected: str) -> None:
    assert redact_dsn(text) == expected


def test_log_formatters_redact_and_json_is_one_object_per_line() -> None:
    record = logging.LogRecord("pgcdc.x", logging.WARNING, __file__, 1,
                               "connecting to %s", ("host=db password=hunter2",), None)
    line = cli._JsonFormatter().format(record)
    entry = json.loads(line)
    assert entry["message"] == "connecting to host=db password=***"
    assert entry["level"] == "warning" and entry["logger"] == "pgcdc.x"
    assert entry["time"].endswith("+00:00")
    text = cli._TextFormatter("%(message)s").format(record)
    assert text == "connecting to host=db password=***"
