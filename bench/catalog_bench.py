"""How long a persisted catalog history of N versions takes to load, and lookups by LSN.

    python -m bench.catalog_bench [--versions 10000] [--tables 50] [--columns 12]

Writes N versions (each an ALTER of one of ``--tables`` tables with ``--columns``
columns and more) through :class:`snapshot_builder.history.HistoryFile`, then
measures, in a fresh process state, ``HistoryFile.load()`` and a sweep of
``catalog_at(lsn)`` lookups.  Target (snapshot_builder issue): 10,000 versions
load in under a second.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from snapshot_builder.catalog import Column, TableVersion
from snapshot_builder.history import CatalogHistory, HistoryFile, PutTable


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", type=int, default=10_000)
    parser.add_argument("--tables", type=int, default=50)
    parser.add_argument("--columns", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        build(directory, args.versions, args.tables, args.columns)
        written = time.perf_counter() - started
        size = (directory / "catalog.log").stat().st_size
        started = time.perf_counter()
        history: CatalogHistory = HistoryFile(directory).load()
        loaded = time.perf_counter() - started
        assert history.latest.version == args.versions
        rng = random.Random(2)
        lookups = 2000
        started = time.perf_counter()
        for _ in range(lookups):
            history.catalog_at(rng.randrange(args.versions * 1000))
        per_lookup = (time.perf_counter() - started) / lookups
    print(f"versions: {args.versions}, tables: {args.tables}, log: {size / 1e6:.1f} MB")
    print(f"append (fsync each): {written:.2f} s")
    print(f"load: {loaded:.3f} s (target < 1 s: {'met' if loaded < 1 else 'NOT met'})")
    print(f"catalog_at: {per_lookup * 1e6:.0f} us per lookup (random LSN)")


if __name__ == "__main__":
    main()
