"""The COPY BOTH framing of the replication stream: XLogData, keepalives, standby status."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoder import replication
from decoder.errors import DecodeError
from decoder.replication import Keepalive, XLogData, parse_copy_data, standby_status

_PROPERTY = settings(max_examples=300, deadline=None, database=None)

LSN_A = 0x0000_0001_6B37_4D48
LSN_B = 0x0000_0001_6B37_4E10
LSN_C = 0x0000_0001_6B37_4F00
TS = 784_111_777_123_456  # microseconds since 2000-01-01 UTC

U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)


# --- XLogData and keepalive -------------------------------------------------------------------


def test_xlogdata() -> None:
    payload = b"B" + struct.pack("!QqI", LSN_B, TS, 742)
    buf = struct.pack("!cQQq", b"w", LSN_A, LSN_B, TS) + payload
    assert parse_copy_data(buf) == XLogData(
        wal_start=LSN_A, wal_end=LSN_B, send_time=TS, payload=payload
    )


def test_xlogdata_empty_payload_and_signed_time() -> None:
    buf = struct.pack("!cQQq", b"w", 2**64 - 1, 0, -1)
    assert len(buf) == 25
    assert parse_copy_data(buf) == XLogData(wal_start=2**64 - 1, wal_end=0, send_time=-1,
                                            payload=b"")


@pytest.mark.parametrize(("reply_byte", "reply"), [(0, False), (1, True), (2, True)])
def test_keepalive(reply_byte: int, reply: bool) -> None:
    buf = struct.pack("!cQqB", b"k", LSN_C, TS, reply_byte)
    assert len(buf) == 18
    message = parse_copy_data(buf)
    assert message == Keepalive(wal_end=LSN_C, send_time=TS, reply_requested=reply)
    assert isinstance(message, Keepalive)
    assert message.reply_requested is reply


@given(start=U64, end=U64, ts=I64, payload=st.binary(max_size=64))
@_PROPERTY
def test_xlogdata_property(start: int, end: int, ts: int, payload: bytes) -> None:
    buf = struct.pack("!cQQq", b"w", start, end, ts) + payload
    assert parse_copy_data(buf) == XLogData(start, end, ts, payload)


@given(end=U64, ts=I64, reply=st.booleans())
@_PROPERTY
def test_keepalive_property(end: int, ts: int, reply: bool) -> None:
    buf = struct.pack("!cQqB", b"k", end, ts, int(reply))
    assert parse_copy_data(buf) == Keepalive(end, ts, reply)


# --- malformed frames -------------------------------------------------------------------------


def test_empty_frame() -> None:
    with pytest.raises(DecodeError) as info:
        parse_copy_data(b"")
    assert (info.value.tag, info.value.offset) == (None, 0)


@pytest.mark.parametrize("length", range(1, 25))
def test_short_xlogdata(length: int) -> None:
    buf = struct.pack("!cQQq", b"w", LSN_A, LSN_B, TS)[:length]
    with pytest.raises(DecodeError) as info:
        parse_copy_data(buf)
    assert (info.value.tag, info.value.offset) == ("w", length)


@pytest.mark.parametrize(("length", "offset"), [(1, 1), (9, 9), (17, 17), (19, 18), (30, 18)])
def test_keepalive_of_wrong_length(length: int, offset: int) -> None:
    buf = (struct.pack("!cQqB", b"k", LSN_C, TS, 0) + b"\x00" * 12)[:length]
    assert len(buf) == length
    with pytest.raises(DecodeError) as info:
        parse_copy_data(buf)
    assert (info.value.tag, info.value.offset) == ("k", offset)
    assert f"keepalive of {length} bytes" in info.value.reason


@pytest.mark.parametrize("tag", [b"r", b"d", b"B", b"\x00", b"\xff"])
def test_unknown_frame_tag(tag: bytes) -> None:
    buf = tag + struct.pack("!QqB", LSN_C, TS, 0)
    with pytest.raises(DecodeError) as info:
        parse_copy_data(buf)
    assert (info.value.tag, info.value.offset) == (chr(tag[0]), 0)
    assert "unknown CopyData tag" in info.value.reason


@given(buf=st.binary(max_size=40))
@_PROPERTY
def test_fuzz_parse_copy_data(buf: bytes) -> None:
    try:
        message = parse_copy_data(buf)
    except DecodeError as exc:
        assert exc.tag == (chr(buf[0]) if buf else None)
        assert 0 <= exc.offset <= len(buf)
        assert f"offset {exc.offset}" in str(exc)
    else:
        assert isinstance(message, XLogData | Keepalive)
        assert buf[:1] in (b"w", b"k")


# --- standby status update --------------------------------------------------------------------


def test_standby_status_layout() -> None:
    msg = standby_status(LSN_A, LSN_B, LSN_C, reply=True, clock=TS)
    assert len(msg) == 34
    assert msg == (
        b"r"
        + LSN_A.to_bytes(8, "big")
        + LSN_B.to_bytes(8, "big")
        + LSN_C.to_bytes(8, "big")
        + TS.to_bytes(8, "big", signed=True)
        + b"\x01"
    )
    assert struct.unpack("!cQQQqB", msg) == (b"r", LSN_A, LSN_B, LSN_C, TS, 1)


def test_standby_status_without_reply() -> None:
    msg = standby_status(3, 2, 1, clock=-5)
    assert struct.unpack("!cQQQqB", msg) == (b"r", 3, 2, 1, -5, 0)


def test_standby_status_clock_defaults_to_now(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2000-01-01 00:00:01.25 UTC as Unix seconds: 1.25 s after the PostgreSQL epoch
    fake_time = SimpleNamespace(time=lambda: 946_684_801.25)
    monkeypatch.setattr(replication, "time", fake_time)
    msg = standby_status(LSN_A, LSN_A, LSN_A)
    assert struct.unpack("!cQQQqB", msg) == (b"r", LSN_A, LSN_A, LSN_A, 1_250_000, 0)


@given(written=U64, flushed=U64, applied=U64, clock=I64, reply=st.booleans())
@_PROPERTY
def test_standby_status_property(written: int, flushed: int, applied: int, clock: int,
                                 reply: bool) -> None:
    msg = standby_status(written, flushed, applied, reply=reply, clock=clock)
    assert len(msg) == 34
    assert struct.unpack("!cQQQqB", msg) == (b"r", written, flushed, applied, clock, int(reply))
