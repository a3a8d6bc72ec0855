"""After a slot problem, one message names every step of starting over (issue 18): following
exactly the steps it gives (no other knowledge) brings ``pgcdc run --initial-load`` back."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

Conn = psycopg.Connection[tuple[object, ...]]


def _pgcdc(dsn: str, tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGCDC_DSN": dsn, "PGCDC_PROGRESS_FILE": str(tmp / "progress.json"),
           "PGCDC_CATALOG_DIR": str(tmp / "catalog"), "PGCDC_LOAD_STATE": str(tmp / "load.json"),
           "PGCDC_INCREMENTAL_STATE": str(tmp / "incremental.json")}
    return subprocess.run([sys.executable, "-m", "pgcdc", *argv], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _run(dsn: str, tmp: Path, output: str) -> subprocess.CompletedProcess[str]:
    return _pgcdc(dsn, tmp, "run", "--initial-load", "--exit-when-caught-up", "--tables",
                  "public.t", "--sink", "jsonl", "--output", str(tmp / output))


def _ids(path: Path) -> set[int]:
    rows = (json.loads(line) for line in path.read_text().splitlines())
    return {row["after"]["id"] for row in rows if row.get("after")}


def _follow(advice: str, tmp: Path) -> None:
    """Do what the message says to remove, and check it says nothing else but to run again."""
    steps = re.findall(r"\d\. ([^;]*)", advice.split("to start over: ", 1)[1])
    assert steps[-1].startswith("run pgcdc run --initial-load"), steps
    for step in steps[:-1]:
        assert step.startswith("remove "), step
        for path in re.findall(rf"({re.escape(str(tmp))}/[\w.]+)", step):
            target = Path(path)
            shutil.rmtree(target) if target.is_dir() else target.unlink()


def test_the_advice_after_a_dropped_slot_is_all_the_next_start_needs(
        pg_conn: Conn, pg_dsn: str, tmp_path: Path) -> None:
    pg_conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg_conn.execute("INSERT INTO t VALUES (1), (2)")
    first = _run(pg_dsn, tmp_path, "first.jsonl")
    assert first.returncode == 0, first.stderr
    pg_conn.execute("INSERT INTO t VALUES (3)")
    assert _run(pg_dsn, tmp_path, "first.jsonl").returncode == 0
    assert _ids(tmp_path / "first.jsonl") == {1, 2, 3}
    state = [tmp_path / "progress.json", tmp_path / "catalog", tmp_path / "load.json"]
    assert all(p.exists() for p in state)

    dropped = _pgcdc(pg_dsn, tmp_path, "slot", "drop", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    for path in state:  # the drop's own advice names them all
        assert str(path) in dropped.stderr, dropped.stderr
    pg_conn.execute("INSERT INTO t VALUES (4)")  # lost: no slot holds it

    refused = _run(pg_dsn, tmp_path, "second.jsonl")
    assert refused.returncode == 3, refused.stderr
    advice = refused.stderr
    assert "are lost" in advice and "to start over: 1. remove " in advice, advice
    for path in state:
        assert str(path) in advice, advice
    assert "pgcdc slot drop" not in advice  # nothing to drop: the slot is gone

    _follow(advice, tmp_path)
    again = _run(pg_dsn, tmp_path, "second.jsonl")
    assert again.returncode == 0, again.stderr
    assert _ids(tmp_path / "second.jsonl") == {1, 2, 3, 4}  # read again, 4 included
