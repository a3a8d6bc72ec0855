"""``pgcdc status``: the slot, its lag, stored progress and the catalog, as one report."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from decoder.lsn import format_lsn
from decoder.progress import ProgressStore
from decoder.restart import StateFiles, start_over
from decoder.slot import slot_info
from pgcdc.exit_codes import EXIT_TERMINAL
from pgcdc.state_paths import slot_paths, state_files
from snapshot_builder.history import CatalogGapError, CatalogHistory, HistoryFile

if TYPE_CHECKING:
    from pgcdc.config import Settings


def status_report(dsn: str, slot: str, progress_file: Path, catalog_dir: Path, *,
                  files: StateFiles | None = None) -> dict[str, Any]:
    """``files``: every state file of the slot, named when changes were lost (by default the
    progress file and the catalog folder)."""
    report: dict[str, Any] = {"slot": slot}
    with psycopg.connect(dsn, autocommit=True) as conn:
        info = slot_info(conn, slot)
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        current = str(row[0]) if row else None
        report["server_wal_lsn"] = current
        if info is None:
            report["exists"] = False
        else:
            # the time lag as the server measures it from pgcdc's replies (flush: what is
            # durable downstream); 0 when nothing is unconfirmed; unknown (None) for a slot
            # nobody reads, and when the server has no sample
            lag = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
                "(SELECT extract(epoch FROM coalesce(flush_lag, write_lag, replay_lag))::float "
                " FROM pg_stat_replication WHERE pid = s.active_pid) "
                "FROM pg_replication_slots s WHERE slot_name = %s",
                (slot,)).fetchone()
            report.update({
                "exists": True,
                "active": info.active_pid is not None,
                "active_pid": info.active_pid,
                "wal_status": info.wal_status,
                "confirmed_flush_lsn": format_lsn(info.confirmed_flush_lsn or 0),
                "restart_lsn": format_lsn(info.restart_lsn or 0),
                "lag_bytes": int(lag[0]) if lag and lag[0] is not None else None,
                "lag_seconds": 0.0 if lag and lag[0] is not None and lag[0] <= 0 else
                float(lag[1]) if lag and lag[1] is not None else None,
                "two_phase": info.two_phase,
            })
    stored = ProgressStore(progress_file).load()
    report["stored_progress"] = format_lsn(stored.durable_lsn) if stored else None
    report["progress_check"] = progress_check(
        stored.durable_lsn if stored else None, info is not None,
        info.wal_status if info else None, info.confirmed_flush_lsn if info else None,
        slot=slot, files=files or StateFiles(progress_file, catalog_dir))
    report.update(catalog_report(catalog_dir))
    return report


LOST = "DATA LOSS"  # how a progress check that found changes gone begins


def progress_check(stored: int | None, exists: bool, wal_status: str | None,
                   confirmed: int | None, *, slot: str = "pgcdc",
                   files: StateFiles | None = None) -> str:
    """What the stored progress and the slot say together: ``ok``, a note, or ``DATA LOSS:``
    with what happened and every step of starting over (``pgcdc status`` then exits 3)."""
    reload = start_over(slot, files or StateFiles(None), drop_slot=exists)
    if exists and wal_status == "lost":
        return (f"{LOST}: the slot was invalidated (the server removed WAL it still needed, "
                f"max_slot_wal_keep_size): the changes since it are gone; {reload}")
    if stored is None:
        return "no stored progress (pgcdc has not run with this progress file)"
    if not exists:
        return (f"{LOST}: the slot is gone while progress at {format_lsn(stored)} is stored: "
                f"the changes since then are lost; {reload}")
    if confirmed is not None and confirmed > stored:
        return (f"{LOST}: the slot is ahead of the stored progress ({format_lsn(confirmed)} "
                f"> {format_lsn(stored)}): the changes between were never delivered; {reload}")
    return "ok"


def topic_counts(bootstrap_servers: str, prefix: str, client_config: dict[str, Any],
                 timeout: float = 10.0) -> dict[str, int]:
    """Messages retained per topic of ``prefix`` (the sum over partitions of high minus
    low watermark): what a consumer reading from the beginning would get."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    config = {**client_config, "bootstrap.servers": bootstrap_servers}
    metadata = AdminClient(config).list_topics(timeout=timeout)
    consumer = Consumer({**config, "group.id": "pgcdc-status", "enable.auto.commit": False})
    try:
        counts: dict[str, int] = {}
        for name, topic in sorted(metadata.topics.items()):
            if not name.startswith(f"{prefix}."):
                continue
            total = 0
            for partition in topic.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(name, partition),
                                                           timeout=timeout)
                total += high - low
            counts[name] = total
        return counts
    finally:
        consumer.close()


