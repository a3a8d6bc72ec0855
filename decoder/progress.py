"""Stored progress: the durable position, kept where a restart finds it, checked against the slot.

Order of acknowledgement: sink durable -> **progress stored** (here, fsynced and
renamed into place) -> flush LSN sent to PostgreSQL.  So stored progress is
never behind the slot's ``confirmed_flush_lsn``.  If it is, someone moved or
recreated the slot and changes between the two positions were never delivered:
that is data loss, and :func:`check_against_slot` says so instead of silently
streaming on.

One pgcdc at a time streams with one progress file: :meth:`ProgressStore.lock` takes an
exclusive ``flock`` on ``<file>.lock`` (which holds the owner's pid) for as long as the
process streams; a second instance is refused with the owner named, instead of relying only
on the slot's active flag.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from core.errors import TerminalError
from decoder.lsn import format_lsn
from decoder.restart import StateFiles, start_over
from decoder.slot import SlotInfo


class DataLossError(TerminalError):
    """The slot is ahead of what pgcdc made durable, or gone."""


class SlotLostError(DataLossError):
    pass


class ProgressLockedError(TerminalError):
    """Another pgcdc holds the lock of this progress file."""


@dataclass(frozen=True)
class StoredProgress:
    slot: str
    system_identifier: str
    database: str
    durable_lsn: int
    format: int = 1


class ProgressStore:
    """One JSON file, replaced atomically (write, fsync, rename, fsync the folder)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: IO[str] | None = None

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def lock(self) -> None:
        """Take the exclusive lock of this progress file (until :meth:`unlock` or the process
        ends); raises :class:`ProgressLockedError` naming the holder if another has it."""
        if self._lock is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.lock_path.open("a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            msg = (f"progress file {self.path} is in use by another pgcdc (pid {holder}, "
                   f"lock {self.lock_path}): two instances must not stream with one progress "
                   "file; stop the other one, or give this one its own --slot and "
                   "--progress-file")
            raise ProgressLockedError(msg) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._lock = fh

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            self._lock = None

    def load(self) -> StoredProgress | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        return StoredProgress(**data)

    def save(self, progress: StoredProgress) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".progress-")
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(progress), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def check_against_slot(stored: StoredProgress | None, slot: SlotInfo | None, *, slot_name: str,
                       system_identifier: str, database: str, path: Path,
                       files: StateFiles | None = None) -> None:
    """Raise :class:`DataLossError` if streaming on would skip changes; its message has every
    step of starting over (``files``: the state besides the progress file at ``path``)."""
    if stored is None:
        return
    fix = start_over(slot_name, files or StateFiles(path), drop_slot=slot is not None)
    if stored.system_identifier != system_identifier or stored.database != database:
        msg = (f"stored progress in {path} belongs to database {stored.database!r} of system "
               f"{stored.system_identifier}, not {database!r} of {system_identifier}: "
               "point --progress-file elsewhere for this source")
        raise DataLossError(msg)
    if slot is None:
        msg = (f'replication slot "{slot_name}" is gone but pgcdc had streamed from it up to '
               f"{format_lsn(stored.durable_lsn)}: changes since then are lost; {fix}")
        raise SlotLostError(msg)
    if slot.wal_status == "lost":
        msg = (f'replication slot "{slot_name}" was invalidated (wal_status lost, '
               f"max_slot_wal_keep_size exceeded): the WAL after "
               f"{format_lsn(stored.durable_lsn)} is gone; {fix}")
        raise SlotLostError(msg)
    confirmed = slot.confirmed_flush_lsn or 0
    if confirmed > stored.durable_lsn:
        msg = (f'replication slot "{slot_name}" is at {format_lsn(confirmed)} but pgcdc made '
               f"only {format_lsn(stored.durable_lsn)} durable: the slot was advanced or "
               f"recreated by someone else and the changes in between are lost; {fix}")
        raise DataLossError(msg)
