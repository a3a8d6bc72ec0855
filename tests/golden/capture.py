"""Capture pgoutput messages from a real server into golden files (run by hand, rarely).

    python -m tests.golden.capture          # the machine's server (15): protocol v3
    python -m tests.golden.capture --v4     # PostgreSQL 16 from Maven Central: protocol v4
    python -m tests.golden.capture --binary # the machine's server: text and binary values

Writes ``tests/golden/pgoutput_v<N>.txt``: one message a line, ``<tag> <streaming 0|1> <hex>``,
for a scripted workload that makes the server send every message type of protocol
version N that it supports: Begin, Commit, Origin, Relation, Type, Insert, Update (old
key and old tuple), Delete, Truncate, Message (transactional and not), Stream Start / Stop /
Commit / Abort, Begin Prepare, Prepare, Commit Prepared, Rollback Prepared, Stream Prepare.

The v4 mode (PostgreSQL 16) reads the same workload twice, through two slots, with
``streaming 'parallel'`` (every Stream Abort then carries the abort LSN and time): once
with ``origin 'any'`` and once with ``origin 'none'`` (the transaction made under the
replication origin is left out).  Each pass starts with a ``# options: k=v ...`` line.

The binary mode writes ``pgoutput_v<N>_binary.txt``: the workload and a table ``typed``
with a column of every built-in type and edge values, read twice, through two slots:
with ``binary 'false'`` and with ``binary 'true'``, so the two passes hold the same
messages, one with each value as text, the other in its type's send format.
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


# every built-in type of issue #3's list, for the binary capture; the rows hold edge values
TYPED_COLUMNS = (
    "b bool, i2 int2, i8 int8, o oid, f4 float4, f8 float8, n numeric, mo money, "
    "c char(3), vc varchar(8), nm name, ch \"char\", by bytea, u uuid, j json, jb jsonb, "
    "x xml, d date, tm time, tz timetz, ts timestamp, tstz timestamptz, iv interval, "
    "ip inet, cd cidr, mac macaddr, mac8 macaddr8, bt bit(4), vb varbit, tsv tsvector, "
    "tsq tsquery, pt point, ln line, ls lseg, bx box, pa path, pg polygon, ci circle, "
    "lsn pg_lsn, r int4range, tr tstzrange, mr int4multirange, a2 int[], at text[], "
    "an numeric[], ad date[], m mood, ma mood[]")
TYPED_ROWS = [
    "INSERT INTO typed VALUES (1, true, -32768, 9223372036854775807, 4294967295, 1.5, "
    "'NaN', '-12345678901234567890.000000000000000001', '-1.23', 'ab', 'héllo', 'name', "
    "'x', '\\x00ff', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"a\": [1, 2.5]}', "
    "'{\"b\": {\"c\": null}, \"a\": 1}', '<x>1</x>', '2024-02-29', '24:00:00', "
    "'23:59:59.999999+14:59', '1999-12-31 23:59:59.5', '2000-01-01 00:00:00+00', "
    "'1 year 2 mons -3 days 04:05:06.789', '192.168.0.1/24', '2001:db8::/32', "
    "'08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05', B'1010', B'110', "
    "'a fat:2A cat''s', 'fat & (rat | !cat)', '(1.5,-2)', '{1,2,3}', '[(0,0),(1,1)]', "
    "'(1,1),(0,0)', '[(0,0),(1,1),(2,0)]', '((0,0),(1,1),(2,0))', '<(0,0),2>', "
    "'16/B374D848', '[1,10)', '[2024-01-01 00:00+00,infinity)', '{[1,3),[5,7)}', "
    "'{{1,NULL},{3,4}}', '{\"a b\",NULL,\"\\\"q\\\"\",\"\"}', '{1.5,NaN,-0.001}', "
    "'{infinity,2024-01-01}', 'happy', '{sad,ok}')",
    "INSERT INTO typed VALUES (2, false, 0, -9223372036854775808, 0, '-Infinity', "
    "'Infinity', 'Infinity', '0', ' ', '', '', '', '', "
    "'00000000-0000-0000-0000-000000000000', '[]', '[]', '', '-infinity', '00:00:00', "
    "'00:00:00-15:59', '4713-01-01 00:00:00 BC', 'infinity', '-178000000 years', "
    "'::1', '0.0.0.0/0', '00:00:00:00:00:00', '00:00:00:00:00:00:00:00', B'0000', B'', "
    "'', '!a', '(0,0)', '{-1,0,5e-1}', '[(0,0),(0,0)]', '(0,0),(0,0)', '((0,0))', "
    "'((0,0))', '<(0,0),0>', '0/0', 'empty', '(,)', '{}', '{}', '{}', '{}', '{}', 'sad', "
    "'{}')",
    "INSERT INTO typed (id) VALUES (3)",  # every column NULL
]


def capture(*, v4: bool = False, binary: bool = False, folder: Path = HERE) -> Path:
    """Run the workload on a new server and write ``folder/pgoutput_v<N>[_binary].txt``."""
    workload = list(WORKLOAD)
    if binary:
        at = workload.index("CREATE PUBLICATION golden FOR TABLE t, full_t")
        workload[at:at + 1] = [f"CREATE TABLE typed (id int PRIMARY KEY, {TYPED_COLUMNS})",
                               "CREATE PUBLICATION golden FOR TABLE t, full_t, typed"]
        workload += TYPED_ROWS
    with PostgresServer(version=16 if v4 else None) as server:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in workload:
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
        elif binary:
            passes = [("golden", {**options, "binary": "false"}),
                      ("golden_none", {**options, "binary": "true"})]
        else:
            passes = [("golden", options)]
        sections = []
        for slot, slot_options in passes:
            lines = _keep_interesting(_read_slot(dsn, slot, slot_options, end),
                                      every_outside_streams=binary)
            if v4 or binary:
                words = " ".join(f"{k}={v}" for k, v in slot_options.items())
                lines.insert(0, f"# options: {words}")
            sections.extend(lines)
    path = folder / f"pgoutput_v{version}{'_binary' if binary else ''}.txt"
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


def _keep_interesting(lines: list[str], *, every_outside_streams: bool = False) -> list[str]:
    """All distinct message shapes, but not thousands of identical streamed inserts
    (``every_outside_streams``: every message outside a streamed block, too)."""
    kept, seen = [], {}
    for line in lines:
        tag, inside, _ = line.split(" ", 2)
        count = seen.get((tag, inside), 0)
        if count < 8 or every_outside_streams and inside == "0":
            kept.append(line)
        seen[(tag, inside)] = count + 1
    return kept


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--v4", action="store_true",
                        help="PostgreSQL 16 (downloaded from Maven Central), protocol v4")
    parser.add_argument("--binary", action="store_true",
                        help="the workload and a table of every type, text and binary")
    parser.add_argument("--folder", type=Path, default=HERE, help="where to write the file")
    args = parser.parse_args()
    print(capture(v4=args.v4, binary=args.binary, folder=args.folder), file=sys.stderr)
