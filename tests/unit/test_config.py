"""Settings: file < environment < flags, validation naming the key, secrets kept out of output."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from pgcdc import cli, log_format, spark_apply
from pgcdc.config import load_settings, redact_dsn
from pgcdc.exit_codes import EXIT_USAGE
from pgcdc.sink_factory import build_sink

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
    message = str(exc.value).replace(str(config), "<file>")  # its path may hold a 17
    assert "source.dsn" in message and "17" not in message
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
    line = log_format.JsonFormatter().format(record)
    entry = json.loads(line)
    assert entry["message"] == "connecting to host=db password=***"
    assert entry["level"] == "warning" and entry["logger"] == "pgcdc.x"
    assert entry["time"].endswith("+00:00")
    text = log_format.TextFormatter("%(message)s").format(record)
    assert text == "connecting to host=db password=***"


# --- Kafka client properties and secrets from files (docs/security.md) ---------------------

def test_kafka_properties_from_file_env_and_secret_files(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    secret = tmp_path / "kafka.secret"
    secret.write_text("hunter2\n")
    config = _file(tmp_path, f"""
[source]
dsn = "{DSN}"

[sink.kafka]
security.protocol = "SASL_SSL"
"ssl.ca.location" = "{ca}"
sasl.mechanism = "SCRAM-SHA-512"
sasl.username = "from_file"
sasl.password = "in-the-file"
"socket.keepalive.enable" = true
"message.max.bytes" = 2000000
""")
    env = {"PGCDC_KAFKA_SASL_USERNAME": "pgcdc",
           "PGCDC_KAFKA_SASL_PASSWORD_FILE": str(secret)}
    settings = load_settings(_flags(), config_file=config, environ=env)
    assert settings.sink.kafka_config() == {
        "security.protocol": "SASL_SSL", "ssl.ca.location": str(ca),
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "pgcdc",  # env beats the file
        "sasl.password": "hunter2",  # the env's file beats the file's value, newline dropped
        "socket.keepalive.enable": "true", "message.max.bytes": "2000000"}
    assert "hunter2" not in repr(settings) and "in-the-file" not in repr(settings)
    assert "hunter2" not in str(settings.model_dump())
    assert "sasl.password_file" not in settings.sink.kafka


def test_source_password_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "pg.secret"
    secret.write_text("s3cret\r\n")
    settings = load_settings(_flags("--dsn", DSN), environ={"PGCDC_PASSWORD_FILE": str(secret)})
    assert "password=s3cret" in settings.source.conninfo()
    assert "s3cret" not in repr(settings)
    with pytest.raises(ConfigError, match=r"^config key 'source.password_file' names "
                                          r".*missing, which pgcdc cannot read \(No such file "
                                          r"or directory\): fix the path .* from "
                                          r"PGCDC_PASSWORD_FILE$"):
        load_settings(_flags("--dsn", DSN),
                      environ={"PGCDC_PASSWORD_FILE": str(tmp_path / "missing")})
    # a later layer's password replaces an earlier layer's file; both in one layer: an error
    config = _file(tmp_path, f'[source]\ndsn = "{DSN}"\npassword_file = "{secret}"\n')
    settings = load_settings(_flags(), config_file=config, environ={"PGCDC_PASSWORD": "env"})
    assert "password=env" in settings.source.conninfo()
    with pytest.raises(ConfigError, match=r"^config key 'source.password_file' and "
                                          r"source.password are both set: keep one from "
                                          r"PGCDC_PASSWORD_FILE$"):
        load_settings(_flags("--dsn", DSN), environ={"PGCDC_PASSWORD_FILE": str(secret),
                                                     "PGCDC_PASSWORD": "env"})
    secret.write_text("\n")
    with pytest.raises(ConfigError, match="names .* which is empty: write the secret into it"):
        load_settings(_flags("--dsn", DSN), environ={"PGCDC_PASSWORD_FILE": str(secret)})


@pytest.mark.parametrize(("env", "message"), [
    ({"PGCDC_KAFKA_SECURITY_PROTOCOL": "TLS"},
     r"^config key 'sink.kafka.security.protocol' must be one of PLAINTEXT, SSL, "
     r"SASL_PLAINTEXT, SASL_SSL \(got 'TLS'\) from PGCDC_KAFKA_SECURITY_PROTOCOL$"),
    ({"PGCDC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
     r"^config key 'sink.kafka.sasl.mechanism' is required with security.protocol=SASL_SSL: "
     r"one of PLAIN, SCRAM-SHA-256"),
    ({"PGCDC_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext", "PGCDC_KAFKA_SASL_MECHANISM": "plain"},
     r"^config key 'sink.kafka.sasl.mechanism' must be one of PLAIN, .* \(got 'plain'\) "
     r"from PGCDC_KAFKA_SASL_MECHANISM$"),
    ({"PGCDC_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "PGCDC_KAFKA_SASL_MECHANISM": "PLAIN",
      "PGCDC_KAFKA_SASL_USERNAME": "u"},
     r"^config key 'sink.kafka.sasl.password' is required with sasl.mechanism=PLAIN: set it "
     r"\(or PGCDC_KAFKA_SASL_PASSWORD, sink.kafka.sasl.password_file or "
     r"PGCDC_KAFKA_SASL_PASSWORD_FILE\)$"),
    ({"PGCDC_KAFKA_ACKS": "1"},
     r"^config key 'sink.kafka.acks' is always 'all' in pgcdc .* from PGCDC_KAFKA_ACKS$"),
    ({"PGCDC_KAFKA_TRANSACTIONAL_ID": "t"},
     r"^config key 'sink.kafka.transactional.id' is set by sink.transactional_id"),
    ({"PGCDC_KAFKA_BOOTSTRAP_SERVERS": "k:9092"},
     r"^config key 'sink.kafka.bootstrap.servers' is set by sink.bootstrap_servers"),
    ({"PGCDC_KAFKA_SSL_CA_LOCATION": "/nonexistent/ca.pem"},
     r"^config key 'sink.kafka.ssl.ca.location' names /nonexistent/ca.pem, which does not "
     r"exist: fix the path from PGCDC_KAFKA_SSL_CA_LOCATION$"),
    ({"PGCDC_KAFKA_SSL_CA_LOCATION_FILE": "/x"},
     r"^config key 'sink.kafka.ssl.ca.location_file' is not a setting: only secrets are read "
     r"from files \(.*sasl.password_file.*\)"),
])
def test_kafka_properties_are_checked_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(_flags("--dsn", DSN), environ=env)


def test_kafka_errors_name_the_key_in_the_file_and_hide_secrets(tmp_path: Path) -> None:
    config = _file(tmp_path, f"""
