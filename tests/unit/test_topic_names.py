"""Topic names (issue 15.6): one table, one topic.  Plain names keep the topics they always
had; any other name gets a digest, so ``public."orders.dot"`` and ``public.orders_dot``
never share a topic or a key space."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from core.wire import catalog_history_topic, catalog_topic, table_topic_pattern, topic_name

# what Kafka accepts in a topic name, and its length limit
_KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")

# PostgreSQL identifiers: up to 63 bytes, never NUL; characters that need escaping on purpose
_names = st.text(alphabet=st.sampled_from('ab_-.Z9 "\';é$ß中'), min_size=1, max_size=8)


def test_plain_names_keep_their_topics() -> None:
    assert topic_name("pgcdc", "public", "orders_dot") == "pgcdc.public.orders_dot"
    assert topic_name("app", "Sales-2", "Order_Items-v2") == "app.Sales-2.Order_Items-v2"


def test_a_dot_in_a_name_is_not_an_underscore() -> None:
    dotted = topic_name("pgcdc", "public", "orders.dot")
    assert dotted != topic_name("pgcdc", "public", "orders_dot")
    # pinned: a topic name is a contract with every consumer, so its digest never changes
    assert dotted == "pgcdc.public.orders_dot.ca279617077a233d9101c0e2e573f86c"
    assert topic_name("pgcdc", "público", "t") == "pgcdc.p_blico.t.a95cca2951867267b783edfea7b63f4b"


def test_schema_and_table_are_not_confused() -> None:
    assert topic_name("p", "a.b", "c") != topic_name("p", "a", "b.c")
    assert topic_name("p", "a b", "c") != topic_name("p", "a", "b c")


@given(_names, _names, _names, _names)
def test_two_tables_never_share_a_topic(schema: str, table: str, other_schema: str,
                                        other_table: str) -> None:
    if (schema, table) != (other_schema, other_table):
        assert topic_name("p", schema, table) != topic_name("p", other_schema, other_table)


@given(_names, _names)
def test_every_table_topic_is_a_kafka_topic_the_job_subscribes_to(schema: str,
                                                                  table: str) -> None:
    topic = topic_name("app.cdc", schema, table)
    assert _KAFKA_TOPIC.fullmatch(topic)
    assert re.fullmatch(table_topic_pattern("app.cdc"), topic)
    assert not re.fullmatch(table_topic_pattern("app"), topic)


def test_the_longest_names_fit_a_kafka_topic() -> None:
    longest = "é" * 31  # 62 bytes: as long as PostgreSQL allows in two-byte letters
    assert _KAFKA_TOPIC.fullmatch(topic_name("pgcdc-production", longest, "x" * 63))
    assert _KAFKA_TOPIC.fullmatch(topic_name("pgcdc-production", "x" * 63, "x" * 63))


def test_the_pattern_matches_no_topic_of_the_catalog() -> None:
    pattern = table_topic_pattern("pgcdc")
    for topic in (catalog_topic("pgcdc"), catalog_history_topic("pgcdc"), "pgcdc._messages",
                  "pgcdc._transactions", "pgcdc.public.t.123", "pgcdc.public.t.x.y"):
        assert not re.fullmatch(pattern, topic), topic


def test_lake_tables_are_one_folder_per_name() -> None:
    """The lake's folders follow the topics' names: no two tables share one."""
    from snapshot_builder.catalog import TableVersion
    from streaming.apply import table_path
    from streaming.schema import TableSpec

    def path(schema: str, name: str) -> str:
        return table_path("file:///lake/", TableSpec(TableVersion(1, schema, name, "d", ())))

    assert path("public", "orders") == "file:///lake/public.orders"  # as before
    names = [("public", "orders dot"), ("public", "orders_dot"), ("public", "orders.dot"),
             ("a.b", "c"), ("a", "b.c"), ("a", "b_c"), ("a_b", "c")]
    assert len({path(*n) for n in names}) == len(names)
    assert path("public", "orders dot").startswith("file:///lake/public.orders_dot.")
