"""The time-travel catalog: every table definition as it was at every LSN.

A :class:`Catalog` is an immutable version: a number, the LSN where it took
effect (the commit LSN of the DDL that made it) and the tables by OID.  A
change is a frozen object (:class:`PutTable`, :class:`DropTable`), and
:func:`apply` is a pure function from version N and one change to version N+1,
registered per change type (``functools.singledispatch``).

:class:`CatalogHistory` is the append-only log of those changes, with an
expected-version check on append.  Lookups by version and by LSN are a floor
search over sorted keys; a full catalog is kept every ``checkpoint_every``
versions and others are rebuilt by replaying the entries after the nearest
one.  :class:`HistoryFile` persists the log crash-safely: one JSON line per
entry, fsynced before the append returns; at load, a torn last line (a crash
mid-write) is dropped, anything else malformed is an error; compaction writes
a snapshot and drops older entries, atomically.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from pgcdc.errors import TerminalError
from snapshot_builder.catalog import TableVersion, table_from_dict

FORMAT: Final = 1


class CatalogError(TerminalError):
    pass


class CatalogGapError(CatalogError):
    """An append whose expected version is not the latest: a lost or doubled change."""


@dataclass(frozen=True, slots=True)
class Catalog:
    version: int
    lsn: int
    tables: Mapping[int, TableVersion]

    def table(self, oid: int) -> TableVersion | None:
        return self.tables.get(oid)


EMPTY: Final = Catalog(0, 0, MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PutTable:
    table: TableVersion


@dataclass(frozen=True, slots=True)
class DropTable:
    oid: int


Change = PutTable | DropTable


@functools.singledispatch
def _apply(change: object, tables: dict[int, TableVersion]) -> None:
    msg = f"no catalog change type {type(change).__name__}"
    raise CatalogError(msg)


@_apply.register
def _(change: PutTable, tables: dict[int, TableVersion]) -> None:
    tables[change.table.oid] = change.table


@_apply.register
def _(change: DropTable, tables: dict[int, TableVersion]) -> None:
    tables.pop(change.oid, None)


def apply(change: Change, catalog: Catalog, lsn: int) -> Catalog:
    """Version N+1: version N with one change, effective at ``lsn``."""
    tables = dict(catalog.tables)
    _apply(change, tables)
    return Catalog(catalog.version + 1, lsn, MappingProxyType(tables))


# --- serialization ------------------------------------------------------------------------


def change_to_dict(change: Change) -> dict[str, Any]:
    if isinstance(change, PutTable):
        return {"type": "put_table", "table": change.table.to_dict()}
    return {"type": "drop_table", "oid": change.oid}


def change_from_dict(data: Mapping[str, Any]) -> Change:
    kind = data.get("type")
    if kind == "put_table":
        return PutTable(table_from_dict(data["table"]))
    if kind == "drop_table":
        return DropTable(int(data["oid"]))
    msg = f"unknown catalog change type {kind!r}"
    raise CatalogError(msg)


@dataclass(frozen=True, slots=True)
class Entry:
    version: int  # the version this change creates
    lsn: int
    commit_time: int
    change: Change

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": self.version, "lsn": self.lsn,
                           "commit_time": self.commit_time, **change_to_dict(self.change)},
                          separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Entry:
        data = json.loads(line)
        if data.get("format") != FORMAT:
            msg = f"catalog entry format {data.get('format')!r}; this pgcdc reads {FORMAT}"
            raise CatalogError(msg)
        return cls(int(data["version"]), int(data["lsn"]), int(data["commit_time"]),
                   change_from_dict(data))


def catalog_to_dict(catalog: Catalog) -> dict[str, Any]:
    return {"format": FORMAT, "version": catalog.version, "lsn": catalog.lsn,
            "tables": [t.to_dict() for t in sorted(catalog.tables.values(), key=lambda t: t.oid)]}


def catalog_from_dict(data: Mapping[str, Any]) -> Catalog:
    if data.get("format") != FORMAT:
        msg = f"catalog snapshot format {data.get('format')!r}; this pgcdc reads {FORMAT}"
        raise CatalogError(msg)
    tables = {int(t["oid"]): table_from_dict(t) for t in data["tables"]}
    return Catalog(int(data["version"]), int(data["lsn"]), MappingProxyType(tables))


# --- the history --------------------------------------------------------------------------


class CatalogHistory:
    """Every catalog version from a base (version 0, or a compaction snapshot) on."""

    def __init__(self, base: Catalog = EMPTY, *, checkpoint_every: int = 64,
                 file: HistoryFile | None = None) -> None:
        self._base = base
        self._entries: list[Entry] = []
        self._lsns: list[int] = [base.lsn]  # lsn of version base.version + i
        self._checkpoints: dict[int, Catalog] = {base.version: base}
        self._latest = base
        self._every = checkpoint_every
        self._file = file
        self.generation = base.version  # bumped by every committed change (cache invalidation)

    @property
    def latest(self) -> Catalog:
        return self._latest

    @property
    def base(self) -> Catalog:
        return self._base

    def entries(self, after_version: int | None = None) -> Iterator[Entry]:
        """The held entries, or only those creating versions after ``after_version``."""
        if after_version is None:
            return iter(self._entries)
        start = max(0, after_version - self._base.version)
        return iter(self._entries[start:])

    def append(self, change: Change, *, lsn: int, commit_time: int = 0,
               expected_version: int | None = None) -> Catalog:
        """Record a committed change; returns the new version."""
        latest = self._latest
        if expected_version is not None and expected_version != latest.version:
            msg = (f"catalog append expected version {expected_version} but the latest is "
                   f"{latest.version}: a change was lost or applied twice")
            raise CatalogGapError(msg)
        if lsn < latest.lsn:
            msg = (f"catalog change at LSN {lsn} is older than version {latest.version} "
                   f"({latest.lsn})")
            raise CatalogGapError(msg)
        entry = Entry(latest.version + 1, lsn, commit_time, change)
        if self._file is not None:
            self._file.append(entry)
        self._add(entry)
        return self._latest

    def _add(self, entry: Entry) -> None:
        self._latest = apply(entry.change, self._latest, entry.lsn)
        self._entries.append(entry)
        self._lsns.append(entry.lsn)
        if entry.version % self._every == 0:
            self._checkpoints[entry.version] = self._latest
        self.generation = self._latest.version

    def catalog(self, version: int) -> Catalog:
        """The catalog of exactly this version."""
        if not self._base.version <= version <= self._latest.version:
            msg = (f"catalog version {version} is not held (versions {self._base.version} to "
                   f"{self._latest.version}); older ones were compacted away")
            raise CatalogError(msg)
        if version == self._latest.version:
            return self._latest
        start = max(v for v in self._checkpoints if v <= version)
        catalog = self._checkpoints[start]
        for entry in self._entries[start - self._base.version:version - self._base.version]:
            catalog = apply(entry.change, catalog, entry.lsn)
        return catalog

    def catalog_at(self, lsn: int) -> Catalog:
        """The catalog as it was at ``lsn``: the newest version effective at or before it."""
        index = bisect.bisect_right(self._lsns, lsn) - 1
        if index < 0:
            msg = f"no catalog version at LSN {lsn}: the history starts at {self._base.lsn}"
            raise CatalogError(msg)
        return self.catalog(self._base.version + index)

    def table_at(self, oid: int, lsn: int) -> TableVersion | None:
        return self.catalog_at(lsn).table(oid)

    def compact(self, horizon: int) -> None:
        """Drop the versions no reader needs: keep the one effective at ``horizon`` (the
        oldest LSN the slot may replay or a retained event needs) and all later ones."""
        keep = self.catalog_at(horizon) if horizon >= self._base.lsn else self._base
        if keep.version == self._base.version:
            return
        drop = keep.version - self._base.version
        self._entries = self._entries[drop:]
        self._lsns = [keep.lsn, *self._lsns[drop + 1:]]
        self._checkpoints = {v: c for v, c in self._checkpoints.items() if v >= keep.version}
        self._checkpoints[keep.version] = keep
        self._base = keep
        if self._file is not None:
            self._file.rewrite(keep, self._entries)


class HistoryFile:
    """``catalog.snapshot`` (the base, JSON) and ``catalog.log`` (one entry a line)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.log_path = directory / "catalog.log"
        self.snapshot_path = directory / "catalog.snapshot"
        self._log: Any = None

    def load(self, *, checkpoint_every: int = 64) -> CatalogHistory:
        """Recover by replay: the snapshot, then every complete entry after it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        base = EMPTY
        if self.snapshot_path.exists():
            base = catalog_from_dict(json.loads(self.snapshot_path.read_text()))
        history = CatalogHistory(base, checkpoint_every=checkpoint_every)
        if self.log_path.exists():
            raw = self.log_path.read_bytes()
            lines = raw.split(b"\n")
            complete, torn = lines[:-1], lines[-1]
            for number, line in enumerate(complete, 1):
                entry = self._entry(line, number)
                if entry.version <= base.version:
                    continue  # already in the snapshot (a crash during compaction)
                if entry.version != history.latest.version + 1:
                    msg = (f"{self.log_path}:{number}: entry for version {entry.version} after "
                           f"version {history.latest.version}: the log has a gap")
                    raise CatalogGapError(msg)
                history._add(entry)
            if torn:  # a crash mid-append: the entry was never acknowledged
                with self.log_path.open("r+b") as fh:
                    fh.truncate(len(raw) - len(torn))
        history._file = self
        return history

    def _entry(self, line: bytes, number: int) -> Entry:
        try:
            return Entry.from_json(line.decode())
        except (ValueError, KeyError, TypeError) as exc:
            msg = (f"{self.log_path}:{number} is not a catalog entry ({exc}); the file is "
                   "damaged: restore it, or remove the folder to rebuild the catalog")
            raise CatalogError(msg) from exc

    def append(self, entry: Entry) -> None:
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._log.write(entry.to_json().encode() + b"\n")
        self._log.flush()
        os.fsync(self._log.fileno())

    def rewrite(self, base: Catalog, entries: list[Entry]) -> None:
        """Compaction: the new snapshot first, then the shorter log, each atomically."""
        _atomic_write(self.snapshot_path, json.dumps(catalog_to_dict(base)).encode())
        _atomic_write(self.log_path, b"".join(e.to_json().encode() + b"\n" for e in entries))
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
