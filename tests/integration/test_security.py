"""Security (docs/security.md): TLS to PostgreSQL, SASL to Kafka, a least-privilege role.

A PostgreSQL that accepts only TLS (its own throwaway CA) and a Kafka broker with a
SASL_PLAINTEXT and an SSL listener are started for this module; the oracle reads the topics
through the broker's plaintext listener, as an independent consumer.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core.wire import topic_name
from decoder.slot import current_wal_lsn, slot_info
from pgcdc import cli, spark_apply
from pgcdc.services.kafka import KafkaBroker
from pgcdc.services.postgres import PostgresServer, make_certificates
from snapshot_builder import ddl
from streaming import job
from tests.oracle import PgcdcProcess, Writer, read_topic, verify

Conn = psycopg.Connection[tuple[object, ...]]

SASL_USER = "pgcdc"
SASL_PASSWORD = "kafka-Secret-7f3a"  # must never show up in pgcdc's output
_names = itertools.count()


@pytest.fixture(scope="module")
def tls_server() -> Iterator[PostgresServer]:
    server = PostgresServer(ssl=True)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[KafkaBroker]:
    broker = KafkaBroker(sasl_users={SASL_USER: SASL_PASSWORD}, ssl=True, heap="512m")
    broker.start()
    try:
        yield broker
    finally:
        broker.cleanup()


def _ledger(conn: Conn) -> None:
    """The oracle's table, its publication and slot, as after a deployment."""
    conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, version int NOT NULL, payload text)")
    conn.execute("CREATE PUBLICATION pgcdc FOR TABLE ledger")
    conn.execute("SELECT pg_create_logical_replication_slot('pgcdc', 'pgoutput', false, true)")


