"""A failed start creates nothing, and the role's privileges are checked before streaming
(issue 18).

For each check a start can fail (a published table the role may not SELECT, a schema it has
no USAGE on, a table without a key or replica identity), ``pgcdc run`` (with and without
``--initial-load``) and ``pgcdc snapshot`` exit with the documented code and one line naming
the fix, and ``pg_replication_slots`` and ``pg_publication`` are as they were before.  A role
without SELECT no longer streams the table's changes; once granted, it does.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from decoder.errors import MissingIdentityError
from decoder.slot import current_wal_lsn
from pgcdc import pipeline as pipeline_module
from pgcdc.pipeline import Pipeline, PipelineConfig
from pgcdc.start_checks import PrivilegeError, preflight
from tests.recording_sink import RecordingSink

Conn = psycopg.Connection[tuple[object, ...]]


def _state(conn: Conn) -> tuple[list[object], list[object]]:
    slots = conn.execute("SELECT slot_name FROM pg_replication_slots "
                         "WHERE database = current_database() ORDER BY 1").fetchall()
    publications = conn.execute("SELECT pubname, array(SELECT format('%I.%I', schemaname, "
                                "tablename) FROM pg_publication_tables t WHERE t.pubname = "
                                "p.pubname ORDER BY 1) FROM pg_publication p ORDER BY 1"
                                ).fetchall()
    return list(slots), list(publications)


def _pgcdc(verb: str, dsn: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgcdc", verb, "--dsn", dsn, "--sink", "null",
         "--progress-file", str(tmp / "p.json"), "--catalog-dir", str(tmp / "catalog"),
         "--load-state", str(tmp / "load.json"), *extra],
        capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ))


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pgcdc: "), done.stderr
    return lines[0]


@pytest.fixture
def role(pg_conn: Conn) -> Iterator[str]:
    """A role with LOGIN REPLICATION; the owner has made ``app.orders`` and ``public.items``
    and the publication ``pgcdc`` of both; the role may use ``public`` and read ``items``."""
    name = f"cdc_{psycopg.conninfo.conninfo_to_dict(pg_conn.info.dsn)['dbname']}"
    who = sql.Identifier(name)
    pg_conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(who))
    pg_conn.execute("CREATE SCHEMA app")
    pg_conn.execute("CREATE TABLE app.orders (id int PRIMARY KEY)")
    pg_conn.execute("CREATE TABLE public.items (id int PRIMARY KEY)")
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE app.orders, public.items")
    pg_conn.execute(sql.SQL("GRANT SELECT ON TABLE public.items TO {}").format(who))
    yield name
    pg_conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    (name,))
    pg_conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE NOT active AND database = current_database()")
    pg_conn.execute(sql.SQL("DROP OWNED BY {}").format(who))
    pg_conn.execute(sql.SQL("DROP ROLE {}").format(who))


_STARTS = [("run", ("--exit-when-caught-up",)),
           ("run", ("--exit-when-caught-up", "--initial-load")),
           ("snapshot", ())]


@pytest.mark.parametrize(("verb", "extra"), _STARTS)
def test_missing_privileges_create_nothing(verb: str, extra: tuple[str, ...], pg_conn: Conn,
                                           pg_dsn: str, role: str, tmp_path: Path) -> None:
    """No USAGE on the schema ``app`` and no SELECT on ``app.orders``: exit 3, one line with
    both GRANTs; the owner's publication is left as it was, and no slot is made.  After the
    schema's GRANT alone, the line names only the table."""
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
    before = _state(pg_conn)
    done = _pgcdc(verb, dsn, tmp_path, *extra)
    assert done.returncode == 3, done.stderr
    assert _one_line(done) == (
        "pgcdc: permission denied for schema app, table app.orders; as the owner or a "
        f"superuser run GRANT USAGE ON SCHEMA app TO {role}; GRANT SELECT ON TABLE app.orders "
        f"TO {role} (the least-privilege role: docs/security.md)")
    assert _state(pg_conn) == before
    pg_conn.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {}").format(sql.Identifier(role)))
    done = _pgcdc(verb, dsn, tmp_path, *extra)
    assert done.returncode == 3, done.stderr
    assert _one_line(done) == (
        "pgcdc: permission denied for table app.orders; as the owner or a superuser run "
        f"GRANT SELECT ON TABLE app.orders TO {role} (the least-privilege role: "
        "docs/security.md)")
    assert _state(pg_conn) == before


@pytest.mark.parametrize(("verb", "extra"), _STARTS)
def test_a_table_without_a_key_creates_nothing(verb: str, extra: tuple[str, ...],
                                               pg_conn: Conn, pg_dsn: str,
                                               tmp_path: Path) -> None:
    """pgcdc would create the publication for ``--tables``; one table has no key: exit 3
    naming it and the fix, and neither a publication nor a slot is left."""
    pg_conn.execute("CREATE TABLE keyed (id int PRIMARY KEY)")
    pg_conn.execute("CREATE TABLE keyless (a int)")
    before = _state(pg_conn)
    assert before == ([], [])
    done = _pgcdc(verb, pg_dsn, tmp_path, "--tables", "public.keyed,public.keyless", *extra)
    assert done.returncode == 3, done.stderr
    line = _one_line(done)
    assert "public.keyless" in line and "REPLICA IDENTITY" in line, line
    assert _state(pg_conn) == before


