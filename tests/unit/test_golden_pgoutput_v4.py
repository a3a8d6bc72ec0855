"""pgoutput protocol v4 bytes captured from PostgreSQL 16 (``python -m tests.golden.capture
--v4``) parse exactly: streaming 'parallel' (Stream Abort with its abort LSN and time),
two_phase, messages, and the same workload read with origin 'any' and origin 'none'."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from decoder import pgoutput as pg
from decoder.transactions import streamed_xid
from tests.pgoutput_encoder import encode

GOLDEN = Path(__file__).parent.parent / "golden" / "pgoutput_v4.txt"


@dataclass(frozen=True)
class _Section:
    options: dict[str, str]
    lines: list[tuple[str, bool, bytes]]

    @property
    def messages(self) -> list[pg.Message]:
        return [pg.parse(raw, streaming=inside) for _, inside, raw in self.lines]


def _sections() -> list[_Section]:
    sections: list[_Section] = []
    for line in GOLDEN.read_text().splitlines():
        if line.startswith("# options: "):
            words = line.removeprefix("# options: ").split()
            sections.append(_Section(dict(w.split("=", 1) for w in words), []))
        elif line.strip() and not line.startswith("#"):
            tag, inside, raw = line.split(" ")
            sections[-1].lines.append((tag, inside == "1", bytes.fromhex(raw)))
    return sections


SECTIONS = {s.options["origin"]: s for s in _sections()}


def test_captured_from_postgresql_16_with_protocol_4() -> None:
    assert GOLDEN.read_text().startswith("# captured from PostgreSQL 16.")
    assert sorted(SECTIONS) == ["any", "none"]
    for section in SECTIONS.values():
        assert section.options["proto_version"] == "4"
        assert section.options["streaming"] == "parallel"
        assert section.options["two_phase"] == "on"
        assert section.options["messages"] == "true"


@pytest.mark.parametrize("origin", ["any", "none"])
def test_every_message_parses_and_reencodes(origin: str) -> None:
    tags = set()
    for tag, inside, raw in SECTIONS[origin].lines:
        message = pg.parse(raw, streaming=inside)
        assert encode(message, streaming=inside) == raw
        tags.add(tag)
    every = set("ABCDEIKMOPRSTUYbcpr")
    assert tags == (every if origin == "any" else every - {"O"})


@pytest.mark.parametrize("origin", ["any", "none"])
def test_stream_abort_carries_abort_lsn_and_time(origin: str) -> None:
    messages = SECTIONS[origin].messages
    aborts = [m for m in messages if isinstance(m, pg.StreamAbort)]
    assert {a.subxid == a.xid for a in aborts} == {True, False}, \
        "a rolled-back savepoint and a rolled-back transaction"
    begins = [m for m in messages if isinstance(m, pg.Begin)]
    commits = [m for m in messages if isinstance(m, pg.Commit | pg.StreamCommit
                                                  | pg.CommitPrepared)]
    first_lsn = min(b.final_lsn for b in begins)
    last_lsn = max(c.end_lsn for c in commits)
    first_time = min(b.commit_time for b in begins)
    last_time = max(c.commit_time for c in commits)
    for abort in aborts:
        assert abort.abort_lsn is not None and abort.abort_time is not None
        assert first_lsn < abort.abort_lsn < last_lsn
        assert first_time < abort.abort_time < last_time
    stream_commits = {m.xid: m for m in messages if isinstance(m, pg.StreamCommit)}
    savepoint = next(a for a in aborts if a.subxid != a.xid)
    assert savepoint.abort_lsn is not None
    # the savepoint's rollback is decoded no later than its transaction's commit
    assert savepoint.abort_lsn <= stream_commits[savepoint.xid].commit_lsn
    rolled_back = next(a for a in aborts if a.subxid == a.xid)
    assert rolled_back.xid not in stream_commits


def test_origin_any_sends_the_origin_transaction_and_none_leaves_it_out() -> None:
    def origin_rows(messages: list[pg.Message]) -> list[pg.TupleValue]:
        return [m.new[0] for m in messages if isinstance(m, pg.Insert)
                and m.new[1] == "from origin"]

    with_origin = SECTIONS["any"].messages
    origins = [m for m in with_origin if isinstance(m, pg.Origin)]
    assert [(o.name, o.origin_lsn) for o in origins] == [("upstream", 0xAB), ("upstream", 0)]
    assert origin_rows(with_origin) == ["60"]
    # a streamed transaction under the origin: its Origin message sits in the first
    # streamed block, without an xid, and is kept with the whole transaction
    streamed = [(raw, pg.parse(raw, streaming=True)) for tag, inside, raw
                in SECTIONS["any"].lines if tag == "O" and inside]
    assert [m for _, m in streamed] == [pg.Origin(0, "upstream")]
    assert streamed_xid(streamed[0][0]) == 0
    # 0 whatever LSN it names (its first four bytes are not an xid)
    assert streamed_xid(encode(pg.Origin(0x2EB_0000_00AB, "upstream"), streaming=True)) == 0
    without = SECTIONS["none"].messages
    assert not [m for m in without if isinstance(m, pg.Origin)]
    assert origin_rows(without) == []
    # everything before the origin transaction is the same in both
    cut = [raw for _, _, raw in SECTIONS["any"].lines].index(
        next(raw for tag, _, raw in SECTIONS["any"].lines if tag == "O"))
    assert [raw for _, _, raw in SECTIONS["none"].lines] == \
        [raw for _, _, raw in SECTIONS["any"].lines][:cut]


def test_two_phase_truncate_and_messages() -> None:
    messages = SECTIONS["any"].messages
    gids = {(type(m).__name__, m.gid) for m in messages
            if isinstance(m, pg.BeginPrepare | pg.Prepare | pg.CommitPrepared
                          | pg.RollbackPrepared | pg.StreamPrepare)}
    assert gids == {("BeginPrepare", "g1"), ("Prepare", "g1"), ("CommitPrepared", "g1"),
                    ("BeginPrepare", "g2"), ("Prepare", "g2"), ("RollbackPrepared", "g2"),
                    ("StreamPrepare", "g3"), ("CommitPrepared", "g3")}
    truncates = [m for m in messages if isinstance(m, pg.Truncate)]
    assert [t.options for t in truncates] == [
        0, pg.TRUNCATE_CASCADE | pg.TRUNCATE_RESTART_IDENTITY]
    logical = [m for m in messages if isinstance(m, pg.LogicalMessage)]
    assert {(m.transactional, m.prefix, m.content) for m in logical} == {
        (True, "pgcdc", b"transactional"), (False, "pgcdc", b"\x00\xff")}
    starts = [m for m in messages if isinstance(m, pg.StreamStart)]
    assert {s.first_segment for s in starts} == {True, False}
    relation = next(m for m in messages if isinstance(m, pg.Relation) and m.name == "t")
    assert [(c.name, c.type_oid, c.is_key) for c in relation.columns][:2] == [
        ("id", 23, True), ("v", 25, False)]
