"""The catalog the Spark job resolves tables through: the builder's own history, replayed.

pgcdc publishes every entry of its catalog history (snapshot_builder/history.py) to
``<prefix>._catalog_history``, in the history's own serialization (:meth:`Entry.to_json`),
one record per catalog version.  The job replays them into a
:class:`~snapshot_builder.history.CatalogHistory`, the same model the builder decoded the
stream with, so that the lake follows what happened at the source:

* a table's shape is the history's newest version of it (for a dropped table, the last
  one before the drop), never a guess from the order records were published in;
* every version of a table, oldest first, with its columns' identities (renames);
* a table's lives: the OID's first version says when it was created, a ``drop_table``
  entry when it was dropped (and the lake table is dropped or archived with it); a table
  created again under the same name is another OID, hence another life, which starts
  empty.

The ``<prefix>._catalog`` records (:class:`CatalogLog`) still give what only they carry:
each version's topic and its Avro writer schema.  They are also the whole story when the
history does not hold a table: without DDL capture (no event trigger: pgcdc is not a
superuser) the history holds no tables at all, and a table then resolves from its
``_catalog`` records alone, replayed into a history of their own (one ``put_table`` per
version, at the LSN it was published with), read by the same :func:`_lives` as the
builder's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType

from core.wire import CATALOG_OID, topic_name
from snapshot_builder.catalog import TableVersion, table_from_dict
from snapshot_builder.history import (
    Catalog,
    CatalogError,
    CatalogHistory,
    DropTable,
    Entry,
    PutTable,
)
from streaming.schema import TableSpec

log = logging.getLogger(__name__)


class CatalogHistoryError(CatalogError):
    """The catalog history topic cannot be replayed."""


def replay(records: Iterable[str | bytes]) -> CatalogHistory:
    """The builder's history from its published entries, in the order the topic holds them.

    Each run of pgcdc publishes its history's entries again, so a version may come more
    than once, always the same.  A record that differs from an earlier one of the same
    version comes from a history built anew (a catalog folder removed and a new slot): it
    and every later record supersede what was read from that version on.  The history
    starts at the first version held (an entry's predecessors may have been compacted away
    before it was published: their tables then resolve from the ``_catalog`` records) and
    ends before the first missing version (a publication still under way).
    """
    entries: dict[int, Entry] = {}
    for raw in records:
        entry = Entry.from_json(raw, verify=False)
        seen = entries.get(entry.version)
        if seen is not None and seen != entry:
            log.warning("catalog history version %d published twice with different "
                        "changes: a rebuilt history replaces the versions from %d on",
                        entry.version, entry.version)
            entries = {v: e for v, e in entries.items() if v < entry.version}
        entries[entry.version] = entry
    if not entries:
        return CatalogHistory()
    first = min(entries)
    history = CatalogHistory(Catalog(first - 1, entries[first].lsn, MappingProxyType({})))
    version, lsn, held = first, entries[first].lsn, []
    while version in entries:
        entry = entries[version]
        lsn = max(entry.lsn, lsn)
        held.append(entry if entry.lsn == lsn else dataclasses.replace(entry, lsn=lsn))
        version += 1
    history.extend(held)  # one working copy of the tables for every version
    if version <= max(entries):
        log.info("catalog history replayed to version %d; version %d is not published yet",
                 version - 1, version)
    return history


@dataclass(frozen=True)
class Life:
    """One table (one OID) as the history saw it: created, changed, maybe dropped."""

    oid: int
    born: int  # the LSN of its first version the history holds
    versions: tuple[tuple[int, TableVersion], ...]  # (LSN, version), oldest first
    # the LSN of its drop, if dropped, or where it left the publication, if it is out of
    # it since (a partition attached under a publication via the root): gone for the lake
    dropped: int | None


def _lives(history: CatalogHistory) -> dict[int, Life]:
    changes: dict[int, list[tuple[int, TableVersion | None]]] = {}
    base = history.base
    for oid, table in base.tables.items():
        changes[oid] = [(base.lsn, table)]
    for entry in history.entries():
        change = entry.change
        if isinstance(change, PutTable):
            changes.setdefault(change.table.oid, []).append((entry.lsn, change.table))
        elif isinstance(change, DropTable) and change.oid in changes:
            changes[change.oid].append((entry.lsn, None))
    lives = {}
    for oid, steps in changes.items():
        versions = tuple((lsn, t) for lsn, t in steps if t is not None)
        if not versions:
            continue
        dropped = steps[-1][0] if steps[-1][1] is None else None
        if dropped is None and not versions[-1][1].published:
            # out of the publication since the first of its last unpublished versions
            for lsn, table in reversed(versions):
                if table.published:
                    break
                dropped = lsn
        lives[oid] = Life(oid, steps[0][0], versions, dropped)
    return lives


class CatalogLog:
    """Every published table version (the ``<prefix>._catalog`` records), by OID and
    version: what each was published with, and the order of a table's versions by their
    records alone (replayed into a :class:`~snapshot_builder.history.CatalogHistory`,
    :attr:`history`, one ``put_table`` per version at the LSN it was published with; a
    version published again counts once, at its first record)."""

    def __init__(self, specs: Iterable[TableSpec]) -> None:
        self._versions: dict[tuple[int, str], TableSpec] = {}
        for spec in specs:
            self._versions.setdefault((spec.oid, spec.version), spec)
        self.history = CatalogHistory()
        for spec in sorted(self._versions.values(), key=lambda s: s.lsn):
            self.history.append(PutTable(spec.table), lsn=spec.lsn)
        self._lives = _lives(self.history)
        self._by_oid: dict[int, list[TableSpec]] = {}
        for oid, life in self._lives.items():
            versions = [self._versions[(oid, table.version)] for _, table in life.versions]
            self._by_oid[oid] = _borrow_identities(versions)
            self._versions.update(((oid, s.version), s) for s in self._by_oid[oid])

    def version(self, oid: int, version: str) -> TableSpec | None:
        return self._versions.get((oid, version))

    def by_version(self, version: str) -> TableSpec | None:
        """Any table's spec with this version: equal versions have equal writer schemas."""
        return next((s for (_, v), s in self._versions.items() if v == version), None)

    def latest(self, oid: int) -> TableSpec:
        return self._by_oid[oid][-1]

    def versions(self, oid: int) -> list[TableSpec]:
        """Every version of one table, oldest first."""
        return list(self._by_oid.get(oid, []))

    def born(self, oid: int) -> int | None:
        """The LSN of the table's oldest record, if any."""
        life = self._lives.get(oid)
        return None if life is None else life.born

    def tables(self) -> list[TableSpec]:
        """The newest version of every table."""
        return [versions[-1] for versions in self._by_oid.values()]

    def __len__(self) -> int:
        return len(self._versions)


