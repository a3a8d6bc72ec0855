"""The replication stream: COPY BOTH framing (sans I/O) and a psycopg 3 driver.

The framing functions turn CopyData payloads into :class:`XLogData` or
:class:`Keepalive` and build standby status updates; they do no I/O and are
tested without a server.  :class:`ReplicationConnection` drives them over the
libpq layer of a psycopg 3 connection opened with ``replication=database``:
non-blocking ``get_copy_data``/``put_copy_data`` and ``select`` on its socket.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import time
from typing import Any, Final, NamedTuple

import psycopg
from psycopg import conninfo, pq, sql

from decoder.errors import (
    ConnectionLostError,
    DecodeError,
    ReplicationError,
    SlotInUseError,
    SlotMissingError,
)
from decoder.lsn import format_lsn
from decoder.pgoutput import PG_EPOCH_OFFSET_US

log = logging.getLogger(__name__)

# how every session of pgcdc prints values (and the clone oracle reads them: pgcdc/clone.py)
SESSION_SETTINGS: Final = {"DateStyle": "ISO", "TimeZone": "UTC", "IntervalStyle": "iso_8601",
                           "extra_float_digits": "3", "lc_monetary": "C"}
SESSION_OPTIONS: Final = " ".join(f"-c {name}={value}"
                                  for name, value in SESSION_SETTINGS.items())

CONNECT_TIMEOUT: Final = 10  # seconds, for the replication connection (see connect())

_XLOG_HEAD = struct.Struct("!QQq")
_KEEPALIVE = struct.Struct("!QqB")
_STATUS = struct.Struct("!cQQQqB")


class XLogData(NamedTuple):  # named tuples: one per message, four times cheaper to build
    wal_start: int
    wal_end: int
    send_time: int
    payload: bytes


class Keepalive(NamedTuple):
    wal_end: int
    send_time: int
    reply_requested: bool


def parse_copy_data(buf: bytes | memoryview) -> XLogData | Keepalive:
    """Parse one CopyData message of the replication stream."""
    if not buf:
        raise DecodeError("empty CopyData", tag=None, offset=0)
    tag = buf[0]
    if tag == 0x77:  # 'w'
        if len(buf) < 25:
            raise DecodeError("XLogData header cut short", tag="w", offset=len(buf))
        start, end, ts = _XLOG_HEAD.unpack_from(buf, 1)
        return XLogData(start, end, ts, bytes(buf[25:]))
    if tag == 0x6B:  # 'k'
        if len(buf) != 18:
            raise DecodeError(f"keepalive of {len(buf)} bytes, expected 18", tag="k",
                              offset=min(len(buf), 18))
        end, ts, reply = _KEEPALIVE.unpack_from(buf, 1)
        return Keepalive(end, ts, bool(reply))
    raise DecodeError(f"unknown CopyData tag {tag:#x}", tag=chr(tag), offset=0)


def now_pg_micros() -> int:
    return int(time.time() * 1_000_000) - PG_EPOCH_OFFSET_US


def standby_status(written: int, flushed: int, applied: int, *, reply: bool = False,
                   clock: int | None = None) -> bytes:
    """A Standby Status Update ('r') message."""
    return _STATUS.pack(b"r", written, flushed, applied,
                        now_pg_micros() if clock is None else clock, int(reply))


class ReplicationConnection:
    """One walsender connection streaming a logical slot."""

    def __init__(self, dsn: str, *, application_name: str = "pgcdc",
                 extra_options: dict[str, str] | None = None) -> None:
        self.dsn = dsn
        self.application_name = application_name
        self.options = SESSION_OPTIONS + "".join(
            f" -c {key}={value}" for key, value in (extra_options or {}).items())
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._streaming = False

    # --- connection -----------------------------------------------------------------------

    def connect(self) -> None:
        # a host that accepts TCP but never answers must not hold a reconnect forever;
        # a connect_timeout in the DSN or PGCONNECT_TIMEOUT wins
        timeout: dict[str, Any] = {}
        if "connect_timeout" not in conninfo.conninfo_to_dict(self.dsn) \
                and "PGCONNECT_TIMEOUT" not in os.environ:
            timeout["connect_timeout"] = CONNECT_TIMEOUT
        try:
            self._conn = psycopg.connect(
                self.dsn, replication="database", autocommit=True,
                application_name=self.application_name, options=self.options, **timeout,
            )
        except psycopg.OperationalError as exc:
            msg = f"cannot open a replication connection: {exc}".strip()
            raise ConnectionLostError(msg) from exc

    @property
    def server_version(self) -> int:
        """The server's version number, e.g. 150004."""
        return int(self.pgconn.server_version)

    @property
    def pgconn(self) -> pq.abc.PGconn:
        if self._conn is None:
            msg = "replication connection is not open; call connect() first"
            raise ReplicationError(msg)
        return self._conn.pgconn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._streaming = False

    def command(self, query: sql.Composable | str) -> list[tuple[str | None, ...]]:
        """Run one replication command (simple query protocol) and return its rows."""
        text = query if isinstance(query, str) else query.as_string(None)
        res = self.pgconn.exec_(text.encode())
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            if self.pgconn.status == pq.ConnStatus.BAD:  # the server went away under it
                raise _connection_lost(res, text)
            raise _server_error(res, text)
        rows = []
        for r in range(res.ntuples):
            row = []
            for c in range(res.nfields):
                v = res.get_value(r, c)
                row.append(None if v is None else bytes(v).decode())
            rows.append(tuple(row))
        return rows

    # --- streaming ------------------------------------------------------------------------

    def start(self, slot: str, start_lsn: int, options: dict[str, str]) -> None:
        opts = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(k), sql.Literal(v)) for k, v in options.items()
        )
        query = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
            sql.Identifier(slot), sql.SQL(format_lsn(start_lsn)), opts
        )
        text = query.as_string(None)
        pgconn = self.pgconn
        pgconn.send_query(text.encode())
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            self._wait(read=True, timeout=1.0)
        res = pgconn.get_result()
        if res is None or res.status != pq.ExecStatus.COPY_BOTH:
            if res is not None and res.error_field(pq.DiagnosticField.SQLSTATE) == b"55006":
                raise SlotInUseError(slot, None)
            if res is not None and res.error_field(pq.DiagnosticField.SQLSTATE) == b"42704":
                raise SlotMissingError(slot)
            raise _server_error(res, text)
        pgconn.nonblocking = 1
        self._streaming = True
        log.info("streaming slot %s from %s", slot, format_lsn(start_lsn))

    def read_batch(self, timeout: float, limit: int = 1024) -> list[XLogData | Keepalive]:
        """The messages already received, at most ``limit``; waits up to ``timeout``
        seconds for the first.  An empty list: nothing arrived.

        A consumer that handles a batch at a time pays its per-read costs (status
        checks, polling the sink) once per batch instead of once per message.
        """
        pgconn = self.pgconn
        batch: list[XLogData | Keepalive] = []
        deadline = 0.0
        while len(batch) < limit:
            nbytes, data = pgconn.get_copy_data(1)
            if nbytes > 0:
                batch.append(parse_copy_data(data))
                continue
            if nbytes < 0:
                raise self._lost(pgconn.get_error_message())
            if batch:
                break
            now = time.monotonic()
            if not deadline:
                deadline = now + timeout
            if now >= deadline:
                break
            self._wait(read=True, timeout=deadline - now)
            try:
                pgconn.consume_input()
            except psycopg.OperationalError as exc:
                raise self._lost(str(exc)) from exc
        return batch

    def send_status(self, written: int, flushed: int, applied: int, *,
                    reply: bool = False) -> None:
        """Report positions; ``reply`` asks the server for an immediate keepalive."""
        pgconn = self.pgconn
        payload = standby_status(written, flushed, applied, reply=reply)
        try:
            while pgconn.put_copy_data(payload) == 0:
                self._wait(read=False, timeout=1.0)
            while pgconn.flush() == 1:
                self._wait(read=False, timeout=1.0)
        except psycopg.OperationalError as exc:
            raise self._lost(str(exc)) from exc

    def finish(self, timeout: float = 10.0) -> None:
        """End streaming gracefully: CopyDone, then wait for the server's end of the stream.

        The walsender handles messages in order, so once it answers, it has applied
        the last status update: the slot shows the final flush position.
        """
        pgconn = self.pgconn
        deadline = time.monotonic() + timeout
        try:
            while pgconn.put_copy_end() == 0:
                self._wait(read=False, timeout=0.1)
            while pgconn.flush() == 1:
                self._wait(read=False, timeout=0.1)
            while time.monotonic() < deadline:
                nbytes, _ = pgconn.get_copy_data(1)
                if nbytes == 0:
                    self._wait(read=True, timeout=0.1)
                    pgconn.consume_input()
                elif nbytes < 0:
                    break  # data still in flight is dropped: it was never processed
            while pgconn.get_result() is not None:
                pass
        except psycopg.OperationalError:
            pass  # the connection ended anyway
        self._streaming = False

    # --- internals ------------------------------------------------------------------------

    def _wait(self, *, read: bool, timeout: float) -> None:
        fd = self.pgconn.socket
        if read:
            select.select([fd], [], [], timeout)
        else:
            select.select([], [fd], [], timeout)

    def _lost(self, detail: str) -> ConnectionLostError:
        res = self.pgconn.get_result()
        if res is not None and res.error_message:
            detail = res.error_message.decode(errors="replace")
        self._streaming = False
        detail = detail.strip() or "the server closed the stream"
        return ConnectionLostError(
            f"replication stream ended: {detail}; pgcdc resumes from the durable position"
        )


