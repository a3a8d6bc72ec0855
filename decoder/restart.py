"""How to start over after a slot problem lost changes, as one message with every step.

A new slot needs every piece of state the old one left behind gone, or the next start refuses
in turn: the progress file (check_against_slot), the catalog folder (a new slot's catalog is
read afresh: Pipeline._check_catalog_folder), the initial load's state (a load of a slot that
is gone: InitialLoad._check_resumable) and the incremental snapshots' state (windows of the
old stream). :func:`start_over` names them all, the slot drop when the slot is still there, and
the run that loads the tables again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StateFiles:
    """Where pgcdc keeps what it knows about one slot (pgcdc/state_paths.py)."""

    progress_file: Path | None
    catalog_dir: Path | None = None
    load_state: Path | None = None
    incremental_state: Path | None = None


def start_over(slot: str, files: StateFiles, *, drop_slot: bool, topics: bool = False) -> str:
    """The steps, numbered, in one sentence: drop the slot (if it is still there), remove
    whichever of the state files exist (and, with ``topics``, the topics an unfinished initial
    load wrote), load again."""
    steps = []
    if drop_slot:
        steps.append(f'drop the slot (pgcdc slot drop --slot "{slot}", with the same --dsn)')
    remove = [f"{what} {path}" for what, path in (
        ("the progress file", files.progress_file),
        ("the catalog folder", files.catalog_dir),
        ("the initial load's state", files.load_state),
        ("the incremental snapshots' state", files.incremental_state),
    ) if path is not None and path.exists()]
    if topics:
        remove.append("the topics the load wrote")
    if remove:
        listed = remove[0] if len(remove) == 1 else \
            f"{', '.join(remove[:-1])} and {remove[-1]}"
        steps.append(f"remove {listed}")
    steps.append("run pgcdc run --initial-load (it creates the slot and re-snapshots every table)")
    return "to start over: " + "; ".join(f"{n}. {step}" for n, step in enumerate(steps, 1))