def _borrow_identities(versions: list[TableSpec]) -> list[TableSpec]:
    """``versions`` (one table's, oldest first) where a version described by a Relation
    message (no attnums) takes the attnums of the newest captured version with the same
    layout (:attr:`TableVersion.layout`: the same columns, types and order, so the same
    columns), as :attr:`TableSpec.attnums`; its own version is kept."""
    captured = {v.table.layout: v for v in versions
                if v.columns and all(c.attnum is not None for c in v.columns)}
    out = []
    for spec in versions:
        donor = captured.get(spec.table.layout)
        if donor is not None and all(c.attnum is None for c in spec.columns) \
                and [c.name for c in donor.columns] == [c.name for c in spec.columns]:
            spec = dataclasses.replace(spec, attnums=tuple(c.attnum for c in donor.columns))
        out.append(spec)
    return out


class LakeCatalog:
    """Tables resolved through the catalog history, with the ``_catalog`` records for topics
    and writer schemas (and for every table the history does not hold)."""

    def __init__(self, log_: CatalogLog, history: CatalogHistory | None = None, *,
                 prefix: str = "pgcdc") -> None:
        self.log = log_
        self.history = history if history is not None else CatalogHistory()
        self._prefix = prefix
        self._lives = _lives(self.history)
        self._versions: dict[int, list[TableSpec]] = {}

    # --- what the _catalog records alone answer (CatalogLog's interface) -------------------

    def version(self, oid: int, version: str) -> TableSpec | None:
        return self.log.version(oid, version)

    def by_version(self, version: str) -> TableSpec | None:
        return self.log.by_version(version)

    def __len__(self) -> int:
        return len(self.log)

    # --- resolution -------------------------------------------------------------------------

    def knows(self, oid: int) -> bool:
        """The history holds this table (its DDL was captured)."""
        return oid in self._lives

    def versions(self, oid: int) -> list[TableSpec]:
        """Every version of a table, oldest first: the history's, each at the LSN where it
        took effect, and the ``_catalog`` records' that the history does not hold (a
        version the history has not published yet, or a table it never captured), each at
        its published LSN."""
        cached = self._versions.get(oid)
        if cached is not None:
            return list(cached)
        life = self._lives.get(oid)
        specs: list[TableSpec] = []
        if life is not None:
            for lsn, table in life.versions:
                if not specs or specs[-1].version != table.version:
                    specs.append(self._spec(table, lsn))
        held = {s.version for s in specs}
        specs += [s for s in self.log.versions(oid) if s.version not in held]
        specs.sort(key=lambda s: s.lsn)  # stable: the history's first at equal LSNs
        self._versions[oid] = specs
        return list(specs)

    def latest(self, oid: int) -> TableSpec:
        """The newest shape of a table: the lake table is brought to it."""
        versions = self.versions(oid)
        if not versions:
            msg = f"no table version of oid {oid} in the catalog history or the catalog log"
            raise KeyError(msg)
        return versions[-1]

    def resolve(self, oid: int, lsn: int) -> TableSpec | None:
        """The table as the history had it at ``lsn`` (a commit LSN), or None: not created
        yet, dropped by then, or never captured."""
        life = self._lives.get(oid)
        if life is None or lsn < life.born or life.dropped is not None and lsn >= life.dropped:
            return None
        table = self.history.table_at(oid, lsn)
        if table is None:
            return None
        found = next(lsn_ for lsn_, t in reversed(life.versions)
                     if t.version == table.version and lsn_ <= lsn)
        return self._spec(table, found)

    def born(self, oid: int) -> int | None:
        """Where a table's life began: its first version in the history, or its oldest
        ``_catalog`` record; None if neither knows it."""
        life = self._lives.get(oid)
        if life is not None:
            return life.born
        return self.log.born(oid)

    def dropped(self, oid: int) -> int | None:
        """The LSN of the table's drop, if the history holds one."""
        life = self._lives.get(oid)
        return None if life is None else life.dropped

    def drops(self) -> list[tuple[TableSpec, int]]:
        """Every dropped table the history holds (its last version) and its drop's LSN,
        of those ever in the publication: those the stream published, and those a lake load
        wrote (``pgcdc snapshot --lake``: a lake table the stream may never have sent an
        event of).  A table never published has no lake table (under a publication by
        table list, most of a database's tables)."""
        return [(self.latest(oid), life.dropped) for oid, life in sorted(self._lives.items())
                if life.dropped is not None
                and any(table.published for _, table in life.versions)]

    def tables(self) -> list[TableSpec]:
        """The newest version of every table the stream published and did not drop."""
        return self._not_dropped({s.oid for s in self.log.tables()})

    def known_tables(self) -> list[TableSpec]:
        """The newest version of every table the stream published or the history holds,
        not dropped: every table a lake table may exist for (a lake load writes tables the
        stream has not sent an event of), and some without one."""
        return self._not_dropped({s.oid for s in self.log.tables()} | set(self._lives))

    def _not_dropped(self, oids: set[int]) -> list[TableSpec]:
        return [self.latest(oid) for oid in sorted(oids) if self.dropped(oid) is None]

    def _spec(self, table: TableVersion, lsn: int) -> TableSpec:
        """A history version as a spec, at the history's LSN: its ``_catalog`` record where
        there is one (the same definition, plus the topic, the writer schema and what the
        stream's decoder added, such as a domain's base type; a version of the same content
        under another OID has the same ones), else the history's definition alone."""
        record = self.log.version(table.oid, table.version)
        if record is not None:
            return dataclasses.replace(record, lsn=lsn)
        twin = self.log.by_version(table.version)
        if twin is not None:  # the twin's definition under this OID (the same version)
            data = dict(twin.table.to_dict(), **{CATALOG_OID: table.oid})
            return dataclasses.replace(twin, table=table_from_dict(data, verify=False), lsn=lsn)
        return TableSpec(table, lsn, topic_name(self._prefix, table.schema, table.name))
