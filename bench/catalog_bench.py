"""How long a persisted catalog history of N versions takes to load, and lookups by LSN.

    python -m bench.catalog_bench [--versions 10000] [--tables 50] [--columns 12] [--runs 5]

Writes N versions (each an ALTER of one of ``--tables`` tables with ``--columns``
columns and more) through :class:`snapshot_builder.history.HistoryFile`, then
measures ``HistoryFile.load()`` ``--runs`` times, each in a fresh process (no
warm caches), wall and CPU time; the Spark job's replay of the same entries from their
published JSON (``streaming.catalog.replay``, which it runs at start and at every catalog
refresh); then, in this process, a sweep of
``catalog_at(lsn)`` and ``table_at(oid, lsn)`` lookups and ``verify()`` (every
stored fingerprint recomputed, which a load skips).  Target: 10,000 versions
load in under a second.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import MappingProxyType

from snapshot_builder.catalog import Column, TableVersion
from snapshot_builder.history import Catalog, CatalogHistory, Entry, HistoryFile, PutTable
from streaming.catalog import replay


def _table(oid: int, columns: int, generation: int) -> TableVersion:
    cols = tuple(Column(f"col_{i}", 23 if i % 3 else 25, "int4" if i % 3 else "text", -1,
                        i == 0, i == 0, None) for i in range(columns))
    return TableVersion(oid, "public", f"table_{oid}_{generation}", "d", cols)


def build(directory: Path, versions: int, tables: int, columns: int) -> None:
    history = HistoryFile(directory).load()
    rng = random.Random(1)
    for version in range(1, versions + 1):
        oid = 16384 + rng.randrange(tables)
        history.append(PutTable(_table(oid, columns + rng.randrange(4), version)),
                       lsn=version * 1000)


def _load_once(directory: Path) -> None:
    """One load, timed, in this (fresh) process: prints ``<wall> <cpu>``."""
    wall, cpu = time.perf_counter(), time.process_time()
    HistoryFile(directory).load(read_only=True)
    print(f"{time.perf_counter() - wall} {time.process_time() - cpu}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", type=int, default=10_000)
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--columns", type=int, default=12)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--load-once", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that only shows the benchmark still works (CI): "
                             "100 versions of 5 tables, 2 loads; its figures mean nothing")
    args = parser.parse_args()
    if args.smoke:
        args.versions, args.tables, args.runs = 100, 5, 2
    if args.load_once:
        _load_once(args.load_once)
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        build(directory, args.versions, args.tables, args.columns)
        written = time.perf_counter() - started
        size = (directory / "catalog.log").stat().st_size
        walls, cpus = [], []
        for _ in range(args.runs):
            out = subprocess.run(  # noqa: S603 (this interpreter, this module)
                [sys.executable, "-m", "bench.catalog_bench", "--load-once", str(directory)],
                check=True, capture_output=True, text=True, timeout=120).stdout.split()
            walls.append(float(out[0]))
            cpus.append(float(out[1]))
        history: CatalogHistory = HistoryFile(directory).load()
        assert history.latest.version == args.versions
        records = [entry.to_json() for entry in history.entries()]
        started = time.perf_counter()
        replayed = replay(records)
        replay_seconds = time.perf_counter() - started
        assert replayed.latest.tables == history.latest.tables
        started = time.perf_counter()  # the replay before d6a1501: one append per entry
        appended = CatalogHistory(Catalog(0, 0, MappingProxyType({})))
        for entry in (Entry.from_json(r, verify=False) for r in records):
            appended.append(entry.change, lsn=entry.lsn, commit_time=entry.commit_time)
        append_seconds = time.perf_counter() - started
        assert appended.latest.tables == history.latest.tables
        rng = random.Random(2)
        lookups = 2000
        probes = [rng.randrange(args.versions * 1000) for _ in range(lookups)]
        started = time.perf_counter()
        for lsn in probes:
            history.catalog_at(lsn)
        per_catalog = (time.perf_counter() - started) / lookups
        started = time.perf_counter()
        for lsn in probes:
            history.table_at(16384 + lsn % args.tables, lsn)
        per_table = (time.perf_counter() - started) / lookups
        started = time.perf_counter()
        latest = history.latest
        for lsn in probes:
            latest.table(16384 + lsn % args.tables)
        per_latest = (time.perf_counter() - started) / lookups
        started = time.perf_counter()
        checked = history.verify()
        verified = time.perf_counter() - started
    best, median = min(walls), statistics.median(walls)
    print(f"versions: {args.versions}, tables: {args.tables}, log: {size / 1e6:.1f} MB")
    print(f"append (fsync each): {written:.2f} s")
    print(f"load, {args.runs} fresh processes: wall min {best:.3f} s, median {median:.3f} s; "
          f"cpu median {statistics.median(cpus):.3f} s "
          f"(target < 1 s: {'met' if median < 1 else 'NOT met'})")
    print(f"the Spark job's replay of the published entries: {replay_seconds:.3f} s "
          f"(one append per entry, as before d6a1501: {append_seconds:.3f} s)")
    print(f"catalog_at: {per_catalog * 1e6:.1f} us, table_at: {per_table * 1e6:.2f} us, "
          f"latest.table: {per_latest * 1e6:.2f} us per lookup (random LSN)")
    print(f"verify (every stored fingerprint, {checked} table versions): {verified:.3f} s")


if __name__ == "__main__":
    main()
