"""Capture pgoutput messages from a real server into golden files (run by hand, rarely).

    python -m tests.golden.capture          # the machine's server (15): protocol v3
    python -m tests.golden.capture --v4     # PostgreSQL 16 from Maven Central: protocol v4

Writes ``tests/golden/pgoutput_v<N>.txt``: one message a line, ``<tag> <streaming 0|1> <hex>``,
for a scripted workload that makes the server send every message type of protocol
version N that it supports: Begin, Commit, Origin, Relation, Type, Insert, Update (old
key and old tuple), Delete, Truncate, Message (transactional and not), Stream Start / Stop /
Commit / Abort, Begin Prepare, Prepare, Commit Prepared, Rollback Prepared, Stream Prepare.

The v4 mode (PostgreSQL 16) reads the same workload twice, through two slots, with
``streaming 'parallel'`` (every Stream Abort then carries the abort LSN and time): once
with ``origin 'any'`` and once with ``origin 'none'`` (the transaction made under the
replication origin is left out).  Each pass starts with a ``# options: k=v ...`` line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psycopg

from decoder.replication import ReplicationConnection, XLogData
from decoder.slot import current_wal_lsn
from pgcdc.pipeline import protocol_for
from pgcdc.services.postgres import PostgresServer

HERE = Path(__file__).parent

WORKLOAD = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE TABLE t (id int PRIMARY KEY, v text, m mood, big text)",
    "CREATE TABLE full_t (a int, b text)",
    "ALTER TABLE full_t REPLICA IDENTITY FULL",
    "CREATE PUBLICATION golden FOR TABLE t, full_t",
    "SELECT pg_create_logical_replication_slot('golden', 'pgoutput', false, true)",
    "SELECT pg_create_logical_replication_slot('golden_none', 'pgoutput', false, true)",
    "INSERT INTO t VALUES (1, 'one', 'ok', NULL), (2, NULL, 'sad', "
    "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 1000) g))",
    "UPDATE t SET v = 'uno' WHERE id = 1",
    "UPDATE t SET id = 10 WHERE id = 1",  # old key
    "UPDATE t SET v = 'toast stays' WHERE id = 2",  # unchanged TOAST
    "INSERT INTO full_t VALUES (1, 'a')",
    "UPDATE full_t SET b = 'b'",  # old tuple
    "DELETE FROM full_t",
    "DELETE FROM t WHERE id = 10",
    "TRUNCATE full_t",
    "TRUNCATE full_t RESTART IDENTITY CASCADE",  # the options byte
    "SELECT pg_logical_emit_message(true, 'pgcdc', 'transactional')",
    "SELECT pg_logical_emit_message(false, 'pgcdc', '\\x00ff'::bytea)",
    "SET logical_decoding_work_mem = '64kB'",
    # a streamed transaction that commits, with a rolled-back subtransaction
    "BEGIN; INSERT INTO t SELECT g, repeat('s', 100), 'happy', NULL "
    "FROM generate_series(100, 2000) g; SAVEPOINT a; "
    "INSERT INTO t SELECT g, 'gone', 'ok', NULL FROM generate_series(3000, 3999) g; "
    "ROLLBACK TO SAVEPOINT a; COMMIT",
    # a streamed transaction that aborts
    "BEGIN; INSERT INTO t SELECT g, repeat('a', 100), 'ok', NULL "
    "FROM generate_series(5000, 7000) g; ROLLBACK",
    # two-phase: commit and rollback, and a streamed prepared transaction
    "BEGIN; INSERT INTO t VALUES (50, 'prepared', 'ok', NULL); PREPARE TRANSACTION 'g1'",
    "COMMIT PREPARED 'g1'",
    "BEGIN; INSERT INTO t VALUES (51, 'prepared', 'ok', NULL); PREPARE TRANSACTION 'g2'",
    "ROLLBACK PREPARED 'g2'",
    "BEGIN; INSERT INTO t SELECT g, repeat('p', 100), 'ok', NULL "
    "FROM generate_series(8000, 10000) g; PREPARE TRANSACTION 'g3'",
    "COMMIT PREPARED 'g3'",
    # a transaction with a replication origin
    "SELECT pg_replication_origin_create('upstream')",
    "SELECT pg_replication_origin_session_setup('upstream')",
    "BEGIN; SELECT pg_replication_origin_xact_setup('0/AB', now()); "
    "INSERT INTO t VALUES (60, 'from origin', 'ok', NULL); COMMIT",
    # a streamed one: the Origin message (no xid) inside its first streamed block
    "BEGIN; SELECT pg_replication_origin_xact_setup('0/CD', now()); "
    "INSERT INTO t SELECT g, repeat('o', 100), 'ok', NULL FROM generate_series(11000, 13000) g; "
    "COMMIT",
    "SELECT pg_replication_origin_session_reset()",
]


def capture(*, v4: bool = False, folder: Path = HERE) -> Path:
    """Run the workload on a new server and write ``folder/pgoutput_v<N>.txt``."""
    with PostgresServer(version=16 if v4 else None) as server:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in WORKLOAD:
                conn.execute(statement)
            end = current_wal_lsn(conn)
            version = protocol_for(conn.info.server_version)
            release = conn.execute("SHOW server_version").fetchone()
        if v4 and version != 4:
            msg = f"--v4 needs a PostgreSQL 16+ server, got protocol {version}"
            raise SystemExit(msg)
        options = {"proto_version": str(version), "publication_names": "golden",
                   "messages": "true", "streaming": "on", "two_phase": "on"}
        if v4:
            passes = [("golden", {**options, "streaming": "parallel", "origin": "any"}),
                      ("golden_none", {**options, "streaming": "parallel", "origin": "none"})]
        else:
            passes = [("golden", options)]
        sections = []
        for slot, slot_options in passes:
            lines = _keep_interesting(_read_slot(dsn, slot, slot_options, end))
            if v4:
                words = " ".join(f"{k}={v}" for k, v in slot_options.items())
                lines.insert(0, f"# options: {words}")
            sections.extend(lines)
    path = folder / f"pgoutput_v{version}.txt"
    name = str(release[0]) if release else "?"
    header = f"# captured from PostgreSQL {name} by tests/golden/capture.py"
    path.write_text(header + "\n" + "\n".join(sections) + "\n")
    return path


def _read_slot(dsn: str, slot: str, options: dict[str, str], end: int) -> list[str]:
    """Every message of ``slot`` up to the WAL position ``end``, one golden line each."""
    stream = ReplicationConnection(dsn, extra_options={"logical_decoding_work_mem": "64kB"})
    stream.connect()
    stream.start(slot, 0, options)
    lines, streaming, received = [], False, 0
    while received < end:
        batch = stream.read_batch(timeout=10)
        if not batch:
            break
        for message in batch:
            received = max(received, message.wal_end)
            if not isinstance(message, XLogData):
                continue
            tag = chr(message.payload[0])
            if tag == "S":
                streaming = True
            inside = streaming and tag not in "SE"
            lines.append(f"{tag} {int(inside)} {message.payload.hex()}")
            if tag == "E":
                streaming = False
    stream.close()
    return lines


def _keep_interesting(lines: list[str]) -> list[str]:
    """All distinct message shapes, but not thousands of identical streamed inserts."""
    kept, seen = [], {}
    for line in lines:
        tag, inside, _ = line.split(" ", 2)
        count = seen.get((tag, inside), 0)
        if count < 8:
            kept.append(line)
        seen[(tag, inside)] = count + 1
    return kept


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--v4", action="store_true",
                        help="PostgreSQL 16 (downloaded from Maven Central), protocol v4")
    parser.add_argument("--folder", type=Path, default=HERE, help="where to write the file")
    args = parser.parse_args()
    print(capture(v4=args.v4, folder=args.folder), file=sys.stderr)