def _server_error(res: pq.abc.PGresult | None, query: str) -> ReplicationError:
    if res is None:
        return ReplicationError(f"no result for {query!r}")
    sqlstate = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    message = (res.error_message or b"").decode(errors="replace").strip()
    return ReplicationError(f"{query!r} failed [{sqlstate}]: {message}")


def _connection_lost(res: pq.abc.PGresult, query: str) -> ConnectionLostError:
    """A command that failed because the connection did (a server crash or restart while
    pgcdc starts): lost, as a lost stream is, so that the caller waits for the server and
    starts again, instead of stopping on the command's error."""
    message = (res.error_message or b"").decode(errors="replace").strip() or "connection lost"
    lost = ConnectionLostError(f"{query!r} failed: the replication connection was lost: "
                               f"{' '.join(message.split())}")
    lost.__cause__ = psycopg.OperationalError(message)  # what startup.unreachable reads
    return lost


def identify_system(dsn: str) -> tuple[str, str]:
    """The server's system identifier and the database name, from IDENTIFY_SYSTEM."""
    stream = ReplicationConnection(dsn)
    stream.connect()
    try:
        system_id, _timeline, _lsn, database = stream.command("IDENTIFY_SYSTEM")[0]
    finally:
        stream.close()
    return str(system_id), str(database)
