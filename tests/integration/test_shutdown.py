"""Bounded stops and endless retries of ``pgcdc run`` (issue 18; TESTING.md T7, T21).

* SIGTERM while Kafka is cut off (the proxy in front of the broker blackholes) or frozen
  (SIGSTOP): pgcdc exits 4 after ``--shutdown-grace-seconds``, says how many events it left
  undelivered and where the slot stays; the slot and the progress file stay at the durable
  position, and the next start loses nothing.
* SIGTERM while a call into the sink blocks (a table version waits for a frozen broker):
  the stop is bounded all the same (the grace period and a few seconds to close).
* PostgreSQL unreachable: pgcdc retries past the old limit of 10 attempts (forever by
  default), logging each, and streams on when the server is back; ``--max-retries`` gives up.

The services (a PostgreSQL cluster, a broker behind a proxy) and the rig are those of
test_faults.py.
"""

# ruff: noqa: F811 (the tests take the fixtures imported from test_faults as arguments)
from __future__ import annotations

import re
import signal

import pytest

from decoder.progress import ProgressStore
from tests.integration.test_faults import (  # noqa: F401 (fixtures)
    Rig,
    _stderr,
    kafka,
    pg_proxy,
    rig,
)
from tests.oracle import PgcdcProcess, Writer
from tests.tcp_proxy import BLACKHOLE, PASS, RESET

GRACE = 3  # seconds
BOUND = 60  # how long the test waits for an exit at most (not a timing assertion)


def _stop(process: PgcdcProcess) -> tuple[int, str]:
    assert process.proc is not None
    process.proc.send_signal(signal.SIGTERM)
    return process.wait(BOUND)


def _started(rig: Rig) -> PgcdcProcess:
    process = rig.pgcdc()
    process.start()
    return process


@pytest.mark.parametrize("fault", ["blackhole", "frozen"])
def test_stop_while_kafka_is_unreachable(fault: str, rig: Rig) -> None:
    """Events Kafka has not acknowledged at SIGTERM: exit 4 within the grace period, the
    undelivered count and the durable LSN said, the slot and stored progress at the durable
    position; after Kafka is back a new run delivers everything."""
    writer = Writer(rig.dsn, seed=181)
    pgcdc = rig.pgcdc()
    pgcdc.argv += ["--shutdown-grace-seconds", str(GRACE)]
    with rig.sampler() as sampler:
        writer.write(rig.conn, 10)
        pgcdc.start()
        rig.caught_up(pgcdc)
        durable = rig.confirmed()
        before = set(writer.ledger.versions)
        if fault == "blackhole":
            rig.kafka_proxy.set_mode(BLACKHOLE)
        else:
            rig.broker.pause()
        try:
            writer.write(rig.conn, 15)
            rig.received(pgcdc)
            code, err = _stop(pgcdc)
        finally:
            rig.broker.resume()
            rig.kafka_proxy.set_mode(PASS)
        held = writer.ledger.versions - before
        assert code == 4, f"exit {code}, not 4 (could not flush):\n{err}"
        said = re.search(r"stopped with (\d+) events not acknowledged by the sink within the "
                         rf"{GRACE} s grace period.*the slot stays at ([0-9A-F]+/[0-9A-F]+)",
                         err)
        assert said is not None, f"pgcdc did not say what it left undelivered:\n{err}"
        assert int(said[1]) > 0
        confirmed = rig.confirmed()
        assert confirmed == durable, "the slot moved while Kafka was unreachable"
        stored = ProgressStore(rig.progress).load()
        assert stored is not None and stored.durable_lsn == confirmed
        hi, lo = said[2].split("/")
        assert (int(hi, 16) << 32) + int(lo, 16) == confirmed, "the LSN said is not the slot's"
        writer.write(rig.conn, 5)
        rig.finish(_started(rig))
        assert confirmed < rig.commits_of(held)[0], "the slot passed what Kafka did not have"
    verdict = rig.check(writer, sampler)
    print(f"\nstop with Kafka {fault}: {said[1]} events left undelivered, "
          f"{verdict.events} events after the restart, {verdict.distinct} distinct")


def test_stop_while_the_sink_blocks(rig: Rig) -> None:
    """A table version waits for a frozen broker (publish_table flushes it at once), so the
    streaming loop does not see the stop: the process still exits 4 once the grace period
    and the time to close have passed, saying where the slot stays."""
    writer = Writer(rig.dsn, seed=182)
    pgcdc = rig.pgcdc()
    pgcdc.argv += ["--shutdown-grace-seconds", "1"]
    writer.write(rig.conn, 5)
    pgcdc.start()
    rig.caught_up(pgcdc)
    durable = rig.confirmed()
    rig.broker.pause()
    try:
        rig.conn.execute("ALTER TABLE ledger ADD COLUMN note text")  # a new table version
        writer.write(rig.conn, 3)
        rig.received(pgcdc)
        code, err = _stop(pgcdc)
    finally:
        rig.broker.resume()
    assert code == 4, f"exit {code}, not 4:\n{err}"
    assert "stopping took longer than" in err or "not acknowledged by the sink" in err, err
    assert rig.confirmed() == durable, "the slot moved while the sink was blocked"
    # the walsender ends when it notices the connection is gone
    rig.wait_for("the walsender to end", lambda: rig.active_pid() is None, 60)
    print(f"\nstop while the sink blocks: {err.strip().splitlines()[-1]}")


def test_postgres_unreachable_is_retried_until_it_is_back(rig: Rig) -> None:
    """Every new connection to PostgreSQL is reset for longer than the old limit of 10
    attempts (the backoff capped at 0.2 s to keep the test short): pgcdc logs each attempt,
    keeps trying, and streams on once the server is reachable again; nothing is lost."""
    writer = Writer(rig.dsn, seed=183)
    pgcdc = rig.pgcdc()
    pgcdc.argv += ["--retry-max-delay", "0.2", "--log-level", "warning"]
    with rig.sampler() as sampler:
        writer.write(rig.conn, 5)
        pgcdc.start()
        rig.caught_up(pgcdc)
        connections = rig.pg_proxy.connections
        rig.pg_proxy.set_mode(RESET)
        rig.wait_for("15 refused connection attempts",
                     lambda: rig.pg_proxy.connections - connections >= 15, 60, pgcdc)
        writer.write(rig.conn, 5)
        rig.pg_proxy.set_mode(PASS)
        rig.caught_up(pgcdc)
        err = rig.finish(pgcdc)
    rig.check(writer, sampler)
    attempts = [int(n) for n in re.findall(r"attempt (\d+), retrying until stopped", err)]
    assert max(attempts) > 10, f"not retried past 10 attempts:\n{err}"
    assert attempts == list(range(1, len(attempts) + 1)), "an attempt was not logged"


def test_max_retries_gives_up(rig: Rig) -> None:
    """``--max-retries 3``: the fourth failure in a row ends pgcdc with exit 4, naming the
    limit."""
    pgcdc = rig.pgcdc()
    pgcdc.argv += ["--retry-max-delay", "0.2", "--max-retries", "3"]
    pgcdc.start()
    Writer(rig.dsn, seed=184).write(rig.conn, 3)
    # streaming first: the failures counted are those of a running pgcdc (a server
    # unreachable at start is retried too, pgcdc/startup.py: test_startup_retry.py)
    rig.caught_up(pgcdc)
    rig.pg_proxy.set_mode(RESET)
    code, err = pgcdc.wait(BOUND)
    assert code == 4, f"exit {code}, not 4:\n{err}"
    assert "giving up after 4 failures in a row (--max-retries 3)" in err, err
    assert "attempt 3 of 3" in err, err
