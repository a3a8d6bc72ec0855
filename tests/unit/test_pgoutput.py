"""The pgoutput parser: hand-built messages, a round trip through the test encoder, fuzzing."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder.errors import DecodeError
from decoder.pgoutput import (
    TRUNCATE_CASCADE,
    TRUNCATE_RESTART_IDENTITY,
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RelationColumn,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    parse,
)
from tests.pgoutput_encoder import encode

# deadline=None: no timing assertions; database=None: leave no .hypothesis directory behind
_PROPERTY = settings(max_examples=200, deadline=None, database=None)
_FUZZ = settings(max_examples=400, deadline=None, database=None)

_KNOWN_TAGS = b"BCORYIUDTMSEcAbPKrp"
_MESSAGE_TYPES = (
    Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate, LogicalMessage,
    StreamStart, StreamStop, StreamCommit, StreamAbort, BeginPrepare, Prepare, CommitPrepared,
    RollbackPrepared, StreamPrepare,
)

LSN_A = 0x0000_0001_6B37_4D48  # 1/6B374D48
LSN_B = 0x0000_0001_6B37_4E10
LSN_C = 0xFFFF_FFFF_FFFF_FFF0  # high bit set: LSNs are unsigned
TS = 784_111_777_123_456  # 2024-11-05 08:49:37.123456 UTC, microseconds since 2000-01-01
TS_BEFORE_2000 = -86_400_000_000  # 1999-12-31: timestamps are signed
XID = 742
BIG_XID = 0xFFFF_FFFE  # high bit set: xids are unsigned


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _text(value: str) -> bytes:
    raw = value.encode()
    return b"t" + struct.pack("!i", len(raw)) + raw


def _binary(value: bytes) -> bytes:
    return b"b" + struct.pack("!i", len(value)) + value


def _tuple(*columns: bytes) -> bytes:
    return struct.pack("!h", len(columns)) + b"".join(columns)


# --- hand-built messages ----------------------------------------------------------------------

# (id, bytes, streaming, expected message); built with struct.pack, independent of the encoder
HAND_BUILT: list[tuple[str, bytes, bool, Message]] = [
    (
        "begin",
        struct.pack("!cQqI", b"B", LSN_A, TS, XID),
        False,
        Begin(final_lsn=LSN_A, commit_time=TS, xid=XID),
    ),
    (
        "begin-big-xid",
        struct.pack("!cQqI", b"B", LSN_C, TS_BEFORE_2000, BIG_XID),
        False,
        Begin(final_lsn=LSN_C, commit_time=TS_BEFORE_2000, xid=BIG_XID),
    ),
    (
        "commit",
        struct.pack("!cBQQq", b"C", 0, LSN_A, LSN_B, TS),
        False,
        Commit(flags=0, commit_lsn=LSN_A, end_lsn=LSN_B, commit_time=TS),
    ),
    (
        "origin",
        struct.pack("!cQ", b"O", LSN_B) + _s("node_a"),
        False,
        Origin(origin_lsn=LSN_B, name="node_a"),
    ),
    (
        "relation",
        b"R" + struct.pack("!I", 16384) + _s("public") + _s("orders") + b"d"
        + struct.pack("!h", 3)
        + b"\x01" + _s("id") + struct.pack("!Ii", 20, -1)
        + b"\x00" + _s("note") + struct.pack("!Ii", 1043, 68)
        + b"\x00" + _s("prix_€") + struct.pack("!Ii", 1700, 655366),
        False,
        Relation(
            xid=None, oid=16384, namespace="public", name="orders", replica_identity="d",
            columns=(
                RelationColumn(flags=1, name="id", type_oid=20, typmod=-1),
                RelationColumn(flags=0, name="note", type_oid=1043, typmod=68),
                RelationColumn(flags=0, name="prix_€", type_oid=1700, typmod=655366),
            ),
        ),
    ),
    (
        "relation-streamed-no-columns",
        b"R" + struct.pack("!II", XID, 16390) + _s("s") + _s("empty") + b"f"
        + struct.pack("!h", 0),
        True,
        Relation(xid=XID, oid=16390, namespace="s", name="empty", replica_identity="f",
                 columns=()),
    ),
    (
        "type",
        b"Y" + struct.pack("!I", 16401) + _s("public") + _s("mood"),
        False,
        Type(xid=None, oid=16401, namespace="public", name="mood"),
    ),
    (
        "type-streamed",
        b"Y" + struct.pack("!II", BIG_XID, 16401) + _s("public") + _s("mood"),
        True,
        Type(xid=BIG_XID, oid=16401, namespace="public", name="mood"),
    ),
    (
        "insert-every-column-kind",
        b"I" + struct.pack("!I", 16384) + b"N"
        + _tuple(_text("42"), b"n", b"u", _binary(b"\x00\xffraw"), _text(""), _text("héllo")),
        False,
        Insert(xid=None, relation_oid=16384,
               new=("42", None, UNCHANGED_TOAST, b"\x00\xffraw", "", "héllo")),
    ),
    (
        "insert-streamed",
        b"I" + struct.pack("!II", XID, 16384) + b"N" + _tuple(_text("1")),
        True,
        Insert(xid=XID, relation_oid=16384, new=("1",)),
    ),
    (
        "insert-no-columns",
        b"I" + struct.pack("!I", 16384) + b"N" + _tuple(),
        False,
        Insert(xid=None, relation_oid=16384, new=()),
    ),
    (
        "update-new-only",
        b"U" + struct.pack("!I", 16384) + b"N" + _tuple(_text("1"), b"u"),
        False,
        Update(xid=None, relation_oid=16384, old_kind=None, old=None, new=("1", UNCHANGED_TOAST)),
    ),
    (
        "update-old-key",
        b"U" + struct.pack("!I", 16384) + b"K" + _tuple(_text("1"), b"n")
        + b"N" + _tuple(_text("2"), _text("x")),
        False,
        Update(xid=None, relation_oid=16384, old_kind="K", old=("1", None), new=("2", "x")),
    ),
    (
        "update-old-tuple-streamed",
        b"U" + struct.pack("!II", XID, 16384) + b"O" + _tuple(_text("1"), _text("a"))
        + b"N" + _tuple(_text("1"), _text("b")),
        True,
        Update(xid=XID, relation_oid=16384, old_kind="O", old=("1", "a"), new=("1", "b")),
    ),
    (
        "delete-key",
        b"D" + struct.pack("!I", 16384) + b"K" + _tuple(_text("7"), b"n"),
        False,
        Delete(xid=None, relation_oid=16384, old_kind="K", old=("7", None)),
    ),
    (
        "delete-old-tuple-streamed",
        b"D" + struct.pack("!II", XID, 16384) + b"O" + _tuple(_text("7"), _binary(b"")),
        True,
        Delete(xid=XID, relation_oid=16384, old_kind="O", old=("7", b"")),
    ),
    (
        "truncate",
        b"T" + struct.pack("!IBII", 2, TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY, 16384, 16390),
        False,
        Truncate(xid=None, options=3, relation_oids=(16384, 16390)),
    ),
    (
        "truncate-streamed",
        b"T" + struct.pack("!IIBI", XID, 1, 0, 16384),
        True,
        Truncate(xid=XID, options=0, relation_oids=(16384,)),
    ),
    (
        "message-transactional",
        b"M" + struct.pack("!BQ", 1, LSN_A) + _s("pgcdc") + struct.pack("!I", 5) + b"hello",
        False,
        LogicalMessage(xid=None, transactional=True, lsn=LSN_A, prefix="pgcdc", content=b"hello"),
    ),
    (
        "message-non-transactional-empty",
        b"M" + struct.pack("!BQ", 0, LSN_A) + _s("") + struct.pack("!I", 0),
        False,
        LogicalMessage(xid=None, transactional=False, lsn=LSN_A, prefix="", content=b""),
    ),
    (
        "message-streamed",
        b"M" + struct.pack("!IBQ", XID, 1, LSN_B) + _s("p") + struct.pack("!I", 2) + b"\x00\x01",
        True,
        LogicalMessage(xid=XID, transactional=True, lsn=LSN_B, prefix="p", content=b"\x00\x01"),
    ),
    (
        "stream-start-first",
        struct.pack("!cIB", b"S", XID, 1),
        False,
        StreamStart(xid=XID, first_segment=True),
    ),
    (
        "stream-start-later",
        struct.pack("!cIB", b"S", XID, 0),
        False,
        StreamStart(xid=XID, first_segment=False),
    ),
    ("stream-stop", b"E", True, StreamStop()),
    (
        "stream-commit",
        struct.pack("!cIBQQq", b"c", XID, 0, LSN_A, LSN_B, TS),
        False,
        StreamCommit(xid=XID, flags=0, commit_lsn=LSN_A, end_lsn=LSN_B, commit_time=TS),
    ),
    (
        "stream-abort",
        struct.pack("!cII", b"A", XID, 743),
        False,
        StreamAbort(xid=XID, subxid=743, abort_lsn=None, abort_time=None),
    ),
    (
        "stream-abort-v4",
        struct.pack("!cIIQq", b"A", XID, 743, LSN_B, TS),
        False,
        StreamAbort(xid=XID, subxid=743, abort_lsn=LSN_B, abort_time=TS),
    ),
    (
        "stream-abort-v4-before-2000",
        struct.pack("!cIIQq", b"A", XID, XID, LSN_C, TS_BEFORE_2000),
        False,
        StreamAbort(xid=XID, subxid=XID, abort_lsn=LSN_C, abort_time=TS_BEFORE_2000),
    ),
    (
        "begin-prepare",
        struct.pack("!cQQqI", b"b", LSN_A, LSN_B, TS, XID) + _s("gid-1"),
        False,
        BeginPrepare(prepare_lsn=LSN_A, end_lsn=LSN_B, prepare_time=TS, xid=XID, gid="gid-1"),
    ),
    (
        "prepare",
        struct.pack("!cBQQqI", b"P", 0, LSN_A, LSN_B, TS, XID) + _s("gid-1"),
        False,
        Prepare(flags=0, prepare_lsn=LSN_A, end_lsn=LSN_B, prepare_time=TS, xid=XID, gid="gid-1"),
    ),
    (
        "commit-prepared",
        struct.pack("!cBQQqI", b"K", 0, LSN_A, LSN_B, TS, XID) + _s("gid-1"),
        False,
        CommitPrepared(flags=0, commit_lsn=LSN_A, end_lsn=LSN_B, commit_time=TS, xid=XID,
                       gid="gid-1"),
    ),
    (
        "rollback-prepared",
        struct.pack("!cBQQqqI", b"r", 0, LSN_A, LSN_B, TS, TS + 1, XID) + _s("gid-2"),
        False,
        RollbackPrepared(flags=0, prepare_end_lsn=LSN_A, rollback_end_lsn=LSN_B,
                         prepare_time=TS, rollback_time=TS + 1, xid=XID, gid="gid-2"),
    ),
    (
        "stream-prepare",
        struct.pack("!cBQQqI", b"p", 0, LSN_A, LSN_B, TS, BIG_XID) + _s("gid-3"),
        False,
        StreamPrepare(flags=0, prepare_lsn=LSN_A, end_lsn=LSN_B, prepare_time=TS, xid=BIG_XID,
                      gid="gid-3"),
    ),
]


@pytest.mark.parametrize(
    ("buf", "streaming", "expected"), [case[1:] for case in HAND_BUILT],
    ids=[case[0] for case in HAND_BUILT],
)
def test_parse_hand_built(buf: bytes, streaming: bool, expected: Message) -> None:
    assert parse(buf, streaming=streaming) == expected


@pytest.mark.parametrize(
    ("buf", "streaming", "expected"), [case[1:] for case in HAND_BUILT],
    ids=[case[0] for case in HAND_BUILT],
)
def test_encoder_matches_hand_built(buf: bytes, streaming: bool, expected: Message) -> None:
    assert encode(expected, streaming=streaming) == buf


def test_hand_built_cases_cover_every_message_type() -> None:
    assert {type(case[3]) for case in HAND_BUILT} == set(_MESSAGE_TYPES)


def test_begin_xid_is_four_bytes() -> None:
    buf = struct.pack("!cQqI", b"B", LSN_A, TS, XID)
    assert len(buf) == 21
    assert parse(buf).xid == XID  # type: ignore[union-attr]
    # the common bug reads the xid as 8 bytes: such a message has 4 bytes too many
    as_eight = struct.pack("!cQqQ", b"B", LSN_A, TS, XID)
    with pytest.raises(DecodeError) as info:
        parse(as_eight)
    assert (info.value.tag, info.value.offset) == ("B", 21)


def test_unchanged_toast_is_the_singleton() -> None:
    buf = b"I" + struct.pack("!I", 1) + b"N" + _tuple(b"u")
    message = parse(buf)
    assert isinstance(message, Insert)
    assert message.new[0] is UNCHANGED_TOAST


def test_relation_column_is_key() -> None:
    assert RelationColumn(flags=1, name="id", type_oid=20, typmod=-1).is_key
    assert not RelationColumn(flags=0, name="v", type_oid=25, typmod=-1).is_key


# --- malformed messages -----------------------------------------------------------------------


def test_empty_buffer() -> None:
    with pytest.raises(DecodeError) as info:
        parse(b"")
    assert (info.value.tag, info.value.offset) == (None, 0)


@pytest.mark.parametrize("tag", sorted(set(range(256)) - set(_KNOWN_TAGS)))
def test_unknown_tag(tag: int) -> None:
    buf = bytes([tag]) + struct.pack("!cQqI", b"B", LSN_A, TS, XID)
    with pytest.raises(DecodeError) as info:
        parse(buf)
    assert (info.value.tag, info.value.offset) == (chr(tag), 0)
    assert "unknown message tag" in info.value.reason


@pytest.mark.parametrize(
    ("buf", "streaming", "tag", "offset"),
    [
        (b"E\x00", True, "E", 1),
        (struct.pack("!cQqI", b"B", LSN_A, TS, XID) + b"\x00", False, "B", 21),
        (struct.pack("!cBQQq", b"C", 0, LSN_A, LSN_B, TS) + b"junk", False, "C", 26),
        (b"Y" + struct.pack("!I", 1) + _s("a") + _s("b") + b"\x00", False, "Y", 9),
        (b"I" + struct.pack("!I", 1) + b"N" + _tuple(b"n") + b"n", False, "I", 9),
        (struct.pack("!cIIQq", b"A", XID, 1, LSN_A, TS) + b"\x00", False, "A", 25),
        (struct.pack("!cBQQqI", b"P", 0, LSN_A, LSN_B, TS, XID) + _s("g") + b"\x00", False, "P",
         32),
    ],
    ids=["stream-stop", "begin", "commit", "type", "insert", "stream-abort-v4", "prepare"],
)
def test_trailing_garbage(buf: bytes, streaming: bool, tag: str, offset: int) -> None:
    with pytest.raises(DecodeError) as info:
        parse(buf, streaming=streaming)
    assert (info.value.tag, info.value.offset) == (tag, offset)
    assert "trailing" in info.value.reason


_INSERT_HEAD = b"I" + struct.pack("!I", 16384) + b"N"


@pytest.mark.parametrize(
    ("buf", "streaming", "offset", "reason"),
    [
        # a tuple column of an unknown kind: the offset points at the kind byte
        (_INSERT_HEAD + _tuple(b"n", b"x"), False, 9, "unknown tuple column kind"),
        (_INSERT_HEAD + b"\x00\x01t" + struct.pack("!i", -1), False, 13, "column length -1"),
        (_INSERT_HEAD + b"\x00\x01t" + struct.pack("!i", 4) + b"abc", False, 13,
         "exceeds the message"),
        (_INSERT_HEAD + b"\x00\x01t\x00\x00", False, 9, "cut short"),
        (_INSERT_HEAD + _tuple(b"t" + struct.pack("!i", 2) + b"\xc3\x28"), False, 15,
         "not valid UTF-8"),
        (_INSERT_HEAD + b"\x00\x02n", False, 9, "ends before its last column"),
        (_INSERT_HEAD + b"\xff\xff", False, 8, "negative column count"),
        # Insert carries only a new tuple
        (b"I" + struct.pack("!I", 16384) + b"K" + _tuple(b"n"), False, 5, "expected one of 'N'"),
        (b"U" + struct.pack("!I", 16384) + b"X" + _tuple(b"n"), False, 5, "expected one of"),
        (b"U" + struct.pack("!I", 1) + b"K" + _tuple(b"n") + b"K" + _tuple(b"n"), False, 9,
         "expected one of 'N'"),
        (b"D" + struct.pack("!I", 16384) + b"N" + _tuple(b"n"), False, 5, "expected one of 'KO'"),
        # a streamed Insert read as if outside a streamed block: the oid's 0x00 is not 'N'
        (b"I" + struct.pack("!II", 7, 16384) + b"N" + _tuple(b"n"), False, 5, "expected one of"),
        (b"O" + struct.pack("!Q", LSN_A) + b"no-nul", False, 9, "without terminating NUL"),
        (b"O" + struct.pack("!Q", LSN_A) + b"\xff\xfe\x00", False, 12, "not valid UTF-8"),
        (b"R" + struct.pack("!I", 1) + _s("a") + _s("b") + b"d\xff\xff", False, 12,
         "negative column count"),
        (b"T" + struct.pack("!IB", 3, 0) + struct.pack("!II", 1, 2), False, 6, "needs 12 more"),
        (b"M" + struct.pack("!BQ", 1, LSN_A) + _s("p") + struct.pack("!I", 9) + b"short", False,
         16, "needs 9 more"),
        (struct.pack("!cQqI", b"B", LSN_A, TS, XID)[:-1], False, 1, "needs 20 more"),
        (struct.pack("!cIIQ", b"A", XID, 1, LSN_A), False, 9, "needs 16 more"),
    ],
)
def test_malformed(buf: bytes, streaming: bool, offset: int, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        parse(buf, streaming=streaming)
    assert info.value.tag == chr(buf[0])
    assert info.value.offset == offset
    assert reason in info.value.reason
    assert f"offset {offset}" in str(info.value)


# --- strategies -------------------------------------------------------------------------------

U8 = st.integers(0, 0xFF)
I32 = st.integers(-(2**31), 2**31 - 1)
U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
COLUMN_VALUES = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.text(st.characters(codec="utf-8"), max_size=12),
    st.binary(max_size=12),
)
TUPLES = st.lists(COLUMN_VALUES, max_size=6).map(tuple)
COLUMNS = st.lists(
    st.builds(RelationColumn, flags=U8, name=NAMES, type_oid=U32, typmod=I32), max_size=5
).map(tuple)

# (message, streaming); the streaming flag matters only to the types that carry an xid
Case = tuple[Message, bool]


def _plain(cls: type, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Case]:
    return st.tuples(st.builds(cls, **fields), st.booleans())


def _streamed(cls: type, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Case]:
    # outside a streamed block the xid is None, inside it is the transaction's xid
    outside = st.tuples(st.builds(cls, xid=st.none(), **fields), st.just(False))
    inside = st.tuples(st.builds(cls, xid=U32, **fields), st.just(True))
    return st.one_of(outside, inside)


_UPDATE_OLD = st.one_of(
    st.just((None, None)),
    st.tuples(st.sampled_from("KO"), TUPLES),
)

STRATEGIES: dict[str, st.SearchStrategy[Case]] = {
    "Begin": _plain(Begin, final_lsn=U64, commit_time=I64, xid=U32),
    "Commit": _plain(Commit, flags=U8, commit_lsn=U64, end_lsn=U64, commit_time=I64),
    "Origin": _plain(Origin, origin_lsn=U64, name=NAMES),
    "Relation": _streamed(
        Relation, oid=U32, namespace=NAMES, name=NAMES,
        replica_identity=st.sampled_from("dnfi") | U8.map(chr), columns=COLUMNS,
    ),
    "Type": _streamed(Type, oid=U32, namespace=NAMES, name=NAMES),
    "Insert": _streamed(Insert, relation_oid=U32, new=TUPLES),
    "Update": _UPDATE_OLD.flatmap(
        lambda old: _streamed(
            Update, relation_oid=U32, old_kind=st.just(old[0]), old=st.just(old[1]), new=TUPLES
        )
    ),
    "Delete": _streamed(Delete, relation_oid=U32, old_kind=st.sampled_from("KO"), old=TUPLES),
    "Truncate": _streamed(
        Truncate, options=U8, relation_oids=st.lists(U32, max_size=6).map(tuple)
    ),
    "LogicalMessage": _streamed(
        LogicalMessage, transactional=st.booleans(), lsn=U64, prefix=NAMES,
        content=st.binary(max_size=40),
    ),
    "StreamStart": _plain(StreamStart, xid=U32, first_segment=st.booleans()),
    "StreamStop": _plain(StreamStop),
    "StreamCommit": _plain(
        StreamCommit, xid=U32, flags=U8, commit_lsn=U64, end_lsn=U64, commit_time=I64
    ),
    "StreamAbort": _plain(StreamAbort, xid=U32, subxid=U32, abort_lsn=st.none(),
                          abort_time=st.none())
    | _plain(StreamAbort, xid=U32, subxid=U32, abort_lsn=U64, abort_time=I64),
    "BeginPrepare": _plain(
        BeginPrepare, prepare_lsn=U64, end_lsn=U64, prepare_time=I64, xid=U32, gid=NAMES
    ),
    "Prepare": _plain(
        Prepare, flags=U8, prepare_lsn=U64, end_lsn=U64, prepare_time=I64, xid=U32, gid=NAMES
    ),
    "CommitPrepared": _plain(
        CommitPrepared, flags=U8, commit_lsn=U64, end_lsn=U64, commit_time=I64, xid=U32,
        gid=NAMES,
    ),
    "RollbackPrepared": _plain(
        RollbackPrepared, flags=U8, prepare_end_lsn=U64, rollback_end_lsn=U64,
        prepare_time=I64, rollback_time=I64, xid=U32, gid=NAMES,
    ),
    "StreamPrepare": _plain(
        StreamPrepare, flags=U8, prepare_lsn=U64, end_lsn=U64, prepare_time=I64, xid=U32,
        gid=NAMES,
    ),
}
ANY_MESSAGE = st.one_of(*STRATEGIES.values())


def test_strategies_cover_every_message_type() -> None:
    assert set(STRATEGIES) == {cls.__name__ for cls in _MESSAGE_TYPES}


# --- round trip -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
@_PROPERTY
@given(data=st.data())
def test_round_trip(kind: str, data: st.DataObject) -> None:
    message, streaming = data.draw(STRATEGIES[kind])
    assert type(message).__name__ == kind
    assert parse(encode(message, streaming), streaming=streaming) == message


# --- fuzzing ----------------------------------------------------------------------------------


def _parse_or_error(buf: bytes, streaming: bool) -> Message | None:
    """Parse ``buf``; a DecodeError is checked and gives None, any other exception fails."""
    try:
        message = parse(buf, streaming=streaming)
    except DecodeError as exc:
        assert exc.tag == (chr(buf[0]) if buf else None)
        assert isinstance(exc.offset, int)
        assert 0 <= exc.offset <= len(buf)
        assert exc.reason
        assert f"offset {exc.offset}" in str(exc)
        return None
    # whatever parses is a message the encoder writes back to something that parses the same
    assert isinstance(message, _MESSAGE_TYPES)
    assert parse(encode(message, streaming), streaming=streaming) == message
    return message


@_FUZZ
@given(buf=st.binary(max_size=80), streaming=st.booleans())
def test_fuzz_arbitrary_bytes(buf: bytes, streaming: bool) -> None:
    _parse_or_error(buf, streaming)


@_FUZZ
@given(tag=st.sampled_from(_KNOWN_TAGS), body=st.binary(max_size=80), streaming=st.booleans())
def test_fuzz_known_tag_arbitrary_body(tag: int, body: bytes, streaming: bool) -> None:
    _parse_or_error(bytes([tag]) + body, streaming)


@_FUZZ
@given(case=ANY_MESSAGE)
def test_fuzz_truncated(case: Case) -> None:
    message, streaming = case
    buf = encode(message, streaming)
    for n in range(len(buf)):
        result = _parse_or_error(buf[:n], streaming)
        if isinstance(message, StreamAbort) and message.abort_lsn is not None and n == 9:
            # a protocol 4 abort cut before its LSN is a complete protocol 1-3 abort
            assert result == StreamAbort(message.xid, message.subxid, None, None)
        else:
            assert result is None, f"prefix of {n} bytes parsed as {result!r}"


@_FUZZ
@given(case=ANY_MESSAGE, data=st.data())
def test_fuzz_flipped_byte(case: Case, data: st.DataObject) -> None:
    message, streaming = case
    buf = bytearray(encode(message, streaming))
    index = data.draw(st.integers(0, len(buf) - 1), label="index")
    buf[index] ^= data.draw(st.integers(1, 0xFF), label="mask")
    _parse_or_error(bytes(buf), data.draw(st.booleans(), label="streaming"))


@_PROPERTY
@given(case=ANY_MESSAGE, garbage=st.binary(min_size=1, max_size=8))
def test_trailing_garbage_property(case: Case, garbage: bytes) -> None:
    message, streaming = case
    buf = encode(message, streaming)
    if isinstance(message, StreamAbort) and message.abort_lsn is None:
        # more bytes after a protocol 1-3 abort are read as the protocol 4 fields
        with pytest.raises(DecodeError) as info:
            parse(buf + garbage[:7], streaming=streaming)
        assert (info.value.tag, info.value.offset) == ("A", 9)
        return
    with pytest.raises(DecodeError) as info:
        parse(buf + garbage, streaming=streaming)
    assert info.value.tag == chr(buf[0])
    assert info.value.offset == len(buf)
    assert f"{len(garbage)} trailing bytes" in info.value.reason
