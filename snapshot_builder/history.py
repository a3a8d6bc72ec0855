"""The time-travel catalog: every table and type definition as it was at every LSN.

A :class:`Catalog` is an immutable version: a number, the LSN where it took
effect (the commit LSN of the DDL that made it), the tables and the types by
OID; it is the one entry point for lookups (:meth:`Catalog.table`,
:meth:`Catalog.type`, :meth:`Catalog.schema`, ...).  A change is a frozen object
(:class:`PutTable`, :class:`DropTable`, :class:`PutType`, :class:`DropType`),
and :func:`apply` is a pure function from version N and one change to version
N+1, registered per change type (``functools.singledispatch``).

:class:`CatalogHistory` is the append-only log of those changes, with an
expected-version check on append.  Lookups by version and by LSN are a floor
search over sorted keys; a full catalog is kept every ``checkpoint_every``
versions and others are rebuilt by replaying the entries after the nearest
one; :meth:`CatalogHistory.table_at` answers from a per-table index without
building a catalog.  :class:`HistoryFile` persists the log crash-safely: one
JSON line per entry, fsynced before the append returns; at load, a torn last
line (a crash mid-write) is dropped, anything else malformed is an error;
compaction writes a snapshot and drops older entries, atomically.

Formats: table entries and snapshots without types are format 1 (as written
since the first release); type entries and snapshots holding types are format
2.  Both load; golden files of each live in tests/golden/.  A history loads
without recomputing the stored table fingerprints (the latest catalog's are
checked at load, every one by :meth:`CatalogHistory.verify`).
"""

from __future__ import annotations

import bisect
import functools
import gc
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from core.errors import TerminalError
from snapshot_builder.catalog import Column, TableVersion, VersionMismatchError, table_from_dict
from snapshot_builder.datatype import TypeVersion, builtin_type, type_from_dict

FORMAT: Final = 1  # table entries and snapshots without types
FORMAT_TYPES: Final = 2  # type entries and snapshots with types
READABLE: Final = (FORMAT, FORMAT_TYPES)


_DECODER: Final = json.JSONDecoder()


class CatalogError(TerminalError):
    pass


class CatalogGapError(CatalogError):
    """An append whose expected version is not the latest: a lost or doubled change."""


