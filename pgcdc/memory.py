"""What a long-running pgcdc holds in memory, and giving freed memory back.

A service that runs for weeks must show a flat memory trend.  The resident set alone
cannot tell a leak from an allocator that keeps freed memory: after a Kafka outage,
librdkafka's queue of undelivered messages (malloc'd by its threads, in glibc's
per-thread arenas) is freed once delivered, but glibc returns an arena's free pages to
the system only when the top of the heap is free.  So pgcdc reports three figures, as
metrics and to ``bench/soak.py``:

* ``python_blocks``: memory blocks the Python allocator holds (``sys.getallocatedblocks``),
  which grows with a Python-level leak and with nothing else;
* ``heap_in_use_bytes``: bytes malloc has handed out and not had back (glibc's
  ``mallinfo2``: ``uordblks`` + ``hblkhd``), Python's arenas and librdkafka's buffers
  included: what a native leak grows;
* ``heap_free_bytes``: bytes malloc keeps free (``fordblks``): the allocator's high-water
  mark, not a leak;

and :class:`Trimmer` calls glibc's ``malloc_trim(0)`` every few minutes, which returns the
free pages of every arena to the system.  Off glibc (musl, macOS) the native figures are
absent and trimming does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
import time
from typing import Final

log = logging.getLogger(__name__)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33 (no mallinfo2)
        return None
    return libc


_LIBC: Final = _libc()


def stats() -> dict[str, int]:
    """``python_blocks``, and on glibc ``heap_in_use_bytes`` and ``heap_free_bytes``."""
    out = {"python_blocks": sys.getallocatedblocks()}
    if _LIBC is not None:
        info = _LIBC.mallinfo2()
        out["heap_in_use_bytes"] = int(info.uordblks) + int(info.hblkhd)
        out["heap_free_bytes"] = int(info.fordblks)
    return out


def trim() -> bool:
    """Return malloc's free memory to the system; True if some was released."""
    return _LIBC is not None and bool(_LIBC.malloc_trim(0))


class Trimmer:
    """Calls :func:`trim` at most every ``interval`` seconds (0: never)."""

    def __init__(self, interval: float = 300.0) -> None:
        self.interval = interval
        self._last = time.monotonic()

    def tick(self, now: float) -> None:
        if self.interval > 0 and now - self._last >= self.interval:
            self._last = now
            if trim():
                log.debug("returned free heap memory to the system")
