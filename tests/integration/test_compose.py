"""`docker compose up`, for real, with podman: docker/compose.yml plus docker/compose.local.yml.

The override builds the same services from a local Debian bookworm base (public images cannot be
pulled here; tests/fixtures/podman.py builds the base once and reuses it): PostgreSQL from
Debian's package, Kafka from the jars Maven Central serves, pgcdc from this repository. Rows are
written into PostgreSQL once pgcdc's slot is streaming, and the Spark service's Delta lake must
come to equal the source (pgcdc.clone's row count and checksum per table, compared inside the
Spark service's container, which sees the lake volume, Kafka and PostgreSQL by name).

Skips only when podman cannot run a container on this machine; anything else fails, with the
services' logs. Deselected by default (marker `compose`, ~8 min cold): `make compose-test`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from tests.fixtures import podman

pytestmark = [pytest.mark.compose, pytest.mark.timeout(2400)]

PROJECT = "pgcdc-compose-test"
COMPOSE = ["podman-compose", "-p", PROJECT,
           "-f", "docker/compose.yml", "-f", "docker/compose.local.yml"]
SERVICES = ("postgres", "kafka", "pgcdc", "spark")

# Run inside the Spark service's container (python -c CHECK <seconds> <tables>): compares
# every table of the catalog topic with its lake table until all are equal or the time is up,
# then prints them. Delta's cached table logs are dropped before each look: once, a session that
# had looked at a table while the spark service created it went on reading it empty for minutes
# (a new session read its rows).
CHECK = """
import json, sys, time
import psycopg
from pgcdc.clone import compare
from streaming import job
from streaming.session import build_session

