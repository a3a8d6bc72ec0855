"""The snapshot builder: which definition decodes each change, and the catalog's history.

Two sources describe tables.  Captured DDL (snapshot_builder/ddl.py) arrives
as transactional ``pgcdc.ddl`` messages at the exact place of the DDL and gives
the full definition; pgoutput's Relation messages give the columns, types and
key as the stream sees them.  When a table's definition was captured, it is the
one events carry, and every Relation message must agree with it (columns,
types, order, key, replica identity): a mismatch is an error, never a guess.
Tables never captured are described by their Relation messages alone.

Within a transaction, a DDL message changes the definition for the changes
after it (a per-transaction overlay, the PostgreSQL snapshot builder's
"mixed DDL/DML" case); at commit the transaction's changes become new global
versions in the :class:`CatalogHistory`, keyed by the commit LSN and persisted
before the commit is handed to the sink.  pgcdc only ever replays committed
transactions (streamed and prepared ones are kept until their commit, and
rolled-back subtransactions are skipped), so an aborted DDL never gets here.

States, as in PostgreSQL's snapshot builder:

* ``START``: nothing known yet;
* ``FULL_SNAPSHOT``: attached to a slot without usable history; the baseline is
  the current catalog, and the transactions running at that moment may have
  changed it before committing: their changes are decoded with what the stream
  proves (Relation messages) until every one of them has finished;
* ``CONSISTENT``: the history is exact from here on (a new slot whose baseline
  was read at its consistent point, or a restart with persisted history).

``generation`` rises with every committed catalog change; caches of derived
objects (row decoders, Avro writers) compare it to drop stale entries.
"""

from __future__ import annotations

import logging
from enum import Enum

from decoder.pgoutput import Relation, Type
from pgcdc.errors import TerminalError
from snapshot_builder.catalog import RelationCatalog, TableVersion
from snapshot_builder.ddl import parse_message
from snapshot_builder.history import CatalogHistory, DropTable, PutTable

log = logging.getLogger(__name__)


class BuilderState(Enum):
    START = "start"
    FULL_SNAPSHOT = "full_snapshot"
    CONSISTENT = "consistent"


class CatalogMismatchError(TerminalError):
    pass


class SnapshotBuilder:
    def __init__(self, history: CatalogHistory | None = None) -> None:
        self.history = history or CatalogHistory()
        self.relations = RelationCatalog()
        self.state = BuilderState.START
        self.running_at_attach: frozenset[int] = frozenset()
        self._overlay: dict[int, TableVersion | None] = {}
        self._pending: list[PutTable | DropTable] = []

    @property
    def generation(self) -> int:
        return self.history.generation

    # --- starting points ------------------------------------------------------------------

    def start_consistent(self, baseline: list[PutTable], lsn: int) -> None:
        """A new slot: ``baseline`` is the catalog at its consistent point ``lsn``."""
        self._record(baseline, lsn, 0)
        self.state = BuilderState.CONSISTENT

    def resume(self) -> None:
        """A restart with persisted history: exact from where it left off."""
        self.state = BuilderState.CONSISTENT

    def attach(self, baseline: list[PutTable], lsn: int, running: frozenset[int]) -> None:
        """An existing slot without history: current catalog plus the running transactions."""
        self._record(baseline, lsn, 0)
        self.running_at_attach = running
        self.state = BuilderState.FULL_SNAPSHOT if running else BuilderState.CONSISTENT

    def running_finished(self) -> None:
        if self.state is BuilderState.FULL_SNAPSHOT:
            log.info("every transaction running at attach has finished: catalog consistent")
            self.state = BuilderState.CONSISTENT
            self.running_at_attach = frozenset()

    def _record(self, baseline: list[PutTable], lsn: int, commit_time: int) -> None:
        latest = self.history.latest
        for change in baseline:
            if latest.table(change.table.oid) != change.table:
                latest = self.history.append(change, lsn=max(lsn, latest.lsn),
                                             commit_time=commit_time)

    # --- the stream -----------------------------------------------------------------------

    def table(self, oid: int) -> TableVersion | None:
        """The definition that decodes the next change of ``oid`` in the open transaction."""
        if oid in self._overlay:
            return self._overlay[oid]
        captured = self.history.latest.table(oid)
        return captured if captured is not None else self.relations.table(oid)

    def on_type(self, message: Type) -> None:
        self.relations.observe_type(message)

    def on_relation(self, message: Relation, *, xid: int | None = None) -> TableVersion:
        """The table version a Relation message announces, checked against captured DDL."""
        described, _ = self.relations.observe(message)
        captured = self._overlay.get(message.oid) if message.oid in self._overlay \
            else self.history.latest.table(message.oid)
        if captured is None:
            return described
        if not captured.same_layout(described):
            if self.state is BuilderState.FULL_SNAPSHOT and xid in self.running_at_attach:
                log.warning("transaction %s started before pgcdc attached; decoding %s with "
                            "the definition the stream gives", xid, described.qualified_name)
                return described
            msg = (f"the stream describes {described.qualified_name} (oid {message.oid}) as "
                   f"{[(c.name, c.type_oid, c.typmod) for c in described.columns]} but the "
                   f"captured definition is "
                   f"{[(c.name, c.type_oid, c.typmod) for c in captured.columns]}: DDL happened "
                   "without the pgcdc event trigger; reinstall it and re-snapshot the table")
            raise CatalogMismatchError(msg)
        return captured

    def on_ddl(self, content: bytes) -> TableVersion | None:
        """A captured DDL message inside the open transaction; returns a new definition."""
        change = parse_message(content)
        self._pending.append(change)
        if isinstance(change, PutTable):
            self._overlay[change.table.oid] = change.table
            return change.table
        self._overlay[change.oid] = None
        return None

    def commit(self, commit_lsn: int, commit_time: int) -> None:
        """The open transaction committed: its DDL becomes global versions (persisted)."""
        for change in self._pending:
            self.history.append(change, lsn=commit_lsn, commit_time=commit_time)
        self.rollback()

    def rollback(self) -> None:
        """Forget the open transaction's DDL (a reconnect resends the transaction)."""
        self._pending.clear()
        self._overlay.clear()
