"""T15: Kafka keys are deterministic and injective; values follow the Debezium envelope."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from uuid import UUID

from hypothesis import given
from hypothesis import strategies as st

from decoder.change import ChangeEvent
from sinks.envelope import encode_key, encode_value
from snapshot_builder.catalog import Column, TableVersion

TABLE = TableVersion(42, "public", "t", "d", (
    Column("k1", 25, "text", -1, True),
    Column("k2", 25, "text", -1, True),
    Column("v", 1700, "numeric", -1, False),
))

key_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)


def _event(k1: str | None, k2: str | None, **after: object) -> ChangeEvent:
    row = {"k1": k1, "k2": k2, **after}
    return ChangeEvent("c", TABLE, None, row, (), 100, 90, 0, 7, 0)


@given(key_text, key_text, key_text, key_text)
def test_keys_are_injective(a1: str, a2: str, b1: str, b2: str) -> None:
    ka, kb = encode_key(_event(a1, a2)), encode_key(_event(b1, b2))
    assert (ka == kb) == ((a1, a2) == (b1, b2))


@given(key_text, key_text)
def test_keys_decode_back(k1: str, k2: str) -> None:
    key = encode_key(_event(k1, k2))
    assert json.loads(key) == {"k1": k1, "k2": k2}
    assert encode_key(_event(k1, k2)) == key  # deterministic


def test_separator_lookalikes_do_not_collide() -> None:
    assert encode_key(_event("a,b", "c")) != encode_key(_event("a", "b,c"))
    assert encode_key(_event("a\0", "")) != encode_key(_event("a", "\0"))
    assert encode_key(_event(None, "x")) != encode_key(_event("null", "x"))


def test_value_envelope() -> None:
    event = ChangeEvent("u", TABLE, {"k1": "a", "k2": "b", "v": None},
                        {"k1": "a", "k2": "b", "v": Decimal("1.10"),
                         "at": datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
                         "raw": b"\x00\x01", "id": UUID(int=5)},
                        ("big",), 0x1_0000_0010, 0x1_0000_0008, 3, 99, 1_000_000)
    value = json.loads(encode_value(event, server_name="app", now_ms=5))
    assert value["op"] == "u"
    assert value["after"]["v"] == "1.10"
    assert value["after"]["at"] == "2024-01-02T03:04:05.000006+00:00"
    assert value["after"]["raw"] == "AAE="
    assert value["after"]["id"] == "00000000-0000-0000-0000-000000000005"
    assert value["before"] == {"k1": "a", "k2": "b", "v": None}
    assert value["unchanged"] == ["big"]
    source = value["source"]
    assert (source["commit_lsn"], source["ordinal"], source["lsn"]) == (
        0x1_0000_0010, 3, 0x1_0000_0008)
    assert (source["txId"], source["table_oid"], source["table_version"]) == (
        99, 42, TABLE.version)
    assert source["ts_ms"] == 946_684_801_000  # 2000-01-01 + 1 s, in Unix milliseconds
    assert value["ts_ms"] == 5
