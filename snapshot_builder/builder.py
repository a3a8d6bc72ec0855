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

The state, the attach-time running transactions and the catalog version are
saved with the history (``builder.state`` beside the log, atomically) at every
state change and every compaction, so ``pgcdc status`` in another process reads
it, and a restart in FULL_SNAPSHOT resumes in FULL_SNAPSHOT.

``generation`` rises with every committed catalog change; caches of derived
objects (row decoders, Avro writers) compare it to drop stale entries.

Types are catalog objects too: a ``put_type`` / ``drop_type`` DDL message goes
through the same overlay and becomes a version at commit, whether or not a table
uses the type.

Compaction is driven by the slot: :meth:`SnapshotBuilder.compact_for_slot`
reads the slot's ``restart_lsn`` from the server (never the position pgcdc last
sent, which a crash may have kept from the server) and calls
:meth:`SnapshotBuilder.compact_below` with it; the version effective there and
every later one stay, and a :class:`RetentionPolicy` keeps more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Final, NamedTuple

import psycopg

from core.errors import TerminalError
from decoder.lsn import parse_lsn
from decoder.pgoutput import Relation, Type
from snapshot_builder.catalog import RelationCatalog, TableVersion
from snapshot_builder.datatype import TypeVersion
from snapshot_builder.ddl import (
    RewriteTable,
    TruncatedPartition,
    entered,
    parse_message,
    rows_rewritten,
    tables_using,
    values_changed,
)
from snapshot_builder.history import (
    Catalog,
    CatalogHistory,
    Change,
    DropType,
    Entry,
    PutTable,
    PutType,
    apply,
)

log = logging.getLogger(__name__)

# commit times are microseconds since 2000-01-01 UTC (PostgreSQL's epoch)
_PG_EPOCH: Final = 946_684_800


class BuilderState(Enum):
    START = "start"
    FULL_SNAPSHOT = "full_snapshot"
    CONSISTENT = "consistent"


class CatalogMismatchError(TerminalError):
    pass


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """What compaction keeps below the horizon, besides the version effective there.

    ``keep_versions``: at least this many of the newest versions; ``keep_bytes``:
    every version effective within this much WAL below the horizon; ``keep_seconds``:
    every version committed this recently; ``min_drop``: compact only when at least
    this many versions go (each compaction rewrites the snapshot).
    """

    keep_versions: int = 1000
    keep_bytes: int = 0
    keep_seconds: float = 0.0
    min_drop: int = 100

    def __post_init__(self) -> None:
        if min(self.keep_versions, self.keep_bytes, self.keep_seconds, self.min_drop) < 0:
            msg = (f"catalog retention must not be negative (keep_versions "
                   f"{self.keep_versions}, keep_bytes {self.keep_bytes}, keep_seconds "
                   f"{self.keep_seconds}, min_drop {self.min_drop}): use 0 to keep nothing more")
            raise ValueError(msg)


class Departure(NamedTuple):
    """A partition's rows left an ancestor unseen (:meth:`SnapshotBuilder.detach_partitions`)."""

    root: TableVersion  # the ancestor it left
    partition: TableVersion  # its new definition, or its last one if dropped
    how: str  # "detached", "dropped" or "truncated"


