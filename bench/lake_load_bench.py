"""The lake load (``pgcdc snapshot --lake``, streaming/bulk_load.py) against ``COPY ... TO
STDOUT``, in one run.

One throwaway PostgreSQL (``pgcdc.services``) holds initial_load_bench's two tables
(``bench_orders``: bigint key, numeric(12,2), timestamptz, text, jsonb, int[], an enum;
``bench_customers``: int key, text, text, date, bool), ``--rows`` rows in all.  Measured:

(a) ``COPY <table> TO STDOUT`` (text) of both tables over one connection, every block read
    and dropped (the server's side of any load; the cache is warmed first);
(b) the lake load of both tables into a fresh lake with a local Spark session
    (``--master``, default local[2]; the session and its JVM are up before, not counted): the
    slot and its snapshot, the Spark tasks' COPY and decoding, the Delta writes, the state
    file; rows/s and the ratio to (a).  The lake tables' row counts are checked.

From the repository root::

    python -m bench.lake_load_bench --rows 1000000
    python -m bench.lake_load_bench --smoke          # 2,000 rows: only shows it still works
"""

from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
from pathlib import Path

from bench.initial_load_bench import copy_sequential, create_tables
from loads.initial_load import LoadConfig
from pgcdc.services.postgres import PostgresServer
from streaming.bulk_load import LAKE_CHUNK_PAGES, load_lake
from streaming.session import build_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-pages", type=int, default=LAKE_CHUNK_PAGES)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dsn", help="an existing database (default: a throwaway server)")
    parser.add_argument("--smoke", action="store_true",
                        help="2,000 rows, chunks of 8 pages: its figures mean nothing")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.chunk_pages = 2000, 8
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    server = None
    work = Path(tempfile.mkdtemp(prefix="pgcdc-lake-bench-"))
    spark = build_session("pgcdc-lake-bench", master=args.master)
    try:
        dsn = args.dsn
        if dsn is None:
            server = PostgresServer(settings={"shared_buffers": "512MB"}).start()
            dsn = server.dsn()
        rows = create_tables(dsn, args.rows)
        total = sum(rows.values())
        copy_sequential(dsn)  # warm the cache
        start = time.perf_counter()
        copy_sequential(dsn)
        copy_seconds = time.perf_counter() - start
        lake = (work / "lake").as_uri()
        config = LoadConfig(dsn, work / "load.json", publication="bench",
                            chunk_pages=args.chunk_pages, progress_file=work / "progress.json",
                            catalog_dir=work / "catalog")
        start = time.perf_counter()
        assert load_lake(config, lake, spark=spark)
        load_seconds = time.perf_counter() - start
        for table, count in rows.items():
            loaded = spark.read.format("delta").load(f"{lake}/public.{table}").count()
            assert loaded == count, (table, loaded, count)
        copy_rate, load_rate = total / copy_seconds, total / load_seconds
        print(f"(a) COPY TO STDOUT, one connection: {total:,} rows in {copy_seconds:.1f} s, "
              f"{copy_rate:,.0f} rows/s")
        print(f"(b) lake load, {args.master}, chunks of {args.chunk_pages} pages: {total:,} "
              f"rows in {load_seconds:.1f} s, {load_rate:,.0f} rows/s, "
              f"{load_rate / copy_rate:.3f} x COPY")
    finally:
        spark.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
