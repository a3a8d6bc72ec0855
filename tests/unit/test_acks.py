"""The durability tracker: the durable LSN moves in commit order, only over fully acked work."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sinks.acks import AckTracker, DeliveryError


def test_durable_waits_for_every_message_of_a_transaction() -> None:
    t = AckTracker()
    a1, a2 = t.sent(), t.sent()
    t.end_transaction(100)
    b1 = t.sent()
    t.end_transaction(200)
    assert t.durable_lsn() is None
    t.acked(b1)  # a later transaction first: nothing moves
    assert t.durable_lsn() is None
    t.acked(a1)
    assert t.durable_lsn() is None
    t.acked(a2)
    assert t.durable_lsn() == 200
    assert t.in_flight() == 0


def test_open_transaction_is_never_durable() -> None:
    t = AckTracker()
    h = t.sent()
    t.acked(h)
    assert t.durable_lsn() is None  # no commit seen yet
    t.end_transaction(10)
    assert t.durable_lsn() == 10


def test_empty_transaction_becomes_durable_in_order() -> None:
    t = AckTracker()
    h = t.sent()
    t.end_transaction(10)
    t.end_transaction(20)  # nothing to deliver
    assert t.durable_lsn() is None
    t.acked(h)
    assert t.durable_lsn() == 20


def test_first_error_is_raised_and_stops_progress() -> None:
    t = AckTracker()
    h1, h2 = t.sent(), t.sent()
    t.end_transaction(10)
    t.failed(RuntimeError("first"))
    t.failed(RuntimeError("second"))
    t.acked(h1)
    t.acked(h2)
    with pytest.raises(DeliveryError, match="first") as info:
        t.durable_lsn()
    assert str(info.value.__cause__) == "first"


@given(st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_durable_is_the_longest_fully_acked_prefix(sizes: list[int], rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    t = AckTracker()
    handles = []
    for i, size in enumerate(sizes):
        handles += [(i, t.sent()) for _ in range(size)]
        t.end_transaction((i + 1) * 10)
    rnd.shuffle(handles)
    acked: set[int] = set()
    remaining = dict(enumerate(sizes))
    previous = t.durable_lsn()
    for txn, handle in handles:
        t.acked(handle)
        remaining[txn] -= 1
        if remaining[txn] == 0:
            acked.add(txn)
        prefix = 0
        while prefix < len(sizes) and (sizes[prefix] == 0 or prefix in acked):
            prefix += 1
        durable = t.durable_lsn()
        assert durable == (prefix * 10 if prefix else None)
        assert previous is None or (durable is not None and durable >= previous)
        previous = durable
