"""Named fail points for deterministic crash tests (TESTING.md T3).

``PGCDC_FAIL_POINT=name`` (or ``name:N`` for the N-th time it is reached) makes the
process exit hard with :data:`EXIT_CODE` at that point, through ``os._exit``: no
cleanup, no flush, exactly like a crash.  Unset, :func:`hit` costs one test of
an empty tuple.

With ``PGCDC_FAIL_PAUSE=<file>`` as well, the process does not exit there: it creates
``<file>`` and waits until the file is gone, then goes on, so that a test can make
something happen around it at that very point (crash its server) and see what the process
does next.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Final

EXIT_CODE: Final = 77

# every fail point pgcdc has, in the order a change passes them
POINTS: Final = (
    "after_decode",  # a change is decoded, nothing produced yet
    "after_produce",  # handed to the producer, not acknowledged
    "before_delivery_ack",  # Kafka acknowledged, the tracker not yet told
    "after_delivery_ack",  # the tracker counted the acknowledgement
    "before_progress_store",  # durable in Kafka, progress not stored
    "after_progress_store",  # progress stored, PostgreSQL not yet told
    "after_status_update",  # the flush LSN was sent to PostgreSQL
)

# the initial load's fail points; apart from POINTS, which the streaming crash test runs through
LOAD_POINTS: Final = (
    "before_load_history",  # the slot exists and the load's state names it, no catalog history
    "after_load_plan",  # the slot and the load's plan are stored, no read event written yet
    "after_snapshot_chunk",  # a chunk is durable in the sink and recorded done in the state file
    "before_lake_write",  # the lake load created a table's lake table, wrote none of its rows
)


def _parse(spec: str) -> tuple[str, int] | None:
    if not spec:
        return None
    name, _, count = spec.partition(":")
    if name not in POINTS + LOAD_POINTS:
        msg = (f"PGCDC_FAIL_POINT={spec!r}: unknown fail point; "
               f"known: {', '.join(POINTS + LOAD_POINTS)}")
        raise ValueError(msg)
    return name, int(count or 1)


_ACTIVE = _parse(os.environ.get("PGCDC_FAIL_POINT", ""))
_PAUSE = os.environ.get("PGCDC_FAIL_PAUSE", "")
_hits = 0


def hit(name: str) -> None:
    """Exit hard here if this fail point is armed (and reached its count); or, with a pause
    file, wait here until the test removes it."""
    global _hits
    if _ACTIVE is None or _ACTIVE[0] != name:
        return
    _hits += 1
    if _hits == _ACTIVE[1] and _PAUSE:
        sys.stderr.write(f"pgcdc: fail point {name} reached, paused while {_PAUSE} exists\n")
        sys.stderr.flush()
        Path(_PAUSE).touch()
        while Path(_PAUSE).exists():
            time.sleep(0.05)
        return
    if _hits >= _ACTIVE[1] and not _PAUSE:
        sys.stderr.write(f"pgcdc: fail point {name} reached, exiting\n")
        sys.stderr.flush()
        os._exit(EXIT_CODE)