def test_a_role_without_select_does_not_stream(pg_conn: Conn, pg_dsn: str, role: str,
                                               tmp_path: Path) -> None:
    """The README says SELECT is checked at start: a role without it is refused before the
    slot exists, whatever pgoutput would send; granted, the same start streams."""
    pg_conn.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {}").format(sql.Identifier(role)))
    config = PipelineConfig(psycopg.conninfo.make_conninfo(pg_dsn, user=role),
                            progress_file=tmp_path / "p.json", catalog_dir=tmp_path / "c",
                            status_interval=0.1)
    with pytest.raises(PrivilegeError, match=r"GRANT SELECT ON TABLE app\.orders TO"):
        Pipeline(config, RecordingSink()).prepare()
    assert _state(pg_conn)[0] == []
    pg_conn.execute(sql.SQL("GRANT SELECT ON TABLE app.orders TO {}")
                    .format(sql.Identifier(role)))
    sink = RecordingSink()
    pipeline = Pipeline(config, sink)
    pipeline.prepare()
    pg_conn.execute("INSERT INTO app.orders VALUES (1)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert [e.after for e in sink.events] == [{"id": 1}]


def test_prepare_rolls_back_a_publication_it_created(pg_conn: Conn, pg_dsn: str) -> None:
    """Library use: Pipeline.prepare() creates the publication only if the checks pass."""
    pg_conn.execute("CREATE TABLE keyless (a int)")
    config = PipelineConfig(pg_dsn, tables=["public.keyless"])
    with pytest.raises(MissingIdentityError):
        Pipeline(config, RecordingSink()).prepare()
    assert _state(pg_conn) == ([], [])


def test_a_table_without_identity_in_an_existing_publication_is_captured(
        pg_conn: Conn, pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """A table without a key or replica identity that joined an existing publication
    (``CREATE TABLE ... AS`` under ``FOR ALL TABLES``) does not stop a restart: PostgreSQL
    refuses its updates and deletes, so its inserts are all there is, captured; a warning
    names it and the fix.  A publication created by this start with such a table is still
    refused (the application's updates would fail): test_bad_input."""
    pg_conn.execute("CREATE TABLE keyed (id int PRIMARY KEY)")
    config = PipelineConfig(pg_dsn, tables=["public.keyed"])
    Pipeline(config, RecordingSink()).prepare()
    pg_conn.execute("CREATE TABLE copied AS SELECT 1 AS a")
    pg_conn.execute("ALTER PUBLICATION pgcdc ADD TABLE copied")
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="replica identity"):
        pg_conn.execute("UPDATE copied SET a = 2")
    sink = RecordingSink()
    pipeline = Pipeline(PipelineConfig(pg_dsn, tables=["public.keyed", "public.copied"]), sink)
    with caplog.at_level(logging.WARNING, logger="decoder.slot"):
        pipeline.prepare()
    assert any("public.copied" in r.getMessage() and "REPLICA IDENTITY FULL" in r.getMessage()
               for r in caplog.records)
    pg_conn.execute("INSERT INTO copied VALUES (3)")
    pipeline.run(until_lsn=current_wal_lsn(pg_conn))
    assert [e.after for e in sink.events] == [{"a": 3}]


@pytest.mark.parametrize("slot_existed", [False, True])
def test_a_failure_after_the_slot_drops_only_a_slot_this_start_created(
        slot_existed: bool, pg_conn: Conn, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure between creating the slot and streaming (here: choosing the value format
    fails) drops the slot this start created, and never one that was there before."""
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg_conn.execute("CREATE PUBLICATION pgcdc FOR TABLE t")
    if slot_existed:
        pg_conn.execute("SELECT pg_create_logical_replication_slot('pgcdc', 'pgoutput')")
    before = _state(pg_conn)

    def failing(*_: object) -> bool:
        raise psycopg.errors.InsufficientPrivilege("injected")

    monkeypatch.setattr(pipeline_module, "choose_binary", failing)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="injected"):
        Pipeline(PipelineConfig(pg_dsn), RecordingSink()).prepare()
    assert _state(pg_conn) == before


def test_the_dry_run_creates_nothing_and_says_nothing(pg_conn: Conn, pg_dsn: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """preflight() (pgcdc run and snapshot, before the initial load) creates the missing
    publication only in a transaction it rolls back, and does not log it as created."""
    caplog.set_level(logging.INFO)
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    preflight(pg_dsn, "pgcdc", ["public.t"], create=True)
    assert _state(pg_conn) == ([], [])
    assert "created publication" not in caplog.text
    Pipeline(PipelineConfig(pg_dsn, tables=["public.t"]), RecordingSink()).prepare()
    assert "created publication pgcdc" in caplog.text  # the real one is said
