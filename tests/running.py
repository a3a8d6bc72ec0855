"""Helpers for integration tests that stream while they write."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pgcdc.pipeline import Pipeline, ShutdownIncompleteError


@contextmanager
def running(pipeline: Pipeline) -> Iterator[threading.Event]:
    """The pipeline streams in a thread until the block ends (or its stop event is set);
    an error it raised fails the test."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            pipeline.run(stop=stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors


def wait(predicate: Callable[[], object], timeout: float = 60, what: str = "condition") -> None:
    """Poll ``predicate`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout} s")
        time.sleep(0.1)


def run_held(pipeline: Pipeline, stop: threading.Event,
             incomplete: list[ShutdownIncompleteError]) -> None:
    """``pipeline.run`` for a thread whose sink holds what it got: the stop it is given ends
    in :class:`ShutdownIncompleteError` once the grace period is over (what was held is
    sent again at the next start), which goes to ``incomplete`` instead of failing the
    thread."""
    try:
        pipeline.run(stop=stop)
    except ShutdownIncompleteError as exc:
        incomplete.append(exc)
