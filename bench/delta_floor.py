"""The floor under a micro-batch over many tables (issue 16.1): what Delta alone costs per
table, with no pgcdc in the way.

For each of ``--tables`` new tables, in one Spark session configured as ``pgcdc spark``'s
(streaming/session.py), one after the other: ``CREATE TABLE`` (a commit without a Spark
job), an append of ``--rows`` rows with Delta's idempotent-write options (what the apply
does for a new table), and a MERGE of the same rows (what it does for an existing one).
Reported: the wall time of each operation per table, and how much of it Spark jobs took
(the rest is the driver: Delta's log, the snapshot, the plan); the Spark jobs by kind.

A batch over N tables pays at least this N times (the tables are applied a few at a time,
on the machine's cores), so the drain time of 100 tables cannot come near 2x that of one
table unless the per-table commits go.

From the repository root::

    python -m bench.delta_floor --tables 20 --rows 160
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.spark_bench import jobs_by_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=20, help="new tables, one after another")
    parser.add_argument("--rows", type=int, default=160, help="rows appended and merged")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting over pgcdc spark's own (repeatable)")
    args = parser.parse_args(argv)

    from delta.tables import DeltaTable

    from streaming.session import build_session

    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events"
        events.mkdir()
        spark = build_session("pgcdc-delta-floor", extra_config={
            "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false",
            **dict(setting.split("=", 1) for setting in args.conf)})
        rows = spark.range(0, args.rows).selectExpr("id", "CAST(id AS STRING) AS s")
        rows.collect()  # warm
        wall: Counter[str] = Counter()
        for t in range(args.tables + 1):  # the first one warms the JVM: left out
            path = str(Path(tmp) / f"t{t}")
            steps = [
                ("create", lambda p=path: spark.sql(
                    f"CREATE TABLE delta.`{p}` (id BIGINT, s STRING) USING delta")),
                ("append", lambda p=path: rows.write.format("delta").mode("append")
                 .option("txnAppId", "floor").option("txnVersion", 1).save(p)),
                ("merge", lambda p=path: DeltaTable.forPath(spark, p).alias("t").merge(
                    rows.alias("s"), "t.id = s.id").whenMatchedUpdateAll().execute()),
            ]
            for name, run in steps:
                spark.sparkContext.setJobDescription(f"{name} {t}")
                started = time.monotonic()
                run()
                if t > 0:
                    wall[name] += time.monotonic() - started
        spark.sparkContext.setJobDescription(None)
        jobs: Counter[str] = Counter()
        job_seconds: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        for job in jobs_by_step(events):
            description = str(job["description"])
            found = re.search(r"(create|append|merge) (\d+)", description)
            if found is None or found.group(2) == "0":
                continue
            jobs[found.group(1)] += 1
            job_seconds[found.group(1)] += job["seconds"]
            kinds[re.sub(r"\d+", "N", description)] += 1
        spark.stop()
    n = args.tables
    result = {name: {"seconds_per_table": round(wall[name] / n, 3),
                     "jobs_per_table": round(jobs[name] / n, 2),
                     "job_seconds_per_table": round(job_seconds[name] / n, 3)}
              for name in ("create", "append", "merge")}
    for name, entry in result.items():
        print(f"{name}: {entry['seconds_per_table']} s per table, of which Spark jobs "
              f"{entry['job_seconds_per_table']} s ({entry['jobs_per_table']} jobs)")
    print(json.dumps({"delta_floor": result, "tables": n, "rows": args.rows, "conf": args.conf,
                      "job_kinds": dict(kinds.most_common())}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
