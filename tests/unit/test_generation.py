"""GenerationCache and SharedGeneration: entries live for one catalog generation, in every
process that reads the shared counter."""

from __future__ import annotations

import multiprocessing
from typing import Any

from snapshot_builder.generation import GenerationCache, SharedGeneration


def _counting() -> tuple[GenerationCache[str, tuple[str, int]], list[str]]:
    built: list[str] = []

    def build(key: str) -> tuple[str, int]:
        built.append(key)
        return key, len(built)

    return GenerationCache(build), built


def test_entries_are_built_once_per_generation() -> None:
    cache, built = _counting()
    assert not cache.check(3)  # nothing cached: nothing dropped
    first = cache.get("a")
    assert cache.get("a") is first and built == ["a"]
    assert not cache.check(3)  # same generation: kept
    assert cache.get("a") is first and "a" in cache and len(cache) == 1
    assert cache.check(4)  # a committed catalog change: every entry is stale
    assert "a" not in cache and len(cache) == 0 and cache.purges == 1
    second = cache.get("a")
    assert second != first and built == ["a", "a"] and cache.generation == 4


def test_an_older_generation_invalidates_too() -> None:
    cache, built = _counting()
    cache.check(7)
    cache.get("x")
    assert cache.check(6) and len(cache) == 0 and cache.generation == 6


def test_invalidate_drops_at_once_without_a_new_generation() -> None:
    cache, built = _counting()
    cache.check(1)
    cache.get("t")
    cache.get("u")
    cache.invalidate()  # a transaction's own DDL
    assert len(cache) == 0 and cache.generation == 1
    cache.get("t")
    assert built == ["t", "u", "t"]


def _worker(shared: SharedGeneration, ask: Any, answer: Any) -> None:
    """A process with a cache: at each "batch" it checks the shared generation."""
    cache: GenerationCache[int, int] = GenerationCache(lambda key: key * 10)
    while (request := ask.get()) is not None:
        dropped = cache.check(shared.value)
        answer.put((shared.value, dropped, cache.get(request), cache.purges))


def test_a_worker_process_sees_the_shared_generation() -> None:
    context = multiprocessing.get_context("spawn")
    shared = SharedGeneration(context, 5)
    ask, answer = context.Queue(), context.Queue()
    process = context.Process(target=_worker, args=(shared, ask, answer), daemon=True)
    process.start()
    try:
        ask.put(1)
        assert answer.get(timeout=60) == (5, False, 10, 0)
        ask.put(1)
        assert answer.get(timeout=60) == (5, False, 10, 0)  # cached, same generation
        shared.bump_to(6)
        assert shared.value == 6
        ask.put(2)
        assert answer.get(timeout=60) == (6, True, 20, 1)  # the worker dropped its entries
    finally:
        ask.put(None)
        process.join(30)
    assert process.exitcode == 0
