"""The storage of a transaction whose changes arrive before its commit.

With ``streaming`` on, PostgreSQL sends a large transaction in chunks while it
is still running; with ``two_phase`` on, it sends a prepared transaction at
PREPARE time.  Neither may reach a sink before it commits; the reorder buffer
(decoder/reorder.py) keeps each in a :class:`Spill`: its raw pgoutput messages,
in order, in memory up to a bound and in a temporary file past it, so memory
stays bounded whatever the transaction's size.  Raw messages (not decoded
events) are kept so that a Relation message inside the transaction is replayed
at its exact place.

A rolled-back subtransaction's messages are skipped at replay; an aborted or
rolled-back transaction is discarded whole.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

from decoder import pgoutput as pg
from decoder.errors import DecodeError

_RECORD = struct.Struct("!IQI")  # subxid, lsn, payload length
_XID = struct.Struct("!I")
# what one held message costs in memory beyond its payload: the tuple, the bytes object
# header and two ints (measured with sys.getsizeof)
_ENTRY_OVERHEAD = 160


def streamed_xid(payload: bytes) -> int:
    """The (sub)transaction id a data message inside a streamed block starts with.

    The Origin message that PostgreSQL sends in the first block of a transaction made
    under a replication origin carries no xid: it belongs to the whole transaction, so it
    gets 0 (InvalidTransactionId, never a subtransaction's) and no Stream Abort of a
    subtransaction can drop it."""
    if payload and payload[0] == pg.TAG_ORIGIN:
        return 0
    if len(payload) < 5:
        msg = "streamed message without its xid"
        raise DecodeError(msg, tag=chr(payload[0]) if payload else None, offset=len(payload))
    return int(_XID.unpack_from(payload, 1)[0])


class Spill:
    """The raw messages of one not-yet-committed transaction."""

    def __init__(self, xid: int, *, streaming: bool, memory_limit: int,
                 directory: str | None = None) -> None:
        self.xid = xid
        self.streaming = streaming  # were the messages sent inside a streamed block?
        self.first_lsn: int | None = None
        self._memory_limit = memory_limit
        self._directory = directory
        self._memory: list[tuple[int, int, bytes]] = []
        self._memory_bytes = 0
        self._file: BinaryIO | None = None
        self._path: str | None = None
        self._aborted: set[int] = set()
        self.count = 0

    @property
    def buffered_bytes(self) -> int:
        return self._memory_bytes

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def add(self, subxid: int, lsn: int, payload: bytes) -> None:
        if self.first_lsn is None:
            self.first_lsn = lsn
        self.count += 1
        if self._file is None and self._memory_bytes + len(payload) <= self._memory_limit:
            self._memory.append((subxid, lsn, payload))
            self._memory_bytes += len(payload) + _ENTRY_OVERHEAD
            return
        if self._file is None:
            self._open_file()
        assert self._file is not None
        self._file.write(_RECORD.pack(subxid, lsn, len(payload)))
        self._file.write(payload)

    def abort_subtransaction(self, subxid: int) -> None:
        self._aborted.add(subxid)

    def replay(self) -> Iterator[tuple[int, bytes]]:
        """``(lsn, payload)`` of every message not rolled back, in arrival order."""
        aborted = self._aborted
        for subxid, lsn, payload in self._memory:
            if subxid not in aborted:
                yield lsn, payload
        if self._file is None:
            return
        self._file.flush()
        self._file.seek(0)
        read = self._file.read
        while header := read(_RECORD.size):
            subxid, lsn, length = _RECORD.unpack(header)
            payload = read(length)
            if subxid not in aborted:
                yield lsn, payload

    def discard(self) -> None:
        self._memory.clear()
        self._memory_bytes = 0
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._path is not None:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
            self._path = None

    def _open_file(self) -> None:
        fd, self._path = tempfile.mkstemp(prefix=f"pgcdc-xid{self.xid}-", suffix=".spill",
                                          dir=self._directory)
        self._file = os.fdopen(fd, "w+b")