class SnapshotBuilder:
    def __init__(self, history: CatalogHistory | None = None, *,
                 publication: str | None = None) -> None:
        self.history = history or CatalogHistory()
        self.publication = publication  # captured tables as it publishes them (column lists)
        self.relations = RelationCatalog()
        self.state = BuilderState.START
        self.running_at_attach: frozenset[int] = frozenset()
        self.attach_xmax = 0  # the newest transaction running at attach (64-bit), if known
        self._overlay: dict[int, TableVersion | None] = {}
        self._type_overlay: dict[int, TypeVersion | None] = {}
        self._pending: list[Change] = []
        self._rewritten: dict[int, str] = {}  # table OID -> why its rows changed (see on_ddl)
        self._published: dict[int, bool] = {}  # table OID -> in the publication, as DDL said
        self._entered: set[int] = set()  # table OIDs the open transaction put into it
        self._retyped: list[TableVersion] = []  # tables given a version by a type's change
        # the same for every table described since pgcdc started (committed transactions)
        self._membership: dict[int, bool] = {}
        # partitions truncated alone: ancestor OID -> in the publication (None: unknown)
        self._truncated: dict[int, dict[int, bool | None]] = {}
        # counts the open transactions' catalog changes and their rollbacks: with the
        # generation, what a cache of derived objects checks (snapshot_builder/row_decoders.py)
        self.changes_in_transaction = 0
        self._view: Catalog | None = None  # set while replaying below the latest version
        self._last_compaction = float("-inf")

    @property
    def generation(self) -> int:
        return self.history.generation

    @property
    def catalog(self) -> Catalog:
        """The committed catalog the stream is at: the entry point for every lookup.

        The latest version, except while the slot sends again what came after the
        position a restart resumed from: then the version effective there."""
        return self._view if self._view is not None else self.history.latest

    # --- starting points ------------------------------------------------------------------

    def start_consistent(self, baseline: Sequence[Change], lsn: int) -> None:
        """A new slot: ``baseline`` is the catalog at its consistent point ``lsn``."""
        self._record(baseline, lsn, 0)
        self._set_state(BuilderState.CONSISTENT)

    def resume(self, lsn: int | None = None) -> None:
        """A restart with persisted history: the state saved at the last checkpoint
        (CONSISTENT, or FULL_SNAPSHOT with the transactions still to wait for).

        ``lsn``: where streaming starts (the slot's confirmed flush position, or the
        stored progress when crash recovery moved the slot behind it).  Transactions
        after it whose catalog changes were already persisted come again; they decode
        with the catalog as it was at their place, not with the latest."""
        if lsn is not None:
            self.replay_from(lsn)
        saved = self.history.file.load_state() if self.history.file is not None else None
        if saved is not None and saved.get("state") == BuilderState.FULL_SNAPSHOT.value \
                and saved.get("running_at_attach"):
            self.running_at_attach = frozenset(int(x) for x in saved["running_at_attach"])
            self.attach_xmax = int(saved.get("attach_xmax", 0))
            log.info("resuming in FULL_SNAPSHOT: waiting for %d transactions that were "
                     "running when pgcdc attached", len(self.running_at_attach))
            self._set_state(BuilderState.FULL_SNAPSHOT)
            return
        self._set_state(BuilderState.CONSISTENT)

    def replay_from(self, lsn: int) -> None:
        """The stream starts again at ``lsn`` (a restart, or a reconnect from the durable
        position): transactions after it whose catalog changes the history already holds
        come again, and decode with the catalog as it was at their place until the stream
        passes the latest version."""
        if lsn < self.history.latest.lsn:
            self._view = self.history.catalog_at(lsn)  # an error if compacted past it
            log.info("streaming from %X/%X, below catalog version %d: catalog version %d "
                     "until the stream catches up", lsn >> 32, lsn & 0xFFFFFFFF,
                     self.history.latest.version, self._view.version)

    def attach(self, baseline: Sequence[Change], lsn: int, running: frozenset[int], *,
               xmax: int = 0) -> None:
        """An existing slot without history: current catalog plus the running transactions."""
        self._record(baseline, lsn, 0)
        self.running_at_attach = running
        self.attach_xmax = xmax or max(running, default=0)
        self._set_state(BuilderState.FULL_SNAPSHOT if running else BuilderState.CONSISTENT)

    def running_finished(self) -> None:
        if self.state is BuilderState.FULL_SNAPSHOT:
            log.info("every transaction running at attach has finished: catalog consistent")
            self.running_at_attach = frozenset()
            self._set_state(BuilderState.CONSISTENT)

    def _record(self, baseline: Sequence[Change], lsn: int, commit_time: int) -> None:
        for change in baseline:
            latest = self.history.latest
            if isinstance(change, PutTable):
                same = latest.table(change.table.oid) == change.table
            elif isinstance(change, PutType):
                same = latest.types.get(change.type.oid) == change.type
            else:
                same = False
            if not same:
                self.history.append(change, lsn=max(lsn, latest.lsn), commit_time=commit_time)

    def _set_state(self, state: BuilderState) -> None:
        self.state = state
        self.checkpoint()

    def checkpoint(self) -> None:
        """Save the builder's state with the history (atomically; read by ``pgcdc status``
        and by :meth:`resume`)."""
        file = self.history.file
        if file is None:
            return
        latest = self.history.latest
        file.save_state({
            "state": self.state.value,
            "running_at_attach": sorted(self.running_at_attach),
            "attach_xmax": self.attach_xmax,
            "catalog_version": latest.version,
            "catalog_lsn": latest.lsn,
            "generation": self.generation,
            "saved_at": time.time(),
        })

    # --- compaction -----------------------------------------------------------------------

    def compact_below(self, horizon_lsn: int, policy: RetentionPolicy | None = None, *,
                      now: float | None = None) -> int:
        """Compact the history below ``horizon_lsn``, the oldest LSN anything may still
        need: at most the slot's ``restart_lsn`` as the server reports it (what
        :meth:`compact_for_slot` passes); every retained event and every transaction the
        slot may send again commits after it.  The version effective at the horizon and
        every later one stay, and so does what ``policy`` retains; returns how many
        versions were dropped (0 when fewer than ``policy.min_drop`` would go).  Never
        before the builder started."""
        policy = policy or RetentionPolicy()
        history = self.history
        if self.state is BuilderState.START or horizon_lsn <= history.base.lsn:
            return 0
        cut = horizon_lsn - policy.keep_bytes
        latest = history.latest.version
        if policy.keep_versions:
            oldest_kept = max(history.base.version, latest - policy.keep_versions + 1)
            cut = min(cut, history.catalog(oldest_kept).lsn)
        if policy.keep_seconds:
            now = time.time() if now is None else now
            since = int((now - _PG_EPOCH - policy.keep_seconds) * 1_000_000)
            recent = next((e.lsn for e in history.entries() if e.commit_time >= since), None)
            if recent is not None:
                cut = min(cut, recent)
        if cut <= history.base.lsn:
            return 0
        keep = history.catalog_at(cut).version
        if keep - history.base.version < max(1, policy.min_drop):
            return 0
        dropped = history.compact(cut)
        log.info("catalog history compacted: %d versions below LSN %X/%X dropped, versions "
                 "%d to %d kept", dropped, cut >> 32, cut & 0xFFFFFFFF, history.base.version,
                 latest)
        self.checkpoint()
        return dropped

    def compact_for_slot(self, connection: Callable[[], psycopg.Connection[Any]], slot: str,
                         policy: RetentionPolicy | None = None, *, stored_lsn: int = -1,
                         every: float = 60.0) -> int:
        """:meth:`compact_below` the slot's ``restart_lsn`` as the server reports it (and
        ``stored_lsn``, the stored progress, if lower), at most every ``every`` seconds
        (call it at every status update).

        The server's value, not the position pgcdc last sent: a status update lost in a
        crash leaves the slot behind it, and the slot replays from where it really is.
        ``connection`` returns a normal (not replication) connection.  A failed sample
        skips this compaction (logged); it never stops streaming."""
        now = time.monotonic()
        if now - self._last_compaction < every:
            return 0
        self._last_compaction = now
        try:
            row = connection().execute(
                "SELECT restart_lsn::text, confirmed_flush_lsn::text FROM pg_replication_slots "
                "WHERE slot_name = %s", (slot,)).fetchone()
        except psycopg.OperationalError as exc:
            log.warning("cannot read the position of slot %s to compact the catalog history: "
                        "%s", slot, exc)
            return 0
        if row is None or row[0] is None or row[1] is None:
            return 0  # no slot, or an invalidated one: keep everything
        horizon = min(parse_lsn(str(row[0])), parse_lsn(str(row[1])))
        if stored_lsn >= 0:
            horizon = min(horizon, stored_lsn)
        return self.compact_below(horizon, policy)

    # --- the stream -----------------------------------------------------------------------

    def table(self, oid: int) -> TableVersion | None:
        """The definition that decodes the next change of ``oid`` in the open transaction."""
        if oid in self._overlay:
            return self._overlay[oid]
        captured = self.catalog.table(oid)
        return captured if captured is not None else self.relations.table(oid)

    def type(self, oid: int) -> TypeVersion | None:
        """The type ``oid`` as the open transaction sees it (captured, or built in)."""
        if oid in self._type_overlay:
            return self._type_overlay[oid]
        return self.catalog.type(oid)

    def on_type(self, message: Type) -> None:
        self.relations.observe_type(message)

    def on_relation(self, message: Relation, *, xid: int | None = None,
                    prepared: bool = False) -> TableVersion:
        """The table version a Relation message announces, checked against captured DDL.

        ``prepared``: a Relation inside a prepared transaction, at its PREPARE.  The
        transaction's own DDL comes with it at COMMIT PREPARED (and the Relation again,
        checked then), so a table it changed is as the catalog has it until then."""
        described, _ = self.relations.observe(message)
        captured = self._overlay.get(message.oid) if message.oid in self._overlay \
            else self.catalog.table(message.oid)
        if captured is None:
            return described
        if not captured.same_layout(described):
            if prepared:
                log.debug("a prepared transaction describes %s with its own DDL: the "
                          "catalog's definition until it commits", described.qualified_name)
                return captured
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
        """A captured DDL message inside the open transaction; returns a table's new
        definition (None for a dropped table and for type changes)."""
        change = parse_message(content, self.publication)
        current = self.catalog
        if isinstance(change, RewriteTable):
            self._rewritten.setdefault(change.oid, change.reason)
            # PostgreSQL rewrites a partitioned table's partitions, never the table itself
            # (it has no storage): a publication that publishes via the root (the only one
            # that publishes an ancestor) has the root read again (``rewritten`` keeps
            # the published ones)
            table = self.table(change.oid)
            if table is not None and table.partition_parent is not None:
                why = f"its partition {table.qualified_name} rewritten ({change.reason})"
                for ancestor in self._ancestors(table.partition_parent):
                    self._rewritten.setdefault(ancestor, why)
            return None
        if isinstance(change, TruncatedPartition):
            self._truncated[change.oid] = change.ancestors
            return None
        self.changes_in_transaction += 1
        if isinstance(change, PutTable):
            oid = change.table.oid
            previous = self._overlay.get(oid, current.table(oid))
            if previous is not None and previous.types is not None \
                    and change.table.types is None:  # its types' changes stay in its version
                change = PutTable(replace(change.table, types=previous.types))
            reason = rows_rewritten(previous, change.table)
            if reason is not None:
                self._rewritten.setdefault(oid, reason)
            parent = change.table.partition_parent
            if previous is not None and parent is not None \
                    and previous.partition_parent != parent:
                # ATTACH PARTITION (maybe just detached from another parent in the same
                # transaction): the table's rows join its ancestors' with no row change in
                # the WAL; a publication that publishes via the root (the only one that
                # publishes an ancestor) has them read again (``rewritten`` keeps those)
                why = f"{change.table.qualified_name} attached as a partition with its rows"
                for ancestor in self._ancestors(parent):
                    self._rewritten.setdefault(ancestor, why)
            self._published[oid] = change.table.published
            if entered(content, self.publication) or previous is not None \
                    and not previous.published and change.table.published:
                # added to the publication, or back in it (detached from a root that is
                # published via the root): rows it never sent as its own
                self._entered.add(oid)
            self._overlay[oid] = change.table
            self._pending.append(change)
            return change.table
        if isinstance(change, PutType):
            oid = change.type.oid
            reason = values_changed(self._type_overlay.get(oid, current.types.get(oid)),
                                    change.type)
            self._type_overlay[oid] = change.type
            if reason is not None:
                tables = {**current.tables, **self._overlay}
                for table in tables_using([t for t in tables.values() if t is not None],
                                          {**current.types, **self._type_overlay}, oid):
                    self._rewritten.setdefault(table.oid, reason)
                    # a new version of each table holding it: its values read differently
                    # (a typed Avro schema names a composite's attributes)
                    bumped = table.retyped(oid, change.type.version)
                    self._overlay[table.oid] = bumped
                    self._pending.append(PutTable(bumped))
                    self._retyped.append(bumped)
            self._pending.append(change)
            return None
        if isinstance(change, DropType):
            if self._type_overlay.get(change.oid, current.types.get(change.oid)) is not None:
                self._type_overlay[change.oid] = None
                self._pending.append(change)
            return None  # else never captured (a table's row type, say): no version
        if self._overlay.get(change.oid, current.table(change.oid)) is not None:
            self._overlay[change.oid] = None
            self._pending.append(change)
        return None

    def commit(self, commit_lsn: int, commit_time: int) -> None:
        """The open transaction committed: its DDL becomes global versions (persisted).

        Only changes that change something become versions (the trigger repeats a table
        for its index, an array type with its element; ``ADD COLUMN IF NOT EXISTS`` of a
        column that exists changes nothing).  A transaction the slot sends again after a
        restart (its versions were persisted, the crash came before the flush) finds them
        recorded: nothing is appended twice, and what a crash between two appends left
        out is appended now (:meth:`_not_recorded`)."""
        if self._pending:
            history = self.history
            if commit_lsn < history.latest.lsn or history.entries_at(commit_lsn):
                changes = self._not_recorded(commit_lsn)  # sent again after a restart
            else:
                changes = _effective(self._pending, history.latest)
            for change in changes:
                history.append(change, lsn=commit_lsn, commit_time=commit_time)
        self._membership.update(self._published)
        if self._view is not None:  # replaying: the stream is now at commit_lsn
            caught_up = commit_lsn >= self.history.latest.lsn
            self._view = None if caught_up else self.history.catalog_at(commit_lsn)
        self.rollback()

    def _not_recorded(self, commit_lsn: int) -> list[Change]:
        """The open transaction's changes the history lacks, for a transaction at or
        below the latest version (sent again after a restart).

        A transaction without a version there must leave the catalog as it was at its
        place: its changes are all no-ops there (a repeated definition, ``ADD COLUMN IF
        NOT EXISTS`` of a column that exists), so it made no version and needs none.
        Otherwise, applied to the catalog as it
        was before it, it must give the catalog the history holds at ``commit_lsn`` (only
        that one counts: versions at one LSN are never looked up in between, so entries
        that differ only by no-ops, as an older pgcdc wrote them, are the same), or one on
        the way to it when a crash came between two appends: then the rest is returned.
        Anything else is a history this slot's stream did not write."""
        history = self.history
        recorded = history.entries_at(commit_lsn)
        if not recorded:  # later versions exist: it made none, or the history is not ours
            there = history.catalog_at(commit_lsn)
            changes = _effective(self._pending, there)
            if changes and not _alike(_applied(changes, there, commit_lsn), there):
                raise CatalogMismatchError(self._mismatch(commit_lsn, recorded, changes))
            return []
        before = history.catalog(recorded[0].version - 1)
        done = history.catalog(recorded[-1].version)
        changes = _effective(self._pending, before)
        for count in range(len(changes), -1, -1):
            if _alike(_applied(changes[:count], before, commit_lsn), done):
                if count == len(changes):
                    return []
                if commit_lsn < history.latest.lsn:
                    break  # later versions exist: this was no crash between two appends
                log.info("transaction committed at %X/%X sent again: %d of its %d catalog "
                         "changes recorded before a crash, the rest now", commit_lsn >> 32,
                         commit_lsn & 0xFFFFFFFF, count, len(changes))
                return changes[count:]
        raise CatalogMismatchError(self._mismatch(commit_lsn, recorded, changes))

    def _mismatch(self, commit_lsn: int, recorded: list[Entry], changes: list[Change]) -> str:
        """What a transaction sent again changes and what the history holds at its LSN."""
        latest = self.history.latest
        held = (f"records {len(recorded)} change(s) there that make a different catalog "
                f"({'; '.join(_described(e.change) for e in recorded)})" if recorded else
                "has no version at that LSN")
        folder = self.history.file.directory if self.history.file is not None else None
        return (f"the transaction committed at LSN {commit_lsn >> 32:X}/"
                f"{commit_lsn & 0xFFFFFFFF:X} changes the catalog as it was there "
                f"({'; '.join(_described(c) for c in changes)}), but the catalog history "
                f"{held}, though it holds versions up to {latest.version} at LSN "
                f"{latest.lsn >> 32:X}/{latest.lsn & 0xFFFFFFFF:X}: this history was not "
                "written from this slot's stream (the slot was dropped and created again "
                "under its name, or the catalog folder was copied or edited), or by a "
                "pgcdc that recorded such a change differently; remove the catalog folder"
                f"{f' {folder}' if folder is not None else ''} so that pgcdc reads the "
                "catalog afresh, and re-snapshot the tables named here")

    def _ancestors(self, oid: int) -> list[int]:
        """``oid`` and the partitioned tables above it, the open transaction's view."""
        chain = []
        while oid not in chain:
            chain.append(oid)
            table = self.table(oid)
            if table is None or table.partition_parent is None:
                break
            oid = table.partition_parent
        return chain

    def detach_partitions(self) -> list[Departure]:
        """Each partition whose rows the open transaction took out of a partitioned table,
        with each ancestor they left (a detached partition's new definition, without a
        parent, added to the transaction's changes).  They left with no row change in the
        WAL: a publication that publishes via the root (the only one that publishes an
        ancestor) has the root read again whole, and a detached partition read again.

        A partition's rows left its parent when it was detached (the trigger described
        it under another parent, or described the parent and not it: it describes a
        partitioned table's partitions after it), dropped, or truncated alone (its
        truncate trigger says so, with which ancestors are published).  Ancestors the
        trigger said (in this transaction or an earlier one since pgcdc started) are not
        in the publication are left out; one it never described is kept (a request for a
        table outside the publication ends quietly).  Call once, just before
        :meth:`commit`."""
        out = []
        for oid, table in self.catalog.tables.items():
            parent = table.partition_parent
            if parent is None:
                continue
            if oid in self._overlay:
                now = self._overlay[oid]
                if now is not None and now.partition_parent == parent:
                    continue  # still its partition
            elif self._overlay.get(parent) is None:
                continue  # its parent not described (or dropped with it)
            else:  # the parent's description left it out; published on its own, as far
                # as the stream can tell (it is read again: a read of a table the
                # publication leaves out ends at once, and the lake holds nothing of it)
                now = replace(table, partition_parent=None, published=True)
                self._overlay[oid] = now
                self._pending.append(PutTable(now))
            for ancestor in self._ancestors(parent):
                root = self.table(ancestor)
                published = self._published.get(ancestor, self._membership.get(ancestor))
                if root is not None and published is not False:
                    out.append(Departure(root, now or table,
                                         "detached" if now is not None else "dropped"))
        for oid, ancestors in self._truncated.items():
            truncated = self.table(oid)
            for ancestor, published in ancestors.items():
                root = self.table(ancestor)
                if truncated is not None and root is not None and published is not False:
                    out.append(Departure(root, truncated, "truncated"))
        return out

    @property
    def rewritten(self) -> dict[int, str]:
        """The published tables whose stored rows the open transaction's DDL changed
        without row changes in the WAL (:func:`snapshot_builder.ddl.rows_rewritten`), with
        why."""
        return {oid: reason for oid, reason in self._rewritten.items()
                if self._published.get(oid, True)}

    def take_retyped(self) -> list[TableVersion]:
        """The tables the last DDL messages gave a new version through a change of a type
        they hold (a composite's attributes, an enum label renamed), once each."""
        retyped, self._retyped = self._retyped, []
        return retyped

    @property
    def entered(self) -> set[int]:
        """The tables the open transaction's DDL put into the publication (added to it,
        their column list changed, or back in it): their rows were never sent as theirs,
        and a lake table they left behind may hold rows deleted since."""
        return {oid for oid in self._entered if self._published.get(oid, True)}

    def rollback(self) -> None:
        """Forget the open transaction's DDL (a reconnect resends the transaction)."""
        self._rewritten.clear()
        self._truncated.clear()
        self._published.clear()
        self._entered.clear()
        self._retyped.clear()
        if self._pending or self._overlay or self._type_overlay:
            self.changes_in_transaction += 1
            self._pending.clear()
            self._overlay.clear()
            self._type_overlay.clear()


