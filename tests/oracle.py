"""The consistent-clone oracle over Kafka (TESTING.md): a ledger of what the source committed
checked against what an independent consumer (kafka-python) reads from the topics."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
import psycopg
from kafka import KafkaConsumer, TopicPartition

from core.wire import FORMAT_HEADER, TABLE_VERSION_HEADER, catalog_topic
from decoder.slot import current_wal_lsn, slot_info

Conn = psycopg.Connection[tuple[object, ...]]


def raw_records(servers: str, topic: str, timeout: float,
                isolation_level: str = "read_uncommitted") -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False,
                             isolation_level=isolation_level)
    try:
        partitions = [TopicPartition(topic, p)
                      for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(p) < end[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end offsets")
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(records)
        return out
    finally:
        consumer.close()


def _avro_readers(servers: str, prefix: str, timeout: float) -> dict[str, tuple[Any, Any]]:
    """Writer schemas by table version, from the catalog topic alone."""
    readers = {}
    for record in raw_records(servers, catalog_topic(prefix), timeout):
        entry = json.loads(record.value)
        if entry.get("value_format") == "avro":
            readers[entry["version"]] = (
                fastavro.parse_schema(json.loads(entry["key_schema"])),
                fastavro.parse_schema(json.loads(entry["value_schema"])))
    return readers


def _real_names(record: dict[str, Any] | None, schema: Any) -> dict[str, Any] | None:
    if record is None:
        return None
    fields = schema["fields"] if "fields" in schema else schema
    return {f["pgcdc.column"]: record[f["name"]] for f in fields}


def read_topic(servers: str, topic: str, timeout: float = 60,
               isolation_level: str = "read_uncommitted") -> list[dict[str, Any]]:
    """Every change of a table topic, in partition order, decoded as an independent consumer
    would: JSON as it is, Avro with the writer schema the catalog topic gives its version.
    Tombstones are checked (each follows a delete of its key) and left out.
    ``isolation_level="read_committed"`` skips aborted Kafka transactions."""
    prefix = topic.split(".")[0]
    readers: dict[str, tuple[Any, Any]] | None = None
    out: list[dict[str, Any]] = []
    for r in raw_records(servers, topic, timeout, isolation_level):
        if r.value is None:
            assert out and out[-1]["op"] == "d" and out[-1]["_raw_key"] == r.key, "stray tombstone"
            continue
        headers = {k: v.decode() for k, v in r.headers}
        if headers.get(FORMAT_HEADER) == "avro":
            if readers is None or headers[TABLE_VERSION_HEADER] not in readers:
                readers = _avro_readers(servers, prefix, timeout)
            key_schema, value_schema = readers[headers[TABLE_VERSION_HEADER]]
            key = fastavro.schemaless_reader(io.BytesIO(r.key), key_schema, None)
            value = fastavro.schemaless_reader(io.BytesIO(r.value), value_schema, None)
            row_schema = value_schema["fields"][0]["type"][1]
            value["before"] = _real_names(value["before"], row_schema)
            value["after"] = _real_names(value["after"], row_schema)
            key = _real_names(key, key_schema)
        else:
            key, value = json.loads(r.key), json.loads(r.value)
        out.append({"key": key, "_raw_key": r.key, **value})
    return out


@dataclass
class Ledger:
    """What the writer committed: (id, version) pairs and deletes, by commit order."""

    versions: set[tuple[int, int]] = field(default_factory=set)
    deletes: set[tuple[int, int]] = field(default_factory=set)  # (id, last version)
    transactions: int = 0


class Writer:
    """Small random transactions on ``ledger(id, version, payload)``, recorded after commit."""

    def __init__(self, dsn: str, seed: int) -> None:
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.rows: dict[int, int] = {}
        self.next_id = 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def write(self, conn: Conn, transactions: int) -> None:
        for _ in range(transactions):
            self._transaction(conn)

    def _transaction(self, conn: Conn) -> None:
        rng = self.rng
        changes: list[tuple[str, int, int]] = []
        with conn.transaction():
            for _ in range(rng.randint(1, 4)):
                roll = rng.random()
                if roll < 0.5 or len(self.rows) < 3:
                    key, version = self.next_id, 1
                    self.next_id += 1
                    conn.execute("INSERT INTO ledger VALUES (%s, %s, %s)",
                                 (key, version, "p" * rng.randint(0, 300)))
                    changes.append(("w", key, version))
                    self.rows[key] = version
                elif roll < 0.85:
                    key = rng.choice(list(self.rows))
                    version = self.rows[key] + 1
                    conn.execute("UPDATE ledger SET version = %s WHERE id = %s", (version, key))
                    changes.append(("w", key, version))
                    self.rows[key] = version
                else:
                    key = rng.choice(list(self.rows))
                    conn.execute("DELETE FROM ledger WHERE id = %s", (key,))
                    changes.append(("d", key, self.rows.pop(key)))
        for kind, key, version in changes:
            (self.ledger.versions if kind == "w" else self.ledger.deletes).add((key, version))
        self.ledger.transactions += 1

    def start(self, pause: float = 0.005) -> None:
        def loop() -> None:
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    while not self._stop.is_set():
                        self._transaction(conn)
                        time.sleep(pause)
            except BaseException as exc:
                self.error = exc

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        assert self.error is None, self.error


@dataclass
class Verdict:
    events: int
    distinct: int

    @property
    def duplicate_ratio(self) -> float:
        return (self.events - self.distinct) / max(self.distinct, 1)


def verify(events: list[dict[str, Any]], ledger: Ledger, source: Conn) -> Verdict:
    """No loss, per-key order, and the fold by key equals the source table."""
    seen_versions = set()
    seen_deletes = set()
    positions: dict[int, list[tuple[int, int]]] = {}
    folded: dict[int, int] = {}
    distinct = set()
    for event in events:
        key = event["key"]["id"]
        source_block = event["source"]
        position = (source_block["commit_lsn"], source_block["ordinal"])
        distinct.add(position)
        positions.setdefault(key, []).append(position)
        if event["op"] == "d":
            seen_deletes.add((key, folded.get(key, -1)))
            folded.pop(key, None)
        else:
            version = event["after"]["version"]
            seen_versions.add((key, version))
            folded[key] = version
    lost = ledger.versions - seen_versions
    assert not lost, f"{len(lost)} committed versions never reached Kafka, e.g. {sorted(lost)[:5]}"
    lost_deletes = {k for k, _ in ledger.deletes} - {k for k, _ in seen_deletes}
    assert not lost_deletes, f"deletes never reached Kafka: {sorted(lost_deletes)[:5]}"
    for key, history in positions.items():
        # replays may repeat a suffix, but each delivery run is in order: the sequence of
        # distinct positions, in first-seen order, never goes backwards
        first_seen = list(dict.fromkeys(history))
        assert first_seen == sorted(first_seen), f"order broke for key {key}: {history}"
    rows = dict(source.execute("SELECT id, version FROM ledger").fetchall())
    assert folded == rows, "the topic folded by key differs from the source table"
    return Verdict(len(events), len(distinct))


class PgcdcProcess:
    """``pgcdc run`` as a separate process, to crash and restart for real."""

    def __init__(self, dsn: str, servers: str, prefix: str, progress: Path,
                 extra_args: Sequence[str] = ()) -> None:
        self.argv = [sys.executable, "-m", "pgcdc", "run", "--dsn", dsn, "--sink", "kafka",
                     "--bootstrap-servers", servers, "--topic-prefix", prefix,
                     "--tables", "public.ledger", "--progress-file", str(progress),
                     "--catalog-dir", str(progress.with_suffix(".catalog")), *extra_args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, fail_point: str | None = None) -> None:
        env = dict(os.environ)
        env.pop("PGCDC_FAIL_POINT", None)
        if fail_point:
            env["PGCDC_FAIL_POINT"] = fail_point
        self.proc = subprocess.Popen(self.argv, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)

    def wait(self, timeout: float) -> tuple[int, str]:
        assert self.proc is not None
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err.decode(errors="replace")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def catch_up(self, conn: Conn, slot: str = "pgcdc", timeout: float = 120) -> None:
        """Run until the slot confirmed everything written so far, then stop gracefully."""
        target = current_wal_lsn(conn)
        self.start()
        self.stop_after_catch_up(conn, target, slot=slot, timeout=timeout)

    def stop_after_catch_up(self, conn: Conn, target: int, *, slot: str = "pgcdc",
                            timeout: float = 120) -> str:
        """Let the running pgcdc go on until the slot confirmed ``target``, then stop it
        gracefully (SIGTERM: exit 0); its stderr."""
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while True:
            info = slot_info(conn, slot)
            if info and info.confirmed_flush_lsn and info.confirmed_flush_lsn >= target:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                code, err = self.wait(5) if self.proc.poll() is None else (
                    self.proc.returncode, self.proc.stderr.read().decode() if self.proc.stderr
                    else "")
                raise AssertionError(f"pgcdc did not catch up (exit {code}):\n{err}")
            time.sleep(0.2)
        self.proc.send_signal(signal.SIGTERM)
        code, err = self.wait(60)
        assert code == 0, f"graceful stop failed ({code}):\n{err}"
        return err
