"""A stuck sink, told truthfully (issue 18; TESTING.md T21): Kafka cut off by the proxy in front
of the broker while ``pgcdc run`` streams.

* one warning when the sink stops acknowledging (``--sink-stall-seconds``), one when it
  acknowledges again; ``pgcdc_sink_stalled`` 1 then 0, ``pgcdc_sink_stalls_total`` 1;
* ``/health/ready`` 503 with the reason in the body while stalled, 200 after;
* librdkafka's own lines come through Python logging: with ``--log-format json`` every
  line of stderr is a JSON object, some from the ``librdkafka`` logger;
* ``--on-lag stop`` stops pgcdc (exit 3, the lag named) while the sink is stuck, and
  ``/health/ready`` says the guard tripped.

The services and the rig are those of test_faults.py.
"""

# ruff: noqa: F811 (the tests take the fixtures imported from test_faults as arguments)
from __future__ import annotations

import json
import time

import pytest

from pgcdc.services.ports import free_port
from tests.health import get, sample
from tests.integration.test_faults import (  # noqa: F401 (fixtures)
    Rig,
    kafka,
    pg_proxy,
    rig,
)
from tests.oracle import Writer
from tests.tcp_proxy import BLACKHOLE, PASS, RESET


def test_stall_is_warned_counted_and_makes_pgcdc_unready(rig: Rig) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    writer = Writer(rig.dsn, seed=191)
    pgcdc = rig.pgcdc()
    pgcdc.argv += ["--sink-stall-seconds", "2", "--metrics-port", str(port),
                   "--log-format", "json", "--log-level", "warning"]
    with rig.sampler() as sampler:
        writer.write(rig.conn, 5)
        pgcdc.start()
        rig.caught_up(pgcdc)
        rig.wait_for("ready", lambda: get(base + "/health/ready")[0] == 200, 30, pgcdc)
        rig.kafka_proxy.set_mode(RESET)
        try:
            writer.write(rig.conn, 10)
            rig.wait_for("/health/ready to say 503",
                         lambda: get(base + "/health/ready")[0] == 503, 60, pgcdc)
            code, body = get(base + "/health/ready")
            metrics = get(base + "/metrics")[1]
        finally:
            rig.kafka_proxy.set_mode(PASS)
        assert code == 503 and "the sink has acknowledged nothing for" in body, body
        assert sample(metrics, "pgcdc_sink_stalled") == 1, metrics
        rig.wait_for("ready again", lambda: get(base + "/health/ready")[0] == 200, 90, pgcdc)
        metrics = get(base + "/metrics")[1]
        assert sample(metrics, "pgcdc_sink_stalled") == 0, metrics
        assert sample(metrics, "pgcdc_sink_stalls_total") == 1, metrics
        err = rig.finish(pgcdc)
    rig.check(writer, sampler)
    records = [json.loads(line) for line in err.splitlines() if line.strip()]  # all JSON
    messages = [r["message"] for r in records if r["logger"] == "pgcdc.pipeline"]
    stalled = [m for m in messages if "the sink has acknowledged nothing for" in m]
    recovered = [m for m in messages if "the sink acknowledges again" in m]
    assert len(stalled) == 1 and len(recovered) == 1, messages
    assert any(r["logger"] == "librdkafka" for r in records), \
        "no librdkafka line came through Python logging"
    print(f"\nsink stall: {len(records)} JSON lines, "
          f"{sum(r['logger'] == 'librdkafka' for r in records)} from librdkafka; {stalled[0]}")


def test_on_lag_stop_acts_while_the_sink_is_stuck(rig: Rig,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    writer = Writer(rig.dsn, seed=192)
    pgcdc = rig.pgcdc()
    pgcdc.argv += ["--max-lag-bytes", "200000", "--on-lag", "stop", "--sink-stall-seconds", "2",
                   "--shutdown-grace-seconds", "2", "--metrics-port", str(port)]
    monkeypatch.setenv("PGCDC_LAG_INTERVAL", "0.5")  # lag samples twice a second
    writer.write(rig.conn, 5)
    pgcdc.start()
    assert pgcdc.proc is not None
    rig.caught_up(pgcdc)
    durable = rig.confirmed()
    rig.kafka_proxy.set_mode(BLACKHOLE)
    reasons: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while pgcdc.proc.poll() is None and time.monotonic() < deadline:
            writer.write(rig.conn, 5)
            code, body = get(base + "/health/ready")
            if code == 503:
                reasons.append(body)
            time.sleep(0.2)
        code, err = pgcdc.wait(60)
    finally:
        rig.kafka_proxy.set_mode(PASS)
    assert code == 3, f"exit {code}, not 3:\n{err}"
    assert "more than --max-lag-bytes 200000" in err, err
    assert rig.confirmed() == durable, "the slot moved while the sink was stuck"
    assert any("acknowledged nothing" in r or "--max-lag-bytes" in r for r in reasons), reasons
