"""GenerationCache and SharedGeneration: entries live for one catalog generation, in every
process that reads the shared counter."""

from __future__ import annotations

import multiprocessing
from typing import Any

from decoder.generation import GenerationCache, SharedGeneration


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


def test_a_change_of_the_open_transaction_invalidates_and_its_end_too() -> None:
    """The seed's per-command bump: the open transaction's own DDL (``changes``) drops the
    entries at the change that made it, before its commit moves the generation."""
    cache, built = _counting()
    cache.check(5, 0)
    first = cache.get("a")
    assert not cache.check(5, 0) and cache.get("a") is first  # unchanged: reused
    assert cache.check(5, 1) and "a" not in cache  # the transaction's ALTER
    in_transaction = cache.get("a")
    assert not cache.check(5, 1) and cache.get("a") is in_transaction
    assert cache.check(6, 0)  # its commit: a new generation, no open change
    assert cache.get("a") not in (first, in_transaction) and built == ["a"] * 3
    assert cache.purges == 2 and (cache.generation, cache.changes) == (6, 0)


def test_discard_drops_one_entry_and_entries_is_the_live_view() -> None:
    cache, built = _counting()
    cache.check(1)
    entries = cache.entries
    a, b = cache.get("a"), cache.get("b")
    assert dict(entries) == {"a": a, "b": b}
    cache.discard("a")
    cache.discard("missing")  # nothing to drop: no error
    assert "a" not in cache and cache.get("b") is b and cache.purges == 0
    cache.check(2)
    assert cache.entries is entries and len(entries) == 0  # same mapping, emptied


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


def test_a_type_registered_later_drops_what_the_registry_built() -> None:
    """The type registry's text decoders and the binary decoders built from it are caches of
    its own (TypeRegistry.derived): a registration drops them, as a new type may complete
    one built before it."""
    from decoder.binary import BinaryDecoders
    from decoder.type_registry import TypeRegistry
    from decoder.values import INT4

    registry = TypeRegistry()
    binary = BinaryDecoders(registry)
    registry.register_array(60_001, 60_000, name="public._score")
    assert registry.decoder_for(60_001)("{1,2}") == ["1", "2"]  # the element is unknown
    assert not binary.supports(60_001)
    registry.register_domain(60_000, INT4, name="public.score")
    assert registry.decoder_for(60_001)("{1,2}") == [1, 2]
    assert binary.supports(60_001)
    decode = registry.decoder_for(60_001)
    assert registry.decoder_for(60_001) is decode  # built once while no type is registered
