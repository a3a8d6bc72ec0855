"""The transfer format of the stream: pgoutput's ``binary`` option, on or off.

``source.binary`` says which: ``off`` streams text; ``on`` streams binary (PostgreSQL
14+) and refuses to start when a published column has a type without a binary decoder
in pgcdc; ``auto`` (the default) streams binary when the server has the option and every
published column's type (and every type it is built from) decodes in binary, text
otherwise.  Either way each value decodes to the same Python value (decoder/binary.py).

A table added to the publication later, or a column added by DDL, is not checked here:
if its type has no binary decoder, its first value stops the stream with
:class:`decoder.binary.BinaryFormatError`; on the restart ``auto`` chooses text.
"""

from __future__ import annotations

import logging
from typing import Any, Final, Literal

import psycopg

from core.errors import TerminalError
from decoder.binary import BinaryDecoders
from decoder.types import load_types

log = logging.getLogger(__name__)

BinarySetting = Literal["auto", "on", "off"]
FIRST_BINARY_VERSION: Final = 140000  # pgoutput's binary option: PostgreSQL 14

_COLUMN_TYPES: Final = """
    SELECT DISTINCT a.atttypid::pg_catalog.int8
      FROM pg_catalog.pg_publication_tables p
      JOIN pg_catalog.pg_namespace n ON n.nspname = p.schemaname
      JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
      JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid
     WHERE p.pubname = %s AND a.attnum > 0 AND NOT a.attisdropped
"""


class BinaryUnsupportedError(TerminalError):
    """``source.binary = on`` where the server or a published column type cannot do it."""


def published_types(conn: psycopg.Connection[Any], publication: str) -> list[int]:
    """The type OIDs of every column of the publication's tables."""
    return sorted(int(row[0]) for row in conn.execute(_COLUMN_TYPES, (publication,)))


def undecodable(conn: psycopg.Connection[Any], oids: list[int],
                decoders: BinaryDecoders) -> list[str]:
    """The names of the types among ``oids`` that pgcdc cannot decode in binary (the
    types are loaded into the decoders' registry first)."""
    load_types(conn, oids, decoders.registry)  # built-in ones without a decoder: their names
    return sorted({decoders.registry.type_name(oid) for oid in oids
                   if not decoders.supports(oid)})


def choose_binary(setting: str, conn: psycopg.Connection[Any], publication: str,
                  decoders: BinaryDecoders) -> bool:
    """Whether to start the stream with ``binary 'true'``; raises
    :class:`BinaryUnsupportedError` when ``setting`` is ``on`` and it cannot be."""
    if setting == "off":
        return False
    if setting not in ("on", "auto"):
        msg = f"source.binary must be auto, on or off (got {setting!r})"
        raise BinaryUnsupportedError(msg)
    version = conn.info.server_version
    if version < FIRST_BINARY_VERSION:
        if setting == "on":
            msg = (f"source.binary = on needs PostgreSQL 14 or later (the server is "
                   f"{version // 10000}): set source.binary = auto or off")
            raise BinaryUnsupportedError(msg)
        return False
    missing = undecodable(conn, published_types(conn, publication), decoders)
    if missing:
        if setting == "on":
            msg = (f"source.binary = on, but pgcdc has no binary decoder for the type(s) "
                   f"{', '.join(missing)} of publication {publication!r}: set "
                   "source.binary = auto (text for this publication) or off")
            raise BinaryUnsupportedError(msg)
        log.info("streaming text, not binary: no binary decoder for %s", ", ".join(missing))
        return False
    return True