def _pgcdc(*argv: str, env: dict[str, str] | None = None,
           timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgcdc", *argv], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})})


def _stream_until_caught_up(pgcdc: PgcdcProcess, conn: Conn, timeout: float = 120) -> str:
    """PgcdcProcess.catch_up, keeping what pgcdc wrote on stderr."""
    target = current_wal_lsn(conn)
    pgcdc.start()
    assert pgcdc.proc is not None
    deadline = time.monotonic() + timeout
    while True:
        info = slot_info(conn, "pgcdc")
        if info and info.confirmed_flush_lsn and info.confirmed_flush_lsn >= target:
            break
        if pgcdc.proc.poll() is not None or time.monotonic() > deadline:
            if pgcdc.proc.poll() is None:
                pgcdc.kill()
            raise AssertionError(f"pgcdc did not catch up (exit {pgcdc.proc.returncode}):\n"
                                 f"{pgcdc.wait(10)[1]}")
        time.sleep(0.2)
    pgcdc.proc.send_signal(signal.SIGTERM)
    code, err = pgcdc.wait(60)
    assert code == 0, f"graceful stop failed ({code}):\n{err}"
    return err


# --- TLS to PostgreSQL -------------------------------------------------------------------------

@pytest.fixture
def tls_dsn(tls_server: PostgresServer) -> Iterator[str]:
    """A fresh database on the TLS-only server; the connection string verifies its certificate."""
    name = f"tls{next(_names)}"
    with psycopg.connect(tls_server.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield tls_server.dsn(name)
    with psycopg.connect(tls_server.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE database = %s AND NOT active", (name,))
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_streams_over_tls_with_verify_full(tls_server: PostgresServer, tls_dsn: str,
                                           sasl_broker: KafkaBroker, topic_prefix: str,
                                           tmp_path: Path) -> None:
    assert tls_server.ssl_root_cert is not None
    assert f"sslmode=verify-full sslrootcert={tls_server.ssl_root_cert}" in tls_dsn
    with psycopg.connect(tls_dsn, autocommit=True) as conn:
        _ledger(conn)
        writer = Writer(tls_dsn, seed=8)
        writer.write(conn, 30)
        pgcdc = PgcdcProcess(tls_dsn, sasl_broker.bootstrap_servers, topic_prefix,
                             tmp_path / "progress.json")
        _stream_until_caught_up(pgcdc, conn)
        writer.write(conn, 30)
        _stream_until_caught_up(pgcdc, conn)
        events = read_topic(sasl_broker.bootstrap_servers,
                            topic_name(topic_prefix, "public", "ledger"))
        verdict = verify(events, writer.ledger, conn)
    assert verdict.distinct >= 60
    # the server refuses TCP without TLS, so every connection above was encrypted
    plain = tls_dsn.replace(f"sslmode=verify-full sslrootcert={tls_server.ssl_root_cert}",
                            "sslmode=disable")
    refused = _pgcdc("run", "--dsn", plain, "--sink", "null",
                     "--progress-file", str(tmp_path / "plain.json"))
    assert refused.returncode == 3, refused.stderr
    assert "no encryption" in refused.stderr
    assert "add sslmode=verify-full sslrootcert=<CA file> to the DSN" in refused.stderr


@pytest.mark.parametrize("initial_load", [False, True])
def test_a_wrong_root_certificate_fails_naming_the_fix(tls_server: PostgresServer,
                                                       tls_dsn: str, tmp_path: Path,
                                                       initial_load: bool) -> None:
    other = make_certificates(tmp_path / "other-ca")  # a CA that did not sign the server
    wrong = tls_dsn.replace(str(tls_server.ssl_root_cert), str(other.ca))
    result = _pgcdc("run", "--dsn", wrong, "--sink", "null", "--tables", "public.t",
                    "--progress-file", str(tmp_path / "p.json"),
                    "--catalog-dir", str(tmp_path / "catalog"),
                    "--load-state", str(tmp_path / "load.json"),
                    *(["--initial-load"] if initial_load else []))
    assert result.returncode == 3, result.stderr  # terminal: retrying will not help
    assert "certificate verify failed" in result.stderr
    assert "set sslrootcert in the DSN to the CA that signed it" in result.stderr
    assert "Traceback" not in result.stderr


# --- SASL to Kafka ---------------------------------------------------------------------------

def _sasl_config(tmp_path: Path, mechanism: str, *, debug: bool = False) -> Path:
    config = tmp_path / "pgcdc.toml"
    config.write_text(f"""
[sink.kafka]
security.protocol = "SASL_PLAINTEXT"
sasl.mechanism = "{mechanism}"
sasl.username = "{SASL_USER}"
""")
    if debug:  # librdkafka prints its configuration: the password must not be in it
        with config.open("a") as fh:
            fh.write('debug = "conf,security"\n')
    return config


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_delivers_through_sasl(mechanism: str, pg_conn: Conn, pg_dsn: str,
                               sasl_broker: KafkaBroker, topic_prefix: str, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "kafka.password"
    secret.write_text(SASL_PASSWORD + "\n")
    monkeypatch.setenv("PGCDC_KAFKA_SASL_PASSWORD_FILE", str(secret))
    monkeypatch.setenv("PGCDC_LOG_LEVEL", "DEBUG")
    _ledger(pg_conn)
    writer = Writer(pg_dsn, seed=3)
    writer.write(pg_conn, 40)
    pgcdc = PgcdcProcess(pg_dsn, sasl_broker.sasl_bootstrap_servers, topic_prefix,
                         tmp_path / "progress.json")
    pgcdc.argv += ["--config", str(_sasl_config(tmp_path, mechanism, debug=True))]
    err = _stream_until_caught_up(pgcdc, pg_conn)
    events = read_topic(sasl_broker.bootstrap_servers,
                        topic_name(topic_prefix, "public", "ledger"))
    assert verify(events, writer.ledger, pg_conn).distinct >= 40
    # librdkafka did dump its configuration, through pgcdc's logging (which redacts too)
    assert re.search(r"librdkafka: CONF .* sasl\.password = (\[redacted\]|\*\*\*)", err), err
    assert SASL_PASSWORD not in err


def test_a_wrong_sasl_password_fails_naming_sasl(pg_conn: Conn, pg_dsn: str,
                                                 sasl_broker: KafkaBroker, tmp_path: Path) -> None:
    _ledger(pg_conn)
    result = _pgcdc("run", "--dsn", pg_dsn, "--config", str(_sasl_config(tmp_path, "PLAIN")),
                    "--bootstrap-servers", sasl_broker.sasl_bootstrap_servers,
                    "--progress-file", str(tmp_path / "p.json"),
                    "--catalog-dir", str(tmp_path / "catalog"),
                    env={"PGCDC_KAFKA_SASL_PASSWORD": "not-" + SASL_PASSWORD})
    assert result.returncode == 3, result.stderr  # terminal: a person has to fix it
    last = [line for line in result.stderr.splitlines() if line.startswith("pgcdc:")][-1]
    assert last.startswith(f"pgcdc: Kafka at {sasl_broker.sasl_bootstrap_servers} refused "
                           "the login (check sink.kafka's sasl.mechanism, sasl.username and "
                           "sasl.password / PGCDC_KAFKA_SASL_PASSWORD): "), last
    assert "SASL authentication error" in last
    assert SASL_PASSWORD not in result.stderr


def test_spark_reads_through_sasl_with_a_properties_file(
        spark: Any, pg_conn: Conn, pg_dsn: str, sasl_broker: KafkaBroker, topic_prefix: str,
        tmp_path: Path) -> None:
    """``pgcdc spark --kafka-properties``: the Java client's JAAS line, kept out of argv."""
    _ledger(pg_conn)
    Writer(pg_dsn, seed=1).write(pg_conn, 3)
    _stream_until_caught_up(PgcdcProcess(pg_dsn, sasl_broker.bootstrap_servers, topic_prefix,
                                         tmp_path / "progress.json"), pg_conn)
    properties = tmp_path / "spark-kafka.properties"
    properties.write_text(
        "# the Java Kafka client's names\nsasl.mechanism=SCRAM-SHA-512\n"
        "kafka.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
        f'required username="{SASL_USER}" password="{SASL_PASSWORD}";\n')
    args = cli._parser().parse_args([
        "spark", "--bootstrap-servers", sasl_broker.sasl_bootstrap_servers,
        "--topic-prefix", topic_prefix, "--lake", str(tmp_path / "lake"),
        "--checkpoint", str(tmp_path / "checkpoint"), "--kafka-properties", str(properties),
        "--kafka-option", "security.protocol=SASL_PLAINTEXT"])
    config = job.JobConfig(args.bootstrap_servers, args.lake, args.checkpoint,
                           topic_prefix=args.topic_prefix,
                           kafka_options=spark_apply.kafka_options(args))
    row = pg_conn.execute("SELECT 'ledger'::regclass::oid").fetchone()
    assert row is not None
    ledger = job.read_catalog(spark, config).latest(int(str(row[0])))
    assert ledger.qualified_name == "public.ledger"
    assert [c.name for c in ledger.columns] == ["id", "version", "payload"]


# --- SSL to Kafka ----------------------------------------------------------------------------

def _ssl_config(tmp_path: Path, ca: Path) -> Path:
    config = tmp_path / "pgcdc.toml"
    config.write_text(f'[sink.kafka]\n"security.protocol" = "SSL"\n"ssl.ca.location" = "{ca}"\n')
    return config


def test_delivers_through_ssl_verifying_the_broker(pg_conn: Conn, pg_dsn: str,
                                                   sasl_broker: KafkaBroker, topic_prefix: str,
                                                   tmp_path: Path) -> None:
    assert sasl_broker.ssl_root_cert is not None
    _ledger(pg_conn)
    writer = Writer(pg_dsn, seed=5)
    writer.write(pg_conn, 30)
    pgcdc = PgcdcProcess(pg_dsn, sasl_broker.ssl_bootstrap_servers, topic_prefix,
                         tmp_path / "progress.json")
    pgcdc.argv += ["--config", str(_ssl_config(tmp_path, sasl_broker.ssl_root_cert))]
    _stream_until_caught_up(pgcdc, pg_conn)
    events = read_topic(sasl_broker.bootstrap_servers,
                        topic_name(topic_prefix, "public", "ledger"))
    assert verify(events, writer.ledger, pg_conn).distinct >= 30


def test_a_broker_certificate_from_another_ca_fails_naming_the_fix(
        pg_conn: Conn, pg_dsn: str, sasl_broker: KafkaBroker, tmp_path: Path) -> None:
    _ledger(pg_conn)
    other = make_certificates(tmp_path / "other-ca")
    result = _pgcdc("run", "--dsn", pg_dsn, "--config", str(_ssl_config(tmp_path, other.ca)),
                    "--bootstrap-servers", sasl_broker.ssl_bootstrap_servers,
                    "--progress-file", str(tmp_path / "p.json"),
                    "--catalog-dir", str(tmp_path / "catalog"))
    assert result.returncode == 3, result.stderr
    last = [line for line in result.stderr.splitlines() if line.startswith("pgcdc:")][-1]
    assert last.startswith(f"pgcdc: Kafka at {sasl_broker.ssl_bootstrap_servers} failed the "
                           "TLS handshake (check sink.kafka's ssl.ca.location: the CA that "
                           "signed the broker's certificate, and the broker's address): "), last
    assert "certificate verify failed" in last


# --- the least-privilege role ------------------------------------------------------------------

@pytest.fixture
def cdc_role(pg_conn: Conn, pg_dsn: str) -> Iterator[str]:
    """A role with LOGIN REPLICATION and nothing else yet; dropped afterwards."""
    role = f"cdc_{psycopg.conninfo.conninfo_to_dict(pg_dsn)['dbname']}"
    pg_conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)))
    yield role
    pg_conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    (role,))
    pg_conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE NOT active AND database = current_database()")
    pg_conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    pg_conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _grant_least_privilege(conn: Conn, role: str) -> None:
    """What docs/security.md tells an owner to run (identifiers quoted by psycopg.sql)."""
    who = sql.Identifier(role)
    conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, version int NOT NULL, payload text)")
    conn.execute("CREATE PUBLICATION pgcdc FOR TABLE ledger")
    ddl.install(conn)  # the event trigger, by a superuser
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(who))
    conn.execute(sql.SQL("GRANT SELECT ON TABLE public.ledger TO {}").format(who))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgcdc TO {}").format(who))


