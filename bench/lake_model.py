"""The lake model at length (TESTING.md T18): many random programs of DDL and DML,
with kill -9 of ``pgcdc run`` at every capture and of the Spark driver at half the applies,
each ending with the lake compared with the source table by table.

The programs are tests/lake_model.py's (the CI test, tests/integration/test_lake_model.py,
runs a few of them without kills).  Batches of programs take the encodings of
``--encodings`` in turn (Avro with text values, typed Avro, pgcdc's JSON: each reaches the lake
through decoding of its own).  One throwaway PostgreSQL, Kafka broker and Spark session
for the whole run.  Each capture starts ``pgcdc run --incremental-snapshots`` as a process and
kills it with -9 after 0.3 to 4 s; the program's final check captures with a pipeline in this
process, from the progress, catalog history and incremental state the killed ones left.  Half
the applies (``--driver-kills`` sets the share) first start ``pgcdc spark --available-now``
as a process (40 offsets a micro-batch) and kill it with -9 after 8 to 45 s (Spark's start
included: before its first batch, between two, or inside one); the apply in this process
then goes on from its checkpoint.  With ``--pg-crashes SHARE``, that share of the killed
``pgcdc run`` processes first see PostgreSQL crash under them (``pg_ctl stop -m immediate``,
started again at once: the slot may come back behind what pgcdc confirmed, and the stream
replays), and must reconnect; and that share of the lake loads see it crash under them
instead of being killed, and must stop by themselves (a transient error, exit 4) for the
next run to resume.

From the repository root::

    python -m bench.lake_model --programs 200 --steps 25 --seed 1
    python -m bench.lake_model --programs 20 --no-kills --shrink

A failing program is shrunk (``--shrink``, slow: each step of shrinking runs the pipeline)
and its SQL written to ``--failures`` (one file per failure, named by seed: the error as
comments, a statement a line, and ``-- capture`` / ``-- apply`` where the program captured
and applied; ``tests.lake_model.Program.run`` replays it); ``--keep DIR`` also keeps its
folder (the load's and the stream's state, the catalog, the lake, the checkpoint, and the
stderr of every pgcdc process it ran and killed).  Prints a JSON summary: the
programs that ran to their check (hypothesis may run a few more than asked; a failure ends
its batch), the statements they ran, kills, failures, seconds; the exit status is 1 if a
program failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import hypothesis.core
import hypothesis.errors
from hypothesis.stateful import run_state_machine_as_test

from pgcdc.services.kafka import KafkaBroker
from pgcdc.services.postgres import PostgresServer
from tests.integration.test_lake_model import model_settings
from tests.lake_model import ENCODINGS, LakeModel, Rig, machine

log = logging.getLogger("bench.lake_model")

# what hypothesis raises in a step to steer the run (a rejected step), not a failure
_CONTROL = tuple(getattr(hypothesis.errors, name) for name in ("UnsatisfiedAssumption", "StopTest")
                 if hasattr(hypothesis.errors, name))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from streaming.session import build_session

    failures: list[dict[str, Any]] = []
    started = time.monotonic()
    # transactions larger than this are streamed in progress (pgoutput's stream messages)
    settings = {"logical_decoding_work_mem": args.decoding_work_mem}
    with PostgresServer(settings=settings) as server, KafkaBroker() as broker, \
            tempfile.TemporaryDirectory() as tmp:
        spark = build_session("pgcdc-lake-model")
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))  # see the CI test
        try:
            rig = Rig(server, broker.bootstrap_servers, spark, Path(tmp),
                      kills=None if args.no_kills else random.Random(args.seed),
                      driver_kill_rate=args.driver_kills, crash_rate=args.pg_crashes)
            bound = machine(rig)
            last: list[LakeModel] = []
            ran: list[int] = []  # each program run: its statements (a failure ends a batch)
            encodings: dict[str, int] = {}  # programs run per encoding
            original = bound.teardown

            failed: list[list[str]] = []  # the first failing program's statements

            def teardown(self: LakeModel) -> None:  # keeps the last program for its SQL
                last[:] = [self]
                ran.append(sum(not s.startswith("-- ") for s in self.program.statements))
                encodings[self.program.encoding] = encodings.get(self.program.encoding, 0) + 1
                def keep() -> None:
                    if not failed:  # not a replay's: hypothesis may not reproduce it
                        failed.append(list(self.program.statements))
                        if args.keep is not None:  # its state, catalog, lake, processes' logs
                            shutil.copytree(self.program.home, args.keep / self.program.slot,
                                            dirs_exist_ok=True)

                raised = sys.exc_info()[0]
                if raised is not None and not issubclass(raised, _CONTROL):  # a step failed
                    keep()  # (the teardown checks nothing; a rejected step is no failure)
                try:
                    original(self)
                except BaseException:
                    keep()
                    raise

            bound.teardown = teardown  # type: ignore[method-assign]
            for batch in range(args.start, args.programs, args.batch):
                failed.clear()  # a program of an earlier batch that raised but did not fail
                seed = args.seed * 1_000_003 + batch
                hypothesis.core.global_force_seed = seed
                count = min(args.batch, args.programs - batch)
                # each batch in one encoding, in turn (a replay keeps its batch's)
                rig.encoding = args.encodings[(batch // args.batch) % len(args.encodings)]
                try:
                    run_state_machine_as_test(bound, settings=model_settings(
                        count, args.steps, shrink=args.shrink, derandomize=False))
                except Exception as exc:  # a program failed: keep it, go on with the next
                    statements = failed[0] if failed else \
                        last[0].program.statements if last else []
                    failed.clear()
                    # a failure hypothesis could not reproduce (a kill's timing differs on
                    # the replay) wraps the first error: keep its text, the one that matters
                    firsts = getattr(exc, "exceptions", ())
                    if firsts:
                        exc = Exception(f"{exc} -- first: {firsts[0]}")
                    failures.append({"seed": seed, "error": str(exc).splitlines()[0][:500],
                                     "statements": len(statements)})
                    if args.failures is not None:
                        args.failures.mkdir(parents=True, exist_ok=True)
                        path = args.failures / f"lake_model_{seed}.sql"
                        path.write_text(_listing(str(exc), statements))
                        failures[-1]["file"] = str(path)
                    failures[-1]["encoding"] = rig.encoding
                    log.error("programs %d-%d (seed %d, %s) failed: %s", batch, batch + count - 1,
                              seed, rig.encoding, str(exc).splitlines()[0][:300])
                log.info("%d programs run (%d asked), %d kills, %d driver kills, %d lake load "
                         "kills, %d PostgreSQL crashes, %d failures", len(ran), batch + count,
                         rig.killed, rig.driver_kills, rig.load_kills, rig.crashes,
                         len(failures))
        finally:
            spark.stop()
    return {"programs": len(ran), "asked": args.programs, "steps": args.steps,
            "statements": sum(ran), "seed": args.seed, "kills": rig.killed,
            "driver_kills": rig.driver_kills, "load_kills": rig.load_kills,
            "pg_crashes": rig.crashes,
            "encodings": encodings,
            "failures": failures,
            "seconds": round(time.monotonic() - started, 1)}


def _listing(error: str, statements: list[str]) -> str:
    """A failing program as an SQL file: the error as comments, then each statement on a
    line of its own (ended by ``;``), and where the program captured and applied (the lines
    ``-- capture`` and ``-- apply``, which Program.run replays)."""
    head = error.split("; program:")[0]
    lines = [f"-- {line}" for line in head.splitlines()]
    lines += [s if s.startswith("-- ") else f"{s};" for s in statements]
    return "\n".join(lines) + "\n"


def _encodings(text: str) -> tuple[str, ...]:
    chosen = tuple(e.strip() for e in text.split(",") if e.strip())
    unknown = sorted(set(chosen) - set(ENCODINGS))
    if unknown or not chosen:
        msg = f"--encodings takes some of {', '.join(ENCODINGS)}, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=100, help="programs to run (100)")
    parser.add_argument("--steps", type=int, default=25, help="at most this many steps each")
    parser.add_argument("--seed", type=int, default=1, help="the run's seed (programs, kills)")
    parser.add_argument("--decoding-work-mem", default="64kB",
                        help="the server's logical_decoding_work_mem: a transaction larger "
                             "than this (a few rows of the model's TOASTed column) reaches "
                             "pgcdc streamed while in progress (64kB, PostgreSQL's least)")
    parser.add_argument("--start", type=int, default=0,
                        help="the first program: a run from a later batch (its seed and "
                             "encoding as in the full run) (0)")
    parser.add_argument("--batch", type=int, default=10,
                        help="programs per hypothesis run: a failure ends its batch (10)")
    parser.add_argument("--no-kills", action="store_true", help="capture without kill -9")
    parser.add_argument("--driver-kills", type=float, default=0.5, metavar="SHARE",
                        help="share of applies that first start `pgcdc spark` and kill it "
                             "with -9 (0.5); each costs a driver's start")
    parser.add_argument("--pg-crashes", type=float, default=0.0, metavar="SHARE",
                        help="share of the killed `pgcdc run` processes during which "
                             "PostgreSQL crashes (pg_ctl stop -m immediate, started again; 0), "
                             "and of the lake loads it crashes under instead of a kill")
    parser.add_argument("--encodings", type=_encodings, default=ENCODINGS,
                        metavar="E,E", help="how captures encode values, a batch each in "
                        f"turn: {', '.join(ENCODINGS)} (all)")
    parser.add_argument("--shrink", action="store_true", help="shrink a failing program")
    parser.add_argument("--keep", type=Path, default=None,
                        help="copy a failing program's folder here (its load and progress "
                        "state, catalog, lake, checkpoint and the logs of its killed processes)")
    parser.add_argument("--failures", type=Path, default=Path("lake_model_failures"),
                        help="folder for failing programs' SQL (lake_model_failures)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "kafka", "streaming", "pgcdc", "snapshot_builder", "loads", "sinks"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    report = run(args)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
