"""T1: pgoutput bytes captured from a real server (tests/golden/capture.py) parse exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoder import pgoutput as pg
from tests.pgoutput_encoder import encode

GOLDEN = sorted((Path(__file__).parent.parent / "golden").glob("pgoutput_v*.txt"))


def _messages(path: Path) -> list[tuple[str, bool, bytes]]:
    out = []
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        tag, inside, raw = line.split(" ")
        out.append((tag, inside == "1", bytes.fromhex(raw)))
    return out


def test_golden_files_exist() -> None:
    assert [p.name for p in GOLDEN] == ["pgoutput_v3.txt", "pgoutput_v3_binary.txt",
                                        "pgoutput_v4.txt"]


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_every_message_parses_and_reencodes(path: Path) -> None:
    tags = set()
    for tag, streaming, raw in _messages(path):
        message = pg.parse(raw, streaming=streaming)
        assert encode(message, streaming=streaming) == raw
        tags.add(tag)
    assert tags == set("ABCDEIKMOPRSTUYbcpr")


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_golden_content(path: Path) -> None:
    messages = [pg.parse(raw, streaming=s) for _, s, raw in _messages(path)]
    by_type: dict[type, list[pg.Message]] = {}
    for m in messages:
        by_type.setdefault(type(m), []).append(m)

    relation = next(m for m in by_type[pg.Relation] if isinstance(m, pg.Relation)
                    and m.name == "t")
    assert [(c.name, c.is_key) for c in relation.columns] == [
        ("id", True), ("v", False), ("m", False), ("big", False)]
    assert relation.columns[0].type_oid == 23
    assert any(isinstance(m, pg.Type) and m.name == "mood" for m in by_type[pg.Type])

    inserts = [m for m in by_type[pg.Insert] if isinstance(m, pg.Insert) and m.xid is None]
    assert inserts[0].new == ("1", "one", "ok", None)
    updates = [m for m in by_type[pg.Update] if isinstance(m, pg.Update)]
    assert any(u.old_kind == "K" and u.old is not None and u.old[0] == "1" for u in updates)
    assert any(u.old_kind == "O" for u in updates)
    assert any(pg.UNCHANGED_TOAST in u.new for u in updates)

    logical = [m for m in by_type[pg.LogicalMessage] if isinstance(m, pg.LogicalMessage)]
    assert {(m.transactional, m.prefix, m.content) for m in logical} == {
        (True, "pgcdc", b"transactional"), (False, "pgcdc", b"\x00\xff")}
    origin = by_type[pg.Origin][0]
    assert isinstance(origin, pg.Origin) and origin.name == "upstream"
    assert origin.origin_lsn == 0xAB
    truncate = by_type[pg.Truncate][0]
    assert isinstance(truncate, pg.Truncate) and len(truncate.relation_oids) == 1

    aborts = [m for m in by_type[pg.StreamAbort] if isinstance(m, pg.StreamAbort)]
    assert any(a.subxid != a.xid for a in aborts), "the rolled-back savepoint"
    assert any(a.subxid == a.xid for a in aborts), "the rolled-back transaction"
    gids = {m.gid for m in messages if isinstance(m, pg.Prepare | pg.CommitPrepared
                                                    | pg.RollbackPrepared | pg.StreamPrepare)}
    assert gids == {"g1", "g2", "g3"}
