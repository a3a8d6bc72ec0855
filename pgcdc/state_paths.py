"""Where pgcdc keeps what it knows about a slot: the configured paths, or one file (or folder)
per slot under ``~/.local/state/pgcdc``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from decoder.restart import StateFiles

if TYPE_CHECKING:
    from pgcdc.config import Settings


def state_dir() -> Path:
    """The folder of every default state path (and of ``pgcdc spark``'s log)."""
    return Path.home() / ".local" / "state" / "pgcdc"


def slot_paths(settings: Settings) -> tuple[Path, Path, Path]:
    """Stored progress, the catalog history and the load state: configured, or per slot."""
    state = state_dir()
    slot = settings.source.slot
    return (settings.state.progress_file or state / f"{slot}.json",
            settings.state.catalog_dir or state / f"{slot}.catalog",
            settings.state.load_state or state / f"{slot}.load.json")


def state_files(settings: Settings) -> StateFiles:
    """Every state file of the slot: named together when a start over needs them gone."""
    progress_file, catalog_dir, load_state = slot_paths(settings)
    incremental = settings.state.incremental_state or \
        progress_file.with_name(f"{settings.source.slot}.incremental.json")
    return StateFiles(progress_file, catalog_dir, load_state, incremental)
