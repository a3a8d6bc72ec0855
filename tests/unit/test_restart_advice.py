"""The advice after a slot problem: one message with every step of starting over (issue 18)."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoder.progress import DataLossError, SlotLostError, StoredProgress, check_against_slot
from decoder.restart import StateFiles, start_over
from decoder.slot import SlotInfo
from pgcdc.status import LOST, progress_check


def _files(tmp_path: Path, *, present: tuple[str, ...]) -> StateFiles:
    files = StateFiles(tmp_path / "p.json", tmp_path / "p.catalog", tmp_path / "p.load.json",
                       tmp_path / "p.incremental.json")
    for name in present:
        path = tmp_path / name
        path.mkdir() if name.endswith(".catalog") else path.write_text("{}")
    return files


def test_every_state_file_that_exists_is_named_in_one_numbered_sentence(
        tmp_path: Path) -> None:
    files = _files(tmp_path, present=("p.json", "p.catalog", "p.load.json",
                                      "p.incremental.json"))
    advice = start_over("app", files, drop_slot=True)
    assert advice == (
        'to start over: 1. drop the slot (pgcdc slot drop --slot "app", with the same --dsn); '
        f"2. remove the progress file {tmp_path}/p.json, the catalog folder "
        f"{tmp_path}/p.catalog, the initial load's state {tmp_path}/p.load.json and the "
        f"incremental snapshots' state {tmp_path}/p.incremental.json; 3. run pgcdc run "
        "--initial-load (it creates the slot and re-snapshots every table)")
    assert "\n" not in advice


def test_what_does_not_exist_is_left_out(tmp_path: Path) -> None:
    only = start_over("s", _files(tmp_path, present=("p.catalog",)), drop_slot=False)
    assert only == (f"to start over: 1. remove the catalog folder {tmp_path}/p.catalog; "
                    "2. run pgcdc run --initial-load (it creates the slot and re-snapshots "
                    "every table)")
    nothing = start_over("s", StateFiles(None), drop_slot=False, topics=True)
    assert nothing.startswith("to start over: 1. remove the topics the load wrote; 2. run ")


def _slot(confirmed: int, wal_status: str = "reserved") -> SlotInfo:
    return SlotInfo("app", "pgoutput", None, confirmed, confirmed, wal_status, True)


@pytest.mark.parametrize(("slot", "error", "drop", "what"), [
    (None, SlotLostError, False, "is gone"),
    (_slot(100, "lost"), SlotLostError, True, "was invalidated"),
    (_slot(200), DataLossError, True, "was advanced or recreated"),
])
def test_the_start_refuses_with_every_step(tmp_path: Path, slot: SlotInfo | None,
                                           error: type[Exception], drop: bool,
                                           what: str) -> None:
    files = _files(tmp_path, present=("p.json", "p.catalog", "p.load.json"))
    stored = StoredProgress("app", "42", "db", 100)
    with pytest.raises(error) as exc:
        check_against_slot(stored, slot, slot_name="app", system_identifier="42",
                           database="db", path=tmp_path / "p.json", files=files)
    message = str(exc.value)
    assert what in message
    assert message.endswith(start_over("app", files, drop_slot=drop))
    for path in ("p.json", "p.catalog", "p.load.json"):
        assert f"{tmp_path}/{path}" in message
    assert ("pgcdc slot drop" in message) is drop


def test_status_says_the_same_steps(tmp_path: Path) -> None:
    files = _files(tmp_path, present=("p.json", "p.catalog"))
    gone = progress_check(100, False, None, None, slot="app", files=files)
    assert gone.startswith(LOST) and gone.endswith(start_over("app", files, drop_slot=False))
    lost = progress_check(100, True, "lost", 100, slot="app", files=files)
    assert lost.endswith(start_over("app", files, drop_slot=True))
    assert f"{tmp_path}/p.catalog" in lost and 'pgcdc slot drop --slot "app"' in lost