def _as(dsn: str, role: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, user=role)


def test_runs_as_a_least_privilege_role(pg_conn: Conn, pg_dsn: str, cdc_role: str,
                                        kafka_servers: str, topic_prefix: str,
                                        tmp_path: Path) -> None:
    _grant_least_privilege(pg_conn, cdc_role)
    row = pg_conn.execute("SELECT rolsuper, rolreplication, rolcreatedb, rolcreaterole "
                          "FROM pg_roles WHERE rolname = %s", (cdc_role,)).fetchone()
    assert row == (False, True, False, False)
    # rows that only the initial load can deliver (one version each: a load reads the rows as
    # they are, not their history), entered in the writer's ledger
    pg_conn.execute("INSERT INTO ledger SELECT g, 1, 'loaded' FROM generate_series(1, 200) g")
    writer = Writer(pg_dsn, seed=11)
    writer.rows = dict.fromkeys(range(1, 201), 1)
    writer.next_id = 201
    writer.ledger.versions.update((key, 1) for key in writer.rows)
    dsn = _as(pg_dsn, cdc_role)
    progress = tmp_path / "progress.json"
    loaded = _pgcdc("snapshot", "--dsn", dsn, "--bootstrap-servers", kafka_servers,
                    "--topic-prefix", topic_prefix, "--progress-file", str(progress),
                    "--catalog-dir", str(progress.with_suffix(".catalog")),
                    "--load-state", str(tmp_path / "load.json"), "--readers", "2")
    assert loaded.returncode == 0, loaded.stderr
    writer.write(pg_conn, 20)
    pgcdc = PgcdcProcess(dsn, kafka_servers, topic_prefix, progress)
    _stream_until_caught_up(pgcdc, pg_conn)
    before_ddl = current_wal_lsn(pg_conn)
    pg_conn.execute("ALTER TABLE ledger ADD COLUMN note text DEFAULT 'n'")  # by the owner
    writer.write(pg_conn, 20)
    _stream_until_caught_up(pgcdc, pg_conn)
    events = read_topic(kafka_servers, topic_name(topic_prefix, "public", "ledger"))
    verdict = verify(events, writer.ledger, pg_conn)
    assert verdict.distinct >= 240
    assert sum(e["op"] == "r" for e in events) == 200  # the initial load, then the stream
    # the owner's event trigger captured the DDL: rows written after it carry the new column
    after = [e["after"] for e in events if e["after"] and e["source"]["commit_lsn"] > before_ddl]
    assert after and all(row["note"] == "n" for row in after)
    assert all("note" not in e["after"] for e in events
               if e["after"] and e["source"]["commit_lsn"] < before_ddl)