def catalog_report(catalog_dir: Path) -> dict[str, Any]:
    """The persisted catalog history and the snapshot builder's state as last saved.

    The pipeline runs in another process: the history is read without touching it
    (no torn line cut), and the builder's state is the one it saved with the history
    at its last checkpoint (every state change and compaction)."""
    report: dict[str, Any] = {}
    files = HistoryFile(catalog_dir)
    if files.log_path.exists() or files.snapshot_path.exists():
        history = _read_history(files)
        report["catalog_version"] = history.latest.version
        report["catalog_lsn"] = format_lsn(history.latest.lsn)
        report["catalog_tables"] = len(history.latest.tables)
        report["catalog_types"] = len(history.latest.types)
        report["catalog_oldest_version"] = history.base.version
        report["catalog_oldest_lsn"] = format_lsn(history.base.lsn)
    else:
        report["catalog_version"] = None
    saved = files.load_state()
    report["builder_state"] = saved.get("state") if saved else None
    if saved:
        if saved.get("running_at_attach"):
            report["builder_waiting_for"] = saved["running_at_attach"]
        if isinstance(saved.get("saved_at"), int | float):
            report["builder_state_saved_at"] = datetime.fromtimestamp(
                saved["saved_at"], UTC).isoformat(timespec="seconds")
    return report


def _read_history(files: HistoryFile) -> CatalogHistory:
    """A compaction in the running pipeline replaces the snapshot, then the log: read
    between the two, the log does not follow the snapshot; read again."""
    for _ in range(2):
        try:
            return files.load(read_only=True)
        except CatalogGapError:
            time.sleep(0.2)
    return files.load(read_only=True)


def render(report: dict[str, Any], *, as_json: bool = False) -> str:
    """The report as JSON (``--json``, for machines), or as aligned ``key  value`` lines."""
    if as_json:
        return json.dumps(report, indent=2)
    width = max(len(key) for key in report)
    lines = []
    for key, value in report.items():
        if isinstance(value, dict):
            lines.append(key)
            inner = max((len(k) for k in value), default=0)
            lines += [f"  {k:<{inner}}  {v}" for k, v in value.items()]
        else:
            lines.append(f"{key:<{width}}  {'-' if value is None else value}")
    return "\n".join(lines)


def status_command(settings: Settings, *, as_json: bool) -> int:
    """``pgcdc status``: the report, with the messages each topic holds when Kafka is
    configured; exit 3 when the progress check finds changes lost."""
    progress_file, catalog_dir, _ = slot_paths(settings)
    report = status_report(settings.source.conninfo(), settings.source.slot, progress_file,
                           catalog_dir, files=state_files(settings))
    sink = settings.sink
    if sink.kind == "kafka" and sink.bootstrap_servers:
        from confluent_kafka import KafkaException

        try:
            report["topics"] = topic_counts(sink.bootstrap_servers, sink.topic_prefix,
                                            sink.kafka_config())
        except KafkaException as exc:
            report["topics"] = f"unavailable: {exc.args[0]}"
    print(render(report, as_json=as_json))
    if str(report.get("progress_check", "")).startswith(LOST):
        print(f"pgcdc: {report['progress_check']}", file=sys.stderr)
        return EXIT_TERMINAL
    return 0