[source]
dsn = "{DSN}"
[sink.kafka]
"sasl.password" = "hunter2"
"sasl.password_file" = "/run/secrets/kafka"
""")
    with pytest.raises(ConfigError) as exc:
        load_settings(_flags(), config_file=config, environ={})
    assert str(exc.value) == (f"config key 'sink.kafka.sasl.password_file' and "
                              f"sink.kafka.sasl.password are both set: keep one in {config}")
    config = _file(tmp_path, f'[source]\ndsn = "{DSN}"\n[sink.kafka]\n"Bad Name" = "hunter2"\n')
    with pytest.raises(ConfigError, match=r"^config key 'sink.kafka.Bad Name' is not a "
                                          r"librdkafka property name") as exc:
        load_settings(_flags(), config_file=config, environ={})
    assert "hunter2" not in str(exc.value)
    config = _file(tmp_path, f'[source]\ndsn = "{DSN}"\n[sink]\nkafka = "hunter2"\n')
    with pytest.raises(ConfigError, match=r"^config key 'sink.kafka' must be a table of "
                                          r"librdkafka properties \(\[sink.kafka\]\) in ") as exc:
        load_settings(_flags(), config_file=config, environ={})
    assert "hunter2" not in str(exc.value)
    config = _file(tmp_path, f'[source]\ndsn = "{DSN}"\n[sink]\nkafak = 1\n')
    with pytest.raises(ConfigError, match=r"known: .*sink.kafka\.\*"):
        load_settings(_flags(), config_file=config, environ={})


def test_a_property_librdkafka_does_not_know_is_a_config_error() -> None:
    """librdkafka checks names and values when the client is made, before connecting."""
    settings = load_settings(_flags("--dsn", DSN, "--bootstrap-servers", "127.0.0.1:1"),
                             environ={"PGCDC_KAFKA_SSL_CIPHER_SUITS": "x"})
    with pytest.raises(ConfigError, match=r"^config key 'sink.kafka' is not accepted by "
                                          r"librdkafka: No such configuration property: "
                                          r'"ssl.cipher.suits"; fix the property'):
        build_sink(settings)


def test_spark_kafka_options_from_a_file_and_flags(tmp_path: Path) -> None:
    props = tmp_path / "kafka.properties"
    props.write_text("# Spark's Kafka source (the Java client)\nsecurity.protocol=SASL_SSL\n"
                     "kafka.sasl.mechanism = PLAIN\n\nsasl.jaas.config=org.apache.kafka."
                     'common.security.plain.PlainLoginModule required username="u" '
                     'password="p=q";\n')
    args = cli._parser().parse_args([
        "spark", "--bootstrap-servers", "k:9092", "--lake", "/l", "--checkpoint", "/c",
        "--kafka-properties", str(props), "--kafka-option", "security.protocol=SASL_PLAINTEXT"])
    assert spark_apply.kafka_options(args) == {
        "security.protocol": "SASL_PLAINTEXT",  # the flag beats the file
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
                            'username="u" password="p=q";'}
    args.kafka_option = ["security.protocol"]
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        spark_apply.kafka_options(args)


@pytest.mark.parametrize(("message", "hint"), [
    ("permission denied for table audit",
     "as the owner or a superuser run GRANT SELECT ON TABLE audit TO cdc "
     "(the least-privilege role: docs/security.md)"),
    ("permission denied for schema pgcdc",
     "as the owner or a superuser run GRANT USAGE ON SCHEMA pgcdc TO cdc "
     "(the least-privilege role: docs/security.md)"),
    ('cannot open a replication connection: connection failed: connection to server at '
     '"db", port 5432 failed: FATAL:  must be superuser or replication role to start walsender',
     "the role needs the REPLICATION attribute: ALTER ROLE cdc REPLICATION (docs/security.md)"),
    ('connection failed: connection to server at "db", port 5432 failed: SSL error: '
     "certificate verify failed",
     "the server's certificate is not signed by the CA that sslrootcert names: set sslrootcert "
     "in the DSN to the CA that signed it (docs/security.md)"),
    ('connection to server at "db" failed: server certificate for "localhost" does not match '
     'host name "db"',
     "the server's certificate does not name the host in the DSN: connect with a host name it "
     "lists, or use sslmode=verify-ca (docs/security.md)"),
    ('connection to server at "db", port 5432 failed: Connection refused', None),  # transient
])
def test_connection_and_privilege_failures_name_the_fix(message: str, hint: str | None) -> None:
    assert cli._connection_hint(message, "cdc") == hint


def test_logging_options_before_or_after_the_verb() -> None:
    parse = cli._parser().parse_args
    assert parse(["--log-format", "json", "run"]).log_format == "json"
    assert parse(["run", "--log-format", "json", "--log-level", "info"]).log_format == "json"
    after = parse(["--log-level", "debug", "status", "--log-format", "json"])
    assert (after.log_level, after.log_format) == ("debug", "json")  # before kept, after added
    assert parse(["--log-format", "text", "slot", "drop", "--log-format", "json"]).log_format \
        == "json"
    assert parse(["catalog", "history"]).log_format is None  # the environment's, or text
    with pytest.raises(SystemExit):
        parse(["run", "--log-format", "yaml"])


@pytest.mark.parametrize(("dsn", "says"), [
    ("hostt=foo", 'invalid connection option "hostt"'),
    ("host='db dbname=app", "unterminated quoted string"),
    ("host=db sslmode=bogus", "sslmode=bogus: use one of disable"),
    ("host=db port=notaport", "port=notaport: a port is a number"),
    ("host=a,b port=5432,70000", "port=5432,70000"),
])
def test_a_dsn_libpq_refuses_is_a_configuration_error(dsn: str, says: str) -> None:
    """Exit 2 with the cause and the fix, not a traceback (1) or a retry (4)."""
    with pytest.raises(ConfigError, match="source.dsn") as raised:
        load_settings(_flags("--dsn", dsn), environ={})
    assert says in str(raised.value)
    assert cli.main(["status", "--dsn", dsn]) == EXIT_USAGE


def test_a_dsn_libpq_reads_is_accepted() -> None:
    for dsn in (DSN, "postgresql://cdc@db:5432/app?sslmode=verify-full", "host=a,b port=1,2"):
        assert load_settings(_flags("--dsn", dsn), environ={}).source.conninfo() == dsn
