"""Caches of derived objects that a catalog generation invalidates (seed 000).

The catalog's ``generation`` (:attr:`snapshot_builder.history.CatalogHistory.generation`)
rises with every committed catalog change.  A process that keeps objects derived
from the catalog (row decoders, the type registry they are built from, which
table versions its sink has published) holds them in a :class:`GenerationCache`
and calls :meth:`GenerationCache.check` with the global generation at the start
of each batch: when the generation moved, every entry is dropped and built again
on its next use, from the catalog as it is now.  Between two checks the cache is
a plain dictionary; a check costs one integer comparison.

Across processes the global generation lives in shared memory
(:class:`SharedGeneration`, a ``multiprocessing`` value): the process that owns
the catalog publishes it, every worker reads it at the start of each batch.  A
transaction's own DDL invalidates at the change that made it
(:meth:`GenerationCache.invalidate`), without waiting for the commit.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from multiprocessing.context import BaseContext
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class GenerationCache(Generic[K, V]):
    """Objects built by ``build(key)``, valid for one catalog generation.

    ``generation`` is the generation the entries were built at (the seed's "local
    generation"); ``None`` before the first check, when the cache is empty anyway.
    """

    __slots__ = ("_build", "_entries", "generation", "purges")

    def __init__(self, build: Callable[[K], V]) -> None:
        self._build = build
        self._entries: dict[K, V] = {}
        self.generation: int | None = None
        self.purges = 0  # how many times entries were dropped (for tests and metrics)

    def check(self, generation: int) -> bool:
        """At the start of a batch: drop every entry if ``generation`` is not the cached one.

        Returns whether entries were dropped.  A generation lower than the cached one
        (a catalog history restored from an older file) invalidates as well: the
        entries were built from a catalog that is not the current one.
        """
        if generation == self.generation:
            return False
        self.generation = generation
        if not self._entries:
            return False
        self.invalidate()
        return True

    def invalidate(self) -> None:
        """Drop every entry now (a transaction's own DDL, or a caller that knows better)."""
        self._entries.clear()
        self.purges += 1

    def get(self, key: K) -> V:
        """The entry for ``key``, built on first use in this generation."""
        try:
            return self._entries[key]
        except KeyError:
            value = self._entries[key] = self._build(key)
            return value

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
