"""``pgcdc status``'s progress check and its two renderings, without a server."""

from __future__ import annotations

import json

from pgcdc.status import LOST, progress_check, render


def test_the_progress_check_names_every_loss_and_its_fix() -> None:
    assert progress_check(100, True, "reserved", 100) == "ok"
    assert progress_check(200, True, "extended", 100) == "ok"  # slot behind: replays, no loss
    ahead = progress_check(100, True, "reserved", 200)
    assert ahead.startswith(LOST) and "0/C8 > 0/64" in ahead and "--initial-load" in ahead
    lost = progress_check(100, True, "lost", 100)  # invalidated: never "ok"
    assert lost.startswith(LOST) and "max_slot_wal_keep_size" in lost
    assert progress_check(None, True, "lost", None).startswith(LOST)
    gone = progress_check(100, False, None, None)  # dropped while progress is stored
    assert gone.startswith(LOST) and "slot is gone" in gone and "pgcdc run --initial-load" in gone
    assert not progress_check(None, False, None, None).startswith(LOST)
    assert not progress_check(None, True, "reserved", 5).startswith(LOST)


def test_a_readable_table_by_default_and_json_for_machines() -> None:
    report = {"slot": "pgcdc", "lag_seconds": None, "progress_check": "ok",
              "topics": {"p.public.t": 3, "p._catalog": 1}}
    text = render(report)
    assert text.splitlines() == ["slot            pgcdc", "lag_seconds     -",
                                 "progress_check  ok", "topics",
                                 "  p.public.t  3", "  p._catalog  1"]
    assert json.loads(render(report, as_json=True)) == report
