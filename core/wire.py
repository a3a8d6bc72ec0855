"""The wire contract between pgcdc's producer and its consumers: topic and header names.

The Kafka sink (sinks/kafka.py) writes under these names and the Spark job (streaming/)
reads by them; neither spells one out itself.  Standard library only, so a consumer names
what it reads without importing the producer (confluent-kafka, the encoders).

Topics of a prefix ``p``:

* ``p.<schema>.<table>``: one table's changes (:func:`topic_name`, a digest part when a name
  holds characters a topic name cannot);
* ``p._catalog``: every table version (:func:`catalog_topic`);
* ``p._catalog_history``: the catalog's change log, every version by LSN
  (:func:`catalog_history_topic`);
* ``p._messages``: logical decoding messages; ``p._transactions``: BEGIN and END events.

Every change record carries the headers :data:`TABLE_VERSION_HEADER` (the table version its
value is written in) and :data:`FORMAT_HEADER` (its encoding: ``avro``, ``avro-confluent``,
``json``, ``debezium-json``).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Final

TABLE_VERSION_HEADER: Final = "pgcdc.table_version"
FORMAT_HEADER: Final = "pgcdc.format"

CATALOG_SUFFIX: Final = "_catalog"
CATALOG_HISTORY_SUFFIX: Final = f"{CATALOG_SUFFIX}_history"
MESSAGES_SUFFIX: Final = "_messages"
TRANSACTIONS_SUFFIX: Final = "_transactions"

_ILLEGAL_TOPIC_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-]+")  # a name that is its own part of a topic name
_DIGEST_LENGTH = 32  # hex digits of the digest that tells other names apart (topic_name)


def topic_name(prefix: str, schema: str, table: str) -> str:
    """The topic of a table's changes: one table, one topic, whatever its name.

    ``<prefix>.<schema>.<table>`` when both names use only what a topic name allows
    besides the dot (``A-Z a-z 0-9 _ -``), as always.  Any other name (a dot, a space, a
    quote, a letter outside ASCII) has each such character written ``_`` and a fourth
    part, 32 hex digits of the SHA-256 of both names: ``public."orders.dot"`` goes to
    ``<prefix>.public.orders_dot.ca279617...``, never to ``<prefix>.public.orders_dot``, the
    topic of ``public.orders_dot``.  A topic of three parts comes only from those exact
    names, and two names with a digest share one only if 128 bits of SHA-256 collide: no
    two tables share a topic, nor a key space.  (A table dropped and created again under
    its name is one name, one topic: its events say which table they belong to.)"""
    return f"{prefix}.{table_name(schema, table)}"


def table_name(schema: str, table: str) -> str:
    """A table's name where only ``A-Z a-z 0-9 _ -`` and dots between parts may stand (a
    topic, a lake table's folder), one table to one name: ``<schema>.<table>``, or with a
    digest part when either name holds anything else (see :func:`topic_name`)."""
    if _PLAIN_NAME.fullmatch(schema) and _PLAIN_NAME.fullmatch(table):
        return f"{schema}.{table}"
    digest = hashlib.sha256(json.dumps([schema, table]).encode()).hexdigest()[:_DIGEST_LENGTH]
    return ".".join([_ILLEGAL_TOPIC_CHARS.sub("_", schema), _ILLEGAL_TOPIC_CHARS.sub("_", table),
                     digest])


def table_topic_pattern(prefix: str) -> str:
    """A Java/Python regex matching every table topic of ``prefix`` and not the catalog."""
    return (rf"^{re.escape(prefix)}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+"
            rf"(\.[0-9a-f]{{{_DIGEST_LENGTH}}})?$")


def catalog_topic(prefix: str) -> str:
    return f"{prefix}.{CATALOG_SUFFIX}"


def catalog_history_topic(prefix: str) -> str:
    """The catalog history's entries (snapshot_builder/history.py ``Entry.to_json``)."""
    return f"{prefix}.{CATALOG_HISTORY_SUFFIX}"
