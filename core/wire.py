"""The wire contract between pgcdc's producer and its consumers: topic and header names,
the change envelope's field names, the catalog record's keys.

The Kafka sink (sinks/kafka.py) and its encoders (sinks/envelope.py, sinks/avro.py) write
under these names and the Spark job (streaming/) reads by them; neither spells one out
itself.  Standard library only, so a consumer names what it reads without importing the
producer (confluent-kafka, the encoders).  (The compiled encoders, sinks/_fastjson.c and
sinks/_fastavro.c, write the same bytes: their tests compare them with the Python ones.)

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

A change record's value is the envelope: :data:`BEFORE`, :data:`AFTER` (the row, column
name to value, or null), :data:`SOURCE` (where the change comes from: the ``SOURCE_*``
fields), :data:`OP` (``c``, ``u``, ``d``, ``r`` for a read, ``t``), :data:`TS_MS` (when it
was written) and pgcdc's :data:`UNCHANGED` (the columns whose TOASTed value was not resent);
Debezium's JSON encoding adds :data:`TRANSACTION`, :data:`TS_US`, :data:`TS_NS`.  In Avro,
each row field keeps its column's real name in the attribute :data:`COLUMN_ATTRIBUTE` (the
field's own name is an Avro name).

A catalog record (key :func:`catalog_key`, value a JSON object) is a table version as
snapshot_builder/catalog.py ``TableVersion.to_dict`` writes it (the ``CATALOG_*`` keys up to
:data:`CATALOG_TYPES`, each column an object of the ``COLUMN_*`` keys), extended
by the sink with :data:`CATALOG_LSN`, :data:`CATALOG_TOPIC`, :data:`CATALOG_VALUE_FORMAT`
(the format header of its events) and, for Avro, :data:`CATALOG_KEY_SCHEMA`,
:data:`CATALOG_VALUE_SCHEMA` (the writer schemas, JSON text) and, for typed Avro,
:data:`CATALOG_AVRO_TYPES` (``logical``; absent: ``text``).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Final

TABLE_VERSION_HEADER: Final = "pgcdc.table_version"
FORMAT_HEADER: Final = "pgcdc.format"

# the FORMAT_HEADER's values
FORMAT_JSON: Final = "json"  # pgcdc's own JSON encoding (--json-mode pgcdc)
FORMAT_DEBEZIUM_JSON: Final = "debezium-json"  # Debezium's JSON encoding
FORMAT_AVRO: Final = "avro"  # Avro binary, its writer schema in the catalog record
FORMAT_AVRO_CONFLUENT: Final = "avro-confluent"  # the same after the registry's 5 bytes

# the envelope: a change record's value
BEFORE: Final = "before"
AFTER: Final = "after"
SOURCE: Final = "source"
OP: Final = "op"
TS_MS: Final = "ts_ms"
UNCHANGED: Final = "unchanged"
TRANSACTION: Final = "transaction"  # Debezium's JSON encoding only, as the two below
TS_US: Final = "ts_us"
TS_NS: Final = "ts_ns"

# the envelope's source block, in the order pgcdc writes it (Debezium's fields, then pgcdc's)
SOURCE_VERSION: Final = "version"
SOURCE_CONNECTOR: Final = "connector"
SOURCE_NAME: Final = "name"  # the server name: the topic prefix
SOURCE_TS_MS: Final = "ts_ms"  # the commit time
SOURCE_SNAPSHOT: Final = "snapshot"
SOURCE_DB: Final = "db"
SOURCE_SEQUENCE: Final = "sequence"  # Debezium's JSON encoding only, as the two below
SOURCE_TS_US: Final = "ts_us"
SOURCE_TS_NS: Final = "ts_ns"
SOURCE_SCHEMA: Final = "schema"
SOURCE_TABLE: Final = "table"
SOURCE_TX_ID: Final = "txId"
SOURCE_LSN: Final = "lsn"
SOURCE_XMIN: Final = "xmin"  # Debezium's JSON encoding only, as the two below
SOURCE_ORIGIN: Final = "origin"
SOURCE_ORIGIN_LSN: Final = "origin_lsn"
SOURCE_COMMIT_LSN: Final = "commit_lsn"  # pgcdc's: the position of the change
SOURCE_ORDINAL: Final = "ordinal"  # in its transaction
SOURCE_TABLE_OID: Final = "table_oid"
SOURCE_TABLE_VERSION: Final = "table_version"
# what the source block's version and connector say
PRODUCER_VERSION: Final = "pgcdc-1"
CONNECTOR: Final = "pgcdc"

COLUMN_ATTRIBUTE: Final = "pgcdc.column"  # an Avro row field's attribute: its column's name

# the catalog record: a table version ...
CATALOG_RECORD_FORMAT: Final = "format"  # of TableVersion.to_dict: 1
CATALOG_OID: Final = "oid"
CATALOG_SCHEMA: Final = "schema"
CATALOG_NAME: Final = "name"
CATALOG_VERSION: Final = "version"
CATALOG_LAYOUT: Final = "layout"
CATALOG_REPLICA_IDENTITY: Final = "replica_identity"  # pg_class.relreplident
CATALOG_COLUMNS: Final = "columns"
CATALOG_COMMENT: Final = "comment"  # optional, as the one below
CATALOG_PARTITION_PARENT: Final = "partition_parent"
CATALOG_PUBLISHED: Final = "published"  # optional: false for a table outside the publication
CATALOG_TYPES: Final = "types"  # optional: the composite types' changes it was given
# ... as the sink publishes it
CATALOG_LSN: Final = "lsn"
CATALOG_TOPIC: Final = "topic"
CATALOG_VALUE_FORMAT: Final = "value_format"
CATALOG_KEY_SCHEMA: Final = "key_schema"
CATALOG_VALUE_SCHEMA: Final = "value_schema"
CATALOG_AVRO_TYPES: Final = "avro_types"
AVRO_TYPES_TEXT: Final = "text"  # CATALOG_AVRO_TYPES' values
AVRO_TYPES_LOGICAL: Final = "logical"
# a column of CATALOG_COLUMNS
COLUMN_NAME: Final = "name"
COLUMN_TYPE_OID: Final = "type_oid"
COLUMN_TYPE_NAME: Final = "type_name"
COLUMN_TYPMOD: Final = "typmod"
COLUMN_KEY: Final = "key"
COLUMN_NOT_NULL: Final = "not_null"  # optional, as those below
COLUMN_DEFAULT: Final = "default"
COLUMN_ATTNUM: Final = "attnum"
COLUMN_BASE_TYPE: Final = "base_type"  # a domain's built-in base type, and its typmod
COLUMN_BASE_TYPMOD: Final = "base_typmod"

# a ``<prefix>._messages`` record (JSON): one logical decoding message
MESSAGE_PREFIX: Final = "prefix"
MESSAGE_TRANSACTIONAL: Final = "transactional"
MESSAGE_CONTENT: Final = "content"  # base64
MESSAGE_LSN: Final = "lsn"
MESSAGE_COMMIT_LSN: Final = "commit_lsn"
MESSAGE_XID: Final = "xid"

# a transaction topic's record (JSON, Debezium's transaction metadata): BEGIN, then END with
# the events per table
TXN_STATUS: Final = "status"
TXN_ID: Final = "id"
TXN_TS_MS: Final = "ts_ms"
TXN_EVENT_COUNT: Final = "event_count"
TXN_DATA_COLLECTIONS: Final = "data_collections"
TXN_DATA_COLLECTION: Final = "data_collection"

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


def catalog_key(oid: int, version: str) -> bytes:
    """The key of a table version's catalog record: ``<oid>.<version>``."""
    return f"{oid}.{version}".encode()


def catalog_history_topic(prefix: str) -> str:
    """The catalog history's entries (snapshot_builder/history.py ``Entry.to_json``)."""
    return f"{prefix}.{CATALOG_HISTORY_SUFFIX}"
