"""The generation counter (seed 000): caches of derived objects that a catalog change invalidates.

The catalog's ``generation`` (:attr:`snapshot_builder.history.CatalogHistory.generation`)
rises with every committed catalog change.  A process that keeps objects derived
from the catalog (row decoders, the type registry they are built from, which
table versions its sink has published) holds them in a :class:`GenerationCache`
and calls :meth:`GenerationCache.check` with the global generation at the start
of each batch: when the generation moved, every entry is dropped and built again
on its next use, from the catalog as it is now.  Between two checks the cache is
a plain dictionary; a check costs one integer comparison.

A transaction's own DDL invalidates at the change that made it, without waiting
for the commit: the check takes the count of the open transaction's catalog
changes too (the seed's per-command bump), or the owner calls
:meth:`GenerationCache.invalidate` (a type registry, when it learns a type).

Across processes the global generation lives in shared memory
(:class:`SharedGeneration`, a ``multiprocessing`` value): the process that owns
the catalog publishes it, every worker reads it at the start of each batch.

Every cache of derived objects in pgcdc is one of these: the row decoders of the stream,
the load workers and the incremental snapshots
(:class:`snapshot_builder.row_decoders.RowDecoderFactory`), and the text and binary
decoders a :class:`~decoder.type_registry.TypeRegistry` builds from its types.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from multiprocessing.context import BaseContext
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class GenerationCache(Generic[K, V]):
    """Objects built by ``build(key)``, valid for one catalog generation.

    ``generation`` is the generation the entries were built at (the seed's "local
    generation"), ``changes`` the count of the open transaction's catalog changes then;
    ``None`` before the first check, when the cache is empty anyway.
    """

    __slots__ = ("_build", "_entries", "generation", "changes", "purges")

    def __init__(self, build: Callable[[K], V]) -> None:
        self._build = build
        self._entries: dict[K, V] = {}
        self.generation: int | None = None
        self.changes = 0
        self.purges = 0  # how many times entries were dropped (for tests and metrics)

    def check(self, generation: int, changes: int = 0) -> bool:
        """At the start of a batch, and after a catalog change of the open transaction:
        drop every entry if ``generation`` or ``changes`` is not the cached one.

        ``changes`` counts the open transaction's catalog changes (and their rollbacks),
        so that its own DDL invalidates at the change that made it.  Returns whether
        entries were dropped.  A generation lower than the cached one (a catalog history
        restored from an older file) invalidates as well: the entries were built from a
        catalog that is not the current one.
        """
        if generation == self.generation and changes == self.changes:
            return False
        self.generation, self.changes = generation, changes
        if not self._entries:
            return False
        self.invalidate()
        return True

    def invalidate(self) -> None:
        """Drop every entry now (what they were built from changed, and the owner knows)."""
        if self._entries:
            self._entries.clear()
            self.purges += 1

    def discard(self, key: K) -> None:
        """Drop the entry of ``key`` alone (what it is built from was replaced)."""
        self._entries.pop(key, None)

    def get(self, key: K) -> V:
        """The entry for ``key``, built on first use in this generation."""
        try:
            return self._entries[key]
        except KeyError:
            value = self._entries[key] = self._build(key)
            return value

    @property
    def entries(self) -> Mapping[K, V]:
        """The entries built so far, read-only: the same mapping for the cache's life (a
        caller on a hot path may keep it and look an entry up without a call)."""
        return self._entries

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)


class SharedGeneration:
    """The global generation in shared memory: one writer, any number of reading processes.

    Picklable to a ``multiprocessing`` child of the same context (passed as a process
    argument); a read or a write of the 64-bit value takes its lock.
    """

    __slots__ = ("_value",)

    def __init__(self, context: BaseContext, generation: int = 0) -> None:
        self._value: Any = context.Value("q", generation)

    @property
    def value(self) -> int:
        with self._value.get_lock():
            return int(self._value.value)

    def bump_to(self, generation: int) -> None:
        """Publish ``generation`` (the catalog's, after a committed change)."""
        with self._value.get_lock():
            self._value.value = generation

    def __getstate__(self) -> object:
        return self._value

    def __setstate__(self, state: object) -> None:
        self._value = state