def _effective(changes: list[Change], catalog: Catalog) -> list[Change]:
    """The changes that change something, applied one after the other to ``catalog``."""
    out: list[Change] = []
    for change in changes:
        after = apply(change, catalog, catalog.lsn)
        if not _same(after, catalog):
            out.append(change)
            catalog = after
    return out


def _applied(changes: list[Change], catalog: Catalog, lsn: int) -> Catalog:
    for change in changes:
        catalog = apply(change, catalog, lsn)
    return catalog


def _same(one: Catalog, other: Catalog) -> bool:
    """The same tables and types (whatever their version numbers and LSNs)."""
    return (one.tables, one.types) == (other.tables, other.types)


def _alike(one: Catalog, other: Catalog) -> bool:
    """:func:`_same`, whatever a table's publication membership and type changes say: a
    pgcdc from before they were recorded wrote the same transaction without them."""
    return one.types == other.types and _plain(one) == _plain(other)


def _plain(catalog: Catalog) -> dict[int, TableVersion]:
    return {oid: table if table.published and table.types is None
            else replace(table, published=True, types=None)
            for oid, table in catalog.tables.items()}


def _described(change: Change) -> str:
    """One catalog change, for a message."""
    if isinstance(change, PutTable):
        table = change.table
        return (f"table {table.qualified_name} (oid {table.oid}) with columns "
                f"{', '.join(c.name for c in table.columns)}")
    if isinstance(change, PutType):
        return f"type {change.type.qualified_name} (oid {change.type.oid})"
    if isinstance(change, DropType):
        return f"type oid {change.oid} dropped"
    return f"table oid {change.oid} dropped"
