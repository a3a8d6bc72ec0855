"""A table's key changes under the stream: a key added to a keyless table, a key dropped (its
column too), the replica identity moved to another unique index, the primary key moved to
another column, each also in the batch of the rows' changes before it.  Each program ends
with the lake compared with the source (tests/lake_model.py :class:`Program`); the lake
model's ``rekey`` rule drops and adds keys at random, these name the cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc.services.postgres import PostgresServer
from tests.integration.test_lake_model import lake_equals_source
from tests.lake_model import APPLY, CAPTURE, Rig

pytestmark = pytest.mark.spark

CASES = {
    "key added": [
        "CREATE TABLE t (id int NOT NULL, a int)", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t SELECT g, g FROM generate_series(1, 6) g", CAPTURE, APPLY,
        "ALTER TABLE t ADD PRIMARY KEY (id)", "ALTER TABLE t REPLICA IDENTITY DEFAULT",
        "UPDATE t SET a = 10 WHERE id = 1", "DELETE FROM t WHERE id = 2",
        "UPDATE t SET id = 20 WHERE id = 3", "INSERT INTO t VALUES (7, 7)", CAPTURE, APPLY],
    "key dropped": [
        "CREATE TABLE t (id int CONSTRAINT pk PRIMARY KEY, a int)",
        "INSERT INTO t SELECT g, g FROM generate_series(1, 6) g", CAPTURE, APPLY,
        "ALTER TABLE t DROP CONSTRAINT pk", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t VALUES (1, 1), (1, 1)", "UPDATE t SET a = 10 WHERE id = 2",
        "DELETE FROM t WHERE id = 3", CAPTURE, APPLY],
    # the batch holds changes written under both: an update written under the key carries
    # no old row (a multiset needs it); a multiset's duplicates would fold under the key
    "key dropped, one batch": [
        "CREATE TABLE t (id int CONSTRAINT pk PRIMARY KEY, a int, b text)",
        "INSERT INTO t SELECT g, g, 'x' FROM generate_series(1, 6) g", CAPTURE, APPLY,
        "UPDATE t SET a = 10 WHERE id = 1", "DELETE FROM t WHERE id = 2",
        "UPDATE t SET id = 20 WHERE id = 3",
        "ALTER TABLE t DROP CONSTRAINT pk", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t VALUES (1, 10, 'x'), (4, 4, 'x')", "UPDATE t SET b = 'y' WHERE id = 5",
        "DELETE FROM t WHERE ctid IN (SELECT ctid FROM t WHERE id = 4 LIMIT 1)",
        CAPTURE, APPLY],
    "key column dropped, one batch": [
        "CREATE TABLE t (id int PRIMARY KEY, a int, b text)",
        "INSERT INTO t SELECT g, g, 'x' FROM generate_series(1, 6) g", CAPTURE, APPLY,
        "UPDATE t SET a = 10 WHERE id = 1", "DELETE FROM t WHERE id = 2",
        "ALTER TABLE t DROP COLUMN id", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t VALUES (10, 'x')", "UPDATE t SET b = 'y' WHERE a = 5",
        CAPTURE, APPLY],
    "key added, one batch": [
        "CREATE TABLE t (id int NOT NULL, a int)", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t SELECT g, g FROM generate_series(1, 6) g", CAPTURE, APPLY,
        "INSERT INTO t VALUES (1, 1), (7, 7), (7, 7)",
        "DELETE FROM t WHERE ctid IN (SELECT ctid FROM t WHERE id = 1 LIMIT 1)",
        "DELETE FROM t WHERE ctid IN (SELECT ctid FROM t WHERE id = 7 LIMIT 1)",
        "ALTER TABLE t ADD PRIMARY KEY (id)", "ALTER TABLE t REPLICA IDENTITY DEFAULT",
        "UPDATE t SET a = 70 WHERE id = 7", "UPDATE t SET id = 30 WHERE id = 3",
        CAPTURE, APPLY],
    "identity by another index": [
        "CREATE TABLE t (id int PRIMARY KEY, u int NOT NULL, a int)",
        "CREATE UNIQUE INDEX ux ON t (u)",
        "INSERT INTO t SELECT g, 100 + g, g FROM generate_series(1, 6) g", CAPTURE, APPLY,
        "ALTER TABLE t REPLICA IDENTITY USING INDEX ux",
        "UPDATE t SET u = 200 WHERE id = 1", "UPDATE t SET id = 30 WHERE id = 2",
        "DELETE FROM t WHERE u = 103", "UPDATE t SET a = 9 WHERE id = 4", CAPTURE, APPLY,
        "UPDATE t SET u = 300, a = 1 WHERE id = 5", CAPTURE, APPLY],
    "key moved to another column": [
        "CREATE TABLE t (id int CONSTRAINT pk PRIMARY KEY, u int NOT NULL, a int)",
        "INSERT INTO t SELECT g, 100 + g, g FROM generate_series(1, 6) g", CAPTURE, APPLY,
        "ALTER TABLE t DROP CONSTRAINT pk", "ALTER TABLE t ADD PRIMARY KEY (u)",
        "UPDATE t SET id = 1 WHERE u = 102", "UPDATE t SET u = 200 WHERE u = 103",
        "DELETE FROM t WHERE u = 104", CAPTURE, APPLY],
    "key moved, one batch": [
        "CREATE TABLE t (id int CONSTRAINT pk PRIMARY KEY, u int NOT NULL, a int)",
        "INSERT INTO t SELECT g, 100 + g, g FROM generate_series(1, 6) g",
        "UPDATE t SET a = 50 WHERE id = 6",
        "ALTER TABLE t DROP CONSTRAINT pk", "ALTER TABLE t ADD PRIMARY KEY (u)",
        "UPDATE t SET id = 1 WHERE u = 102", "UPDATE t SET u = 200 WHERE u = 103",
        "DELETE FROM t WHERE u = 104", CAPTURE, APPLY],
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_lake_follows_a_key_that_changes(case: str, pg_server: PostgresServer,
                                             kafka_servers: str, spark: Any,
                                             tmp_path: Path) -> None:
    lake_equals_source(Rig(pg_server, kafka_servers, spark, tmp_path), *CASES[case])