def test_missing_privileges_fail_naming_the_grant(pg_conn: Conn, pg_dsn: str, cdc_role: str,
                                                  tmp_path: Path) -> None:
    _grant_least_privilege(pg_conn, cdc_role)
    pg_conn.execute("CREATE TABLE audit (id int PRIMARY KEY)")
    pg_conn.execute("ALTER PUBLICATION pgcdc ADD TABLE audit")  # published, SELECT not granted
    dsn = _as(pg_dsn, cdc_role)
    state = ["--progress-file", str(tmp_path / "p.json"), "--catalog-dir", str(tmp_path / "c"),
             "--load-state", str(tmp_path / "load.json"), "--sink", "null"]
    no_select = _pgcdc("snapshot", "--dsn", dsn, *state)
    assert no_select.returncode == 3, no_select.stderr
    assert no_select.stderr.strip().splitlines()[-1] == (
        f"pgcdc: permission denied for table public.audit; as the owner or a superuser run "
        f"GRANT SELECT ON TABLE public.audit TO {cdc_role} (the least-privilege role: "
        "docs/security.md)")
    pg_conn.execute(sql.SQL("ALTER ROLE {} NOREPLICATION").format(sql.Identifier(cdc_role)))
    no_replication = _pgcdc("run", "--dsn", dsn, *state)
    assert no_replication.returncode == 3, no_replication.stderr
    assert f"ALTER ROLE {cdc_role} REPLICATION" in no_replication.stderr
    assert "Traceback" not in no_select.stderr + no_replication.stderr
