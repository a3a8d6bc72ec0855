"""PostgreSQL unreachable when ``pgcdc run`` starts: waited for, as during a run.

A service is often started before its database (a reboot, ``docker compose up``), so a
server that cannot be reached yet (refused, timed out, starting up, shutting down) is
retried with the backoff of a lost connection (:func:`pgcdc.pipeline.retry_delay`, capped at
``--retry-max-delay``), forever by default or up to ``--max-retries`` failures, each attempt
logged.  Anything else the server or libpq answers (a refused login, a database or role that
does not exist, a host name that does not resolve) is not waited for: it needs a person.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from types import FrameType

import psycopg
from psycopg import conninfo

log = logging.getLogger(__name__)

# libpq's and the server's words for a server that is not there (yet): worth waiting for
_UNREACHABLE = re.compile(
    r"Connection refused|timeout expired|Connection timed out|No route to host"
    r"|Network is unreachable|No such file or directory|Connection reset by peer"
    r"|server closed the connection unexpectedly|the database system is starting up"
    r"|the database system is shutting down|the database system is in recovery mode"
    r"|the database system is not yet accepting connections|too many clients already")


def unreachable(exc: psycopg.OperationalError) -> bool:
    """Whether a failed connection says the server is not reachable (yet), rather than that
    it refused the connection for a reason a person has to fix."""
    return _UNREACHABLE.search(str(exc)) is not None


def wait_for_server(dsn: str, *, max_retries: int, retry_max_delay: float) -> bool:
    """Connect until the server answers: True then; False when SIGINT or SIGTERM came first.
    A failure that is not :func:`unreachable`, or the ``max_retries + 1``-th in a row (0:
    no limit), is raised."""
    from pgcdc.pipeline import Backoff

    stop = threading.Event()

    def stopping(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, stopping) for sig in (signal.SIGINT, signal.SIGTERM)}
    params = {} if "connect_timeout" in conninfo.conninfo_to_dict(dsn) \
        else {"connect_timeout": 10}
    backoff = Backoff(max_retries, retry_max_delay)
    try:
        while True:
            try:
                with psycopg.connect(dsn, autocommit=True, **params):  # type: ignore[arg-type]
                    pass
            except psycopg.OperationalError as exc:
                if not unreachable(exc):
                    raise
                delay = backoff.failed()
                if delay is None:
                    raise
                log.warning("PostgreSQL is not reachable: %s; retrying in %.1f s (%s)",
                            " ".join(str(exc).split()), delay, backoff.attempt)
                if stop.wait(delay):
                    log.warning("stopped while waiting for PostgreSQL")
                    return False
                continue
            if backoff.failures:
                log.warning("PostgreSQL is reachable, after %d failed attempts",
                            backoff.failures)
            return True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
