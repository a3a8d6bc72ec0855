"""pgcdc/memory.py: the memory figures a long run reports, and giving freed heap back."""

from __future__ import annotations

import ctypes

import pytest

from pgcdc import memory


def test_python_blocks_follow_python_allocations() -> None:
    before = memory.stats()["python_blocks"]
    held = [object() for _ in range(50_000)]
    assert memory.stats()["python_blocks"] >= before + 40_000
    del held


@pytest.mark.skipif(memory._LIBC is None, reason="glibc's mallinfo2 is needed (glibc >= 2.33)")
def test_heap_in_use_and_free_and_trim() -> None:
    libc = memory._LIBC
    assert libc is not None
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = memory.stats()
    blocks = [libc.malloc(4096) for _ in range(4096)]  # 16 MiB in small blocks (not mmap)
    during = memory.stats()
    assert during["heap_in_use_bytes"] >= before["heap_in_use_bytes"] + 15 * 2**20
    for block in blocks:
        libc.free(block)
    after = memory.stats()
    assert after["heap_in_use_bytes"] <= during["heap_in_use_bytes"] - 15 * 2**20
    memory.trim()
    assert memory.stats()["heap_free_bytes"] <= after["heap_free_bytes"]


def test_trimmer_waits_for_its_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def trim() -> bool:
        calls.append(1)
        return True

    monkeypatch.setattr(memory, "trim", trim)
    trimmer = memory.Trimmer(60)
    start = trimmer._last
    trimmer.tick(start + 30)
    assert calls == []
    trimmer.tick(start + 61)
    trimmer.tick(start + 62)
    assert calls == [1]
    memory.Trimmer(0).tick(start + 10_000)
    assert calls == [1]