_NO_TYPES: Final[Mapping[int, TypeVersion]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Schema:
    """A schema as the catalog sees it: a name and what it holds (a derived view)."""

    name: str
    tables: tuple[TableVersion, ...]
    types: tuple[TypeVersion, ...]


@dataclass(frozen=True, slots=True)
class Catalog:
    version: int
    lsn: int
    tables: Mapping[int, TableVersion]
    types: Mapping[int, TypeVersion] = field(default_factory=lambda: _NO_TYPES)

    def table(self, oid: int) -> TableVersion | None:
        return self.tables.get(oid)

    def type(self, oid: int) -> TypeVersion | None:
        """A captured type, or a built-in one; None for a user type never captured."""
        captured = self.types.get(oid)
        return captured if captured is not None else builtin_type(oid)

    def column_type(self, column: Column) -> TypeVersion | None:
        return self.type(column.type_oid)

    def schema_names(self) -> list[str]:
        return sorted({t.schema for t in self.tables.values()}
                      | {t.schema for t in self.types.values()})

    def schema(self, name: str) -> Schema | None:
        tables = tuple(sorted((t for t in self.tables.values() if t.schema == name),
                              key=lambda t: t.name))
        types = tuple(sorted((t for t in self.types.values() if t.schema == name),
                             key=lambda t: t.name))
        return Schema(name, tables, types) if tables or types else None


EMPTY: Final = Catalog(0, 0, MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PutTable:
    table: TableVersion


@dataclass(frozen=True, slots=True)
class DropTable:
    oid: int


@dataclass(frozen=True, slots=True)
class PutType:
    type: TypeVersion


@dataclass(frozen=True, slots=True)
class DropType:
    oid: int


Change = PutTable | DropTable | PutType | DropType


class _State:
    """The mutable working copy one change is applied to."""

    __slots__ = ("tables", "types")

    def __init__(self, catalog: Catalog) -> None:
        self.tables = dict(catalog.tables)
        self.types = dict(catalog.types)

    def freeze(self, version: int, lsn: int) -> Catalog:
        return Catalog(version, lsn, MappingProxyType(dict(self.tables)),
                       MappingProxyType(dict(self.types)) if self.types else _NO_TYPES)


@functools.singledispatch
def _apply(change: object, state: _State) -> None:
    msg = f"no catalog change type {type(change).__name__}"
    raise CatalogError(msg)


@_apply.register
def _(change: PutTable, state: _State) -> None:
    state.tables[change.table.oid] = change.table


@_apply.register
def _(change: DropTable, state: _State) -> None:
    state.tables.pop(change.oid, None)


@_apply.register
def _(change: PutType, state: _State) -> None:
    state.types[change.type.oid] = change.type


@_apply.register
def _(change: DropType, state: _State) -> None:
    state.types.pop(change.oid, None)


def apply(change: Change, catalog: Catalog, lsn: int) -> Catalog:
    """Version N+1: version N with one change, effective at ``lsn``."""
    state = _State(catalog)
    _apply(change, state)
    return state.freeze(catalog.version + 1, lsn)


# --- serialization ------------------------------------------------------------------------


def change_to_dict(change: Change) -> dict[str, Any]:
    if isinstance(change, PutTable):
        return {"type": "put_table", "table": change.table.to_dict()}
    if isinstance(change, DropTable):
        return {"type": "drop_table", "oid": change.oid}
    if isinstance(change, PutType):
        return {"type": "put_type", "datatype": change.type.to_dict()}
    return {"type": "drop_type", "oid": change.oid}


def change_format(change: Change) -> int:
    return FORMAT if isinstance(change, PutTable | DropTable) else FORMAT_TYPES


def change_from_dict(data: Mapping[str, Any], *, verify: bool = True) -> Change:
    kind = data.get("type")
    if kind == "put_table":
        return PutTable(table_from_dict(data["table"], verify=verify))
    if kind == "drop_table":
        return DropTable(int(data["oid"]))
    if kind == "put_type":
        return PutType(type_from_dict(data["datatype"]))
    if kind == "drop_type":
        return DropType(int(data["oid"]))
    msg = f"unknown catalog change type {kind!r}"
    raise CatalogError(msg)


def _check_format(data: Mapping[str, Any], what: str) -> None:
    if data.get("format") not in READABLE:
        msg = (f"catalog {what} format {data.get('format')!r}; this pgcdc reads formats "
               f"{', '.join(map(str, READABLE))}: upgrade pgcdc to read this history")
        raise CatalogError(msg)


@dataclass(frozen=True, slots=True)
class Entry:
    version: int  # the version this change creates
    lsn: int
    commit_time: int
    change: Change

    def to_json(self) -> str:
        return json.dumps({"format": change_format(self.change), "version": self.version,
                           "lsn": self.lsn, "commit_time": self.commit_time,
                           **change_to_dict(self.change)},
                          separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, line: str | bytes, *, verify: bool = True) -> Entry:
        """An entry; ``verify=False`` takes stored table fingerprints as written."""
        return cls.from_dict(json.loads(line), verify=verify)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, verify: bool = True) -> Entry:
        _check_format(data, "entry")
        return cls(int(data["version"]), int(data["lsn"]), int(data["commit_time"]),
                   change_from_dict(data, verify=verify))


def catalog_to_dict(catalog: Catalog) -> dict[str, Any]:
    out = {"format": FORMAT_TYPES if catalog.types else FORMAT, "version": catalog.version,
           "lsn": catalog.lsn,
           "tables": [t.to_dict() for t in sorted(catalog.tables.values(), key=lambda t: t.oid)]}
    if catalog.types:
        out["types"] = [t.to_dict() for t in sorted(catalog.types.values(), key=lambda t: t.oid)]
    return out


def catalog_from_dict(data: Mapping[str, Any], *, verify: bool = True) -> Catalog:
    _check_format(data, "snapshot")
    tables = {int(t["oid"]): table_from_dict(t, verify=verify) for t in data["tables"]}
    types = {int(t["oid"]): type_from_dict(t) for t in data.get("types") or ()}
    return Catalog(int(data["version"]), int(data["lsn"]), MappingProxyType(tables),
                   MappingProxyType(types) if types else _NO_TYPES)


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
        # per table oid: the versions that changed it and what it became (None: dropped)
        self._table_changes: dict[int, tuple[list[int], list[TableVersion | None]]] = {}
        self.generation = base.version  # bumped by every committed change (cache invalidation)

    @property
    def latest(self) -> Catalog:
        return self._latest

    @property
    def base(self) -> Catalog:
        return self._base

    @property
    def file(self) -> HistoryFile | None:
        return self._file

    def close(self) -> None:
        """Close the log file, if any (appending reopens it)."""
        if self._file is not None:
            self._file.close()

    def entries(self, after_version: int | None = None) -> Iterator[Entry]:
        """The held entries, or only those creating versions after ``after_version``."""
        if after_version is None:
            return iter(self._entries)
        if after_version >= self._latest.version:
            return iter(())  # the usual case, once per transaction: nothing new
        start = max(0, after_version - self._base.version)
        return iter(self._entries[start:])

    def entries_at(self, lsn: int) -> list[Entry]:
        """The held entries effective exactly at ``lsn`` (one committed transaction's)."""
        lo = bisect.bisect_left(self._lsns, lsn, 1)
        hi = bisect.bisect_right(self._lsns, lsn, 1)
        return self._entries[lo - 1:hi - 1]

    def append(self, change: Change, *, lsn: int, commit_time: int = 0,
               expected_version: int | None = None) -> Catalog:
        """Record a committed change; returns the new version."""
        latest = self._latest
        if expected_version is not None and expected_version != latest.version:
            msg = (f"catalog append expected version {expected_version} but the latest is "
                   f"{latest.version}: a change was lost or applied twice")
            raise CatalogGapError(msg)
        return self.extend((Entry(latest.version + 1, lsn, commit_time, change),))

    def extend(self, entries: Sequence[Entry]) -> Catalog:
        """Record committed entries at once, each the version after the one before (the
        first after the latest) at no lower an LSN: one working copy of the tables for all
        of them, where :meth:`append` makes one per change (a replay of many versions of
        many tables).  Returns the new latest version."""
        version, lsn = self._latest.version, self._latest.lsn
        for entry in entries:
            if entry.version != version + 1:
                msg = (f"catalog entry of version {entry.version} follows version {version}: "
                       "a change was lost or applied twice")
                raise CatalogGapError(msg)
            if entry.lsn < lsn:
                msg = (f"catalog change at LSN {entry.lsn} is older than version {version} "
                       f"({lsn})")
                raise CatalogGapError(msg)
            version, lsn = entry.version, entry.lsn
        if self._file is not None:
            for entry in entries:
                self._file.append(entry)
        self._extend(entries)
        return self._latest

    def _extend(self, entries: Iterable[Entry]) -> None:
        """Add entries already checked to follow each other: one working copy for the run,
        a frozen catalog only at checkpoints and at the end (how a long history loads)."""
        state: _State | None = None
        version, lsn = self._latest.version, self._latest.lsn
        for entry in entries:
            if state is None:
                state = _State(self._latest)
            _apply(entry.change, state)
            self._entries.append(entry)
            self._lsns.append(entry.lsn)
            version, lsn = entry.version, entry.lsn
            self._index(entry)
            if version % self._every == 0:
                self._checkpoints[version] = state.freeze(version, lsn)
        if state is None:
            return
        checkpoint = self._checkpoints.get(version)
        self._latest = checkpoint if checkpoint is not None else state.freeze(version, lsn)
        self.generation = version

    def _index(self, entry: Entry) -> None:
        change = entry.change
        if isinstance(change, PutTable):
            oid, table = change.table.oid, change.table
        elif isinstance(change, DropTable):
            oid, table = change.oid, None
        else:
            return
        versions, tables = self._table_changes.setdefault(oid, ([], []))
        versions.append(entry.version)
        tables.append(table)

    def catalog(self, version: int) -> Catalog:
        """The catalog of exactly this version."""
        base = self._base.version
        if not base <= version <= self._latest.version:
            msg = (f"catalog version {version} is not held (versions {base} to "
                   f"{self._latest.version}); older ones were compacted away")
            raise CatalogError(msg)
        if version == self._latest.version:
            return self._latest
        start = max(base, version - version % self._every)
        catalog = self._checkpoints[start]
        if start == version:
            return catalog
        state = _State(catalog)
        for entry in self._entries[start - base:version - base]:
            _apply(entry.change, state)
        return state.freeze(version, self._lsns[version - base])

    def _version_at(self, lsn: int) -> int:
        index = bisect.bisect_right(self._lsns, lsn) - 1
        if index < 0:
            msg = f"no catalog version at LSN {lsn}: the history starts at {self._base.lsn}"
            raise CatalogError(msg)
        return self._base.version + index

    def catalog_at(self, lsn: int) -> Catalog:
        """The catalog as it was at ``lsn``: the newest version effective at or before it."""
        return self.catalog(self._version_at(lsn))

    def table_at(self, oid: int, lsn: int) -> TableVersion | None:
        """``catalog_at(lsn).table(oid)`` from the per-table index: two floor searches."""
        version = self._version_at(lsn)
        changes = self._table_changes.get(oid)
        if changes is not None:
            index = bisect.bisect_right(changes[0], version) - 1
            if index >= 0:
                return changes[1][index]
        return self._base.table(oid)

    def type_at(self, oid: int, lsn: int) -> TypeVersion | None:
        return self.catalog_at(lsn).type(oid)

    def verify(self) -> int:
        """Recompute every held table version's fingerprints (a load takes them as
        stored); raises :class:`CatalogError` at the first mismatch; returns how many."""
        tables = list(self._base.tables.values())
        tables += [e.change.table for e in self._entries if isinstance(e.change, PutTable)]
        try:
            for table in tables:
                table.verify()
        except VersionMismatchError as exc:
            raise CatalogError(str(exc)) from exc
        return len(tables)

    def compact(self, horizon: int) -> int:
        """Drop the versions no reader needs: keep the one effective at ``horizon`` (the
        oldest LSN the slot may replay or a retained event needs) and all later ones.
        Returns how many versions were dropped."""
        keep = self.catalog_at(horizon) if horizon >= self._base.lsn else self._base
        if keep.version == self._base.version:
            return 0
        drop = keep.version - self._base.version
        self._entries = self._entries[drop:]
        self._lsns = [keep.lsn, *self._lsns[drop + 1:]]
        self._checkpoints = {v: c for v, c in self._checkpoints.items() if v >= keep.version}
        self._checkpoints[keep.version] = keep
        self._base = keep
        self._table_changes = {}
        for entry in self._entries:
            self._index(entry)
        if self._file is not None:
            self._file.rewrite(keep, self._entries)
        return drop


class HistoryFile:
    """``catalog.snapshot`` (the base, JSON) and ``catalog.log`` (one entry a line), and
    ``builder.state``: the snapshot builder's state as of its last checkpoint."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.log_path = directory / "catalog.log"
        self.snapshot_path = directory / "catalog.snapshot"
        self.state_path = directory / "builder.state"
        self._log: Any = None

    def load(self, *, checkpoint_every: int = 64, read_only: bool = False) -> CatalogHistory:
        """Recover by replay: the snapshot, then every complete entry after it.

        ``read_only`` (another process looking, e.g. ``pgcdc status``): the folder is not
        created, a torn last line is ignored rather than cut, and the history cannot
        append.
        """
        if not read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
        base = EMPTY
        if self.snapshot_path.exists():
            try:
                base = catalog_from_dict(json.loads(self.snapshot_path.read_bytes()),
                                         verify=False)
            except (ValueError, KeyError, TypeError) as exc:
                msg = (f"{self.snapshot_path} is not a catalog snapshot ({exc}); the file is "
                       "damaged: restore it, or remove the folder to rebuild the catalog")
                raise CatalogError(msg) from exc
        history = CatalogHistory(base, checkpoint_every=checkpoint_every)
        if self.log_path.exists():
            raw = self.log_path.read_bytes()
            cut = raw.rfind(b"\n") + 1
            torn = raw[cut:]
            try:
                text = raw[:cut].decode().split("\n")[:-1]
            except UnicodeDecodeError as exc:
                msg = (f"{self.log_path} is not UTF-8 at byte {exc.start}; the file is "
                       "damaged: restore it, or remove the folder to rebuild the catalog")
                raise CatalogError(msg) from exc
            collecting = gc.isenabled()
            gc.disable()  # tens of thousands of objects that all live: no cycles to find
            try:
                history._extend(self._entries(text, base.version))
            finally:
                if collecting:
                    gc.enable()
            if torn and not read_only:  # a crash mid-append: the entry was never acknowledged
                with self.log_path.open("r+b") as fh:
                    fh.truncate(len(raw) - len(torn))
        _verify_latest(history)
        if not read_only:
            history._file = self
        return history

    def _entries(self, lines: list[str], after: int) -> Iterator[Entry]:
        expected = after + 1
        for number, line in enumerate(lines, 1):
            entry = self._entry(line, number)
            if entry.version < expected:
                continue  # already in the snapshot (a crash during compaction)
            if entry.version != expected:
                msg = (f"{self.log_path}:{number}: entry for version {entry.version} after "
                       f"version {expected - 1}: the log has a gap")
                raise CatalogGapError(msg)
            expected += 1
            yield entry

    def _entry(self, line: str, number: int) -> Entry:
        try:
            data, end = _DECODER.raw_decode(line)
            if end != len(line):
                msg = f"extra data after the entry at column {end + 1}"
                raise ValueError(msg)
            if not isinstance(data, dict):
                msg = f"a JSON {type(data).__name__}, not an object"
                raise TypeError(msg)
            return Entry.from_dict(data, verify=False)
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

    def holds_history(self) -> bool:
        """A history was written here (a snapshot, or a log with an entry)."""
        return self.snapshot_path.exists() or \
            self.log_path.exists() and self.log_path.stat().st_size > 0

    def claim(self, *, system_identifier: str, database: str, slot: str) -> None:
        """Record whose history this folder holds (``catalog.owner``), or check it: a
        history of another server, database or slot would decode with wrong schemas."""
        owner = {"format": 1, "system_identifier": system_identifier, "database": database,
                 "slot": slot}
        path = self.directory / "catalog.owner"
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            stored = json.loads(path.read_bytes())
        except FileNotFoundError:
            _atomic_write(path, json.dumps(owner, sort_keys=True).encode())
            return
        except ValueError as exc:
            msg = (f"{path} is not a catalog owner record ({exc}): restore it, or remove "
                   f"{self.directory} to rebuild the catalog")
            raise CatalogError(msg) from exc
        if stored != owner:
            msg = (f"the catalog folder {self.directory} holds the history of slot "
                   f"{stored.get('slot')!r} of database {stored.get('database')!r} on system "
                   f"{stored.get('system_identifier')}, not of slot {slot!r} of database "
                   f"{database!r} on system {system_identifier}: point the catalog folder "
                   "(state.catalog_dir) elsewhere for this source, or remove it to rebuild "
                   "the catalog")
            raise CatalogError(msg)

    def save_state(self, state: Mapping[str, Any]) -> None:
        """The builder's state, atomically (read by ``pgcdc status`` and at restart)."""
        _atomic_write(self.state_path, json.dumps({"format": 1, **state},
                                                  sort_keys=True).encode())

    def load_state(self) -> dict[str, Any] | None:
        """The builder's saved state, or None when there is none (or it is unreadable:
        the state is advisory, the history is the truth)."""
        try:
            data = json.loads(self.state_path.read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("format") == 1 else None

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _verify_latest(history: CatalogHistory) -> None:
    """The versions the stream decodes with from here on are checked at load."""
    try:
        for table in history.latest.tables.values():
            table.verify()
    except VersionMismatchError as exc:
        raise CatalogError(str(exc)) from exc


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

