"""Every benchmark still runs (issue 18): each ``bench/`` command at a tiny scale, its own
throwaway PostgreSQL, the session's Kafka broker where it takes one (``--bootstrap-servers``).

A benchmark whose code no longer matches pgcdc's (``kafka_latency_bench`` failed with a
``TypeError`` once the sink's ``produce`` call changed) fails here.  The figures of a smoke
run mean nothing and are not looked at; what is checked is that the run ends with exit 0
and prints its result lines.

Not here: ``bench/spark_bench.py`` and ``bench/lake_model.py`` (Spark sessions, minutes even
at their smallest) and ``bench/json_bench.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# module, extra arguments, whether it takes --bootstrap-servers, a line its output must hold
BENCHES = [
    ("bench.catalog_bench", [], False, "load, 2 fresh processes"),
    ("bench.row_decode_bench", [], False, "binary, compiled decoders"),
    ("bench.decoder_bench", [], True, "| (c) pgcdc -> Kafka avro (durable) |"),
    ("bench.kafka_sink_bench", [], True, "round 1 defaults: events 1,450"),
    ("bench.kafka_latency_bench", [], True, "100 transactions at"),
    ("bench.initial_load_bench", [], True, "| (d) initial load into Kafka (avro), 1 worker"),
    ("bench.memory_probe", [], True, "transactions; Python allocations of pgcdc"),
]


@pytest.mark.parametrize(("module", "extra", "kafka", "expected"), BENCHES,
                         ids=[b[0].removeprefix("bench.") for b in BENCHES])
def test_bench_smoke(module: str, extra: list[str], kafka: bool, expected: str,
                     kafka_servers: str) -> None:
    argv = [sys.executable, "-m", module, "--smoke", *extra]
    if kafka:
        argv += ["--bootstrap-servers", kafka_servers]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, f"{module} failed ({done.returncode}):\n{done.stderr[-4000:]}"
    assert expected in done.stdout, f"{module} printed:\n{done.stdout[-4000:]}"
    if module == "bench.kafka_latency_bench":
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["unacknowledged"] == 0 and report["measured"] == 100, report


def test_soak_smoke() -> None:
    """The soak at its smallest through its own flags: 6 s at 10 tx/s on one table, no fault
    (it starts its own PostgreSQL and Kafka)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--minutes", "0.1", "--rate", "10", "--tables",
         "1", "--faults", "", "--sample-seconds", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"bench.soak failed ({done.returncode}):\n" \
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    start = done.stdout.index("{")
    report = json.loads(done.stdout[start:])
    assert report["ok"] is True, report