start = time.monotonic()
spark = build_session("pgcdc-compose-check")
print(f"check: Spark session in {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
lake = "file:///lake/tables"
config = job.JobConfig("kafka:9092", lake, "file:///tmp/unused", topic_prefix="pgcdc")
deadline = time.monotonic() + float(sys.argv[1])
while True:
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    tables = job.read_catalog(spark, config).tables()
    with psycopg.connect("host=postgres user=postgres password=postgres dbname=postgres") as conn:
        results = compare(conn, spark, lake, tables)
    done = len(results) >= int(sys.argv[2]) and all(r.equal for r in results)
    print(f"check: {time.monotonic() - start:.1f} s:",
          *(f"{r.table} {r.source.rows}/{r.lake.rows}" for r in results),
          file=sys.stderr, flush=True)
    if done or time.monotonic() > deadline:
        print("RESULT " + json.dumps({r.table: [[r.source.rows, r.source.checksum],
                                                 [r.lake.rows, r.lake.checksum]]
                                      for r in results}))
        break
    time.sleep(2)
spark.stop()
"""

WORKLOAD = """
CREATE TABLE public.accounts (id int PRIMARY KEY, name text NOT NULL, balance numeric(12,2),
                              opened timestamptz, active bool, tags jsonb, avatar bytea);
CREATE TABLE public.events (id bigserial PRIMARY KEY, account int, kind text, at date);
BEGIN;
INSERT INTO public.accounts
  SELECT g, 'name ' || g, g * 1.25, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 h',
         g % 2 = 0, jsonb_build_object('n', g), decode(lpad(to_hex(g), 4, '0'), 'hex')
  FROM generate_series(1, 400) g;
INSERT INTO public.events (account, kind, at)
  SELECT g % 400 + 1, 'kind ' || (g % 7), date '2024-01-01' + g % 365
  FROM generate_series(1, 600) g;
COMMIT;
UPDATE public.accounts SET balance = balance * 2, name = name || ' (updated)' WHERE id % 5 = 0;
DELETE FROM public.accounts WHERE id > 380;
DELETE FROM public.events WHERE id % 10 = 0;
INSERT INTO public.accounts VALUES (1000, 'late', NULL, NULL, NULL, NULL, NULL);
"""
EXPECTED_ROWS = {"public.accounts": 381, "public.events": 540}


_START = time.monotonic()


def _phase(what: str) -> None:
    """Where the time goes (shown with pytest -s; make compose-test passes it)."""
    print(f"[compose test {time.monotonic() - _START:6.1f} s] {what}", flush=True)


def _container(service: str) -> str:
    names = podman.run(["podman", "ps", "-a", "--format", "{{.Names}}",
                        "--filter", f"label=com.docker.compose.project={PROJECT}",
                        "--filter", f"label=com.docker.compose.service={service}"],
                       timeout=60).stdout.split()
    assert len(names) == 1, f"one container of the {service} service expected, found {names}"
    return names[0]


def _logs() -> str:
    parts = []
    for service in SERVICES:
        try:
            name = _container(service)
            out = podman.run(["podman", "logs", "--tail", "40", name], check=False, timeout=60)
            state = podman.run(["podman", "inspect", "--format", "{{.State.Status}} "
                                "exit={{.State.ExitCode}} restarts={{.RestartCount}}", name],
                               check=False, timeout=60).stdout.strip()
            parts.append(f"--- {service} ({state}):\n{out.stdout}{out.stderr}")
        except (AssertionError, podman.PodmanError) as exc:
            parts.append(f"--- {service}: {exc}")
    return "\n".join(parts)


def _wait(what: str, ready: Callable[[], bool], timeout: float) -> None:
    """Poll ``ready()`` until it is true; past ``timeout`` fail with the services' logs."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout:.0f} s:\n{_logs()}")
        time.sleep(2)


def _psql(sql: str) -> str:
    return podman.run(["podman", "exec", "-i", _container("postgres"), "psql", "-X", "-q",
                       "-v", "ON_ERROR_STOP=1", "-U", "postgres", "-tA", "-c", sql],
                      timeout=120).stdout.strip()


def _healthy(service: str) -> bool:
    # podman runs health checks from systemd timers; with no systemd they are run here, which
    # also checks that compose.yml's health commands work in the images
    return podman.run(["podman", "healthcheck", "run", _container(service)], check=False,
                      timeout=120).returncode == 0


@pytest.fixture(scope="module")
def stack() -> Iterator[None]:
    reason = podman.cannot_run_containers()
    if reason is not None:  # no container runtime on this machine at all: nothing to test
        pytest.skip(reason)
    if shutil.which("podman-compose") is None:
        pytest.fail("podman-compose is not installed: pip install podman-compose "
                    "(make compose-test installs it)")
    _phase("podman runs containers")
    podman.ensure_base_images()
    _phase("base images ready")
    podman.run([*COMPOSE, "down", "-v"], check=False)  # a stopped earlier run's leftovers
    # the spark service runs the pgcdc service's image: built once, not twice side by side
    podman.run([*COMPOSE, "build", "postgres", "kafka", "pgcdc"], timeout=3600)
    _phase("images built")
    try:
        podman.run([*COMPOSE, "up", "-d"], timeout=600)
        _phase("up")
        yield
    finally:
        podman.run([*COMPOSE, "down", "-v"], check=False, timeout=600)
        _phase("down")


def test_compose_up_streams_rows_into_a_lake_equal_to_the_source(stack: None) -> None:
    _wait("postgres healthy", lambda: _healthy("postgres"), 300)
    _wait("kafka healthy", lambda: _healthy("kafka"), 300)
    _wait("pgcdc streaming from its slot",
          lambda: _psql("SELECT count(*) FROM pg_replication_slots "
                        "WHERE slot_name = 'pgcdc' AND active") == "1", 300)
    _phase("pgcdc streaming")
    # the check's Spark session starts while the rows are written and applied
    check = subprocess.Popen(["podman", "exec", _container("spark"), "python", "-c", CHECK, "600",
                              str(len(EXPECTED_ROWS))], cwd=podman.ROOT, env=podman.environ(),
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        _psql(WORKLOAD)
        _phase("rows written")
        stdout, stderr = check.communicate(timeout=900)
    finally:
        if check.poll() is None:
            check.kill()
            check.wait()
    _phase("lake checked")
    for line in stderr.splitlines():
        if line.startswith("check: "):
            _phase(line)
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert check.returncode == 0 and lines, \
        f"the lake check failed ({check.returncode}):\n{stdout}{stderr}\n{_logs()}"
    results = json.loads(lines[-1].removeprefix("RESULT "))
    assert {table: source[0] for table, (source, _lake) in results.items()} == EXPECTED_ROWS
    unequal = {table: sides for table, sides in results.items() if sides[0] != sides[1]}
    assert not unequal, f"lake differs from the source (rows, checksum):\n{unequal}\n{_logs()}"
