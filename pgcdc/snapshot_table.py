"""``pgcdc snapshot-table``: ask the running pgcdc (``run --incremental-snapshots``) to read
tables again while streaming, or to pause, resume or cancel that, by a signal row."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import psycopg

from core.errors import ConfigError

if TYPE_CHECKING:
    import argparse

    from pgcdc.config import Settings


def snapshot_table_command(settings: Settings, args: argparse.Namespace) -> int:
    """Write a signal row; the running pgcdc (run --incremental-snapshots) acts on it."""
    from loads.incremental import check_request, install_signal_table, send_signal

    dsn, publication = settings.source.conninfo(), settings.source.publication
    kind = args.action or "execute-snapshot"
    tables = [_sql_table_name(name) for name in args.snapshot_tables]
    data: dict[str, object] = {"tables": tables}
    if kind == "execute-snapshot":
        if not tables:
            msg = "snapshot-table needs at least one TABLE (schema.table) to read"
            raise ConfigError(msg)
        surrogate = [c.strip() for c in args.surrogate_key.split(",")] \
            if args.surrogate_key else None
        check_request(dsn, publication, tables, surrogate, args.from_key, args.to_key)
        data.update(surrogate_key=surrogate, from_key=args.from_key, to_key=args.to_key)
    elif args.from_key or args.to_key or args.surrogate_key:
        msg = "--from-key, --to-key and --surrogate-key go with a new snapshot, not --" + \
            kind.removesuffix("-snapshot").replace("stop", "cancel")
        raise ConfigError(msg)
    with psycopg.connect(dsn, autocommit=True) as conn:
        install_signal_table(conn)
        signal_id = send_signal(conn, kind, data)
    print(f"signal {signal_id} ({kind}) written to pgcdc.signal; the running pgcdc applies it "
          "within a second")
    return 0


def _sql_table_name(name: str) -> str:
    """A TABLE of snapshot-table read as ``--tables`` reads a name (decoder/names.py: a part
    double-quoted as in SQL, an unquoted one taken as written, case kept), written as SQL
    names it: a part that is not a plain lower-case name double-quoted."""
    from decoder.names import TableNameError, parse_table_name

    try:
        parts = parse_table_name(name)
    except TableNameError as exc:
        raise ConfigError(str(exc)) from None
    return ".".join(part if re.fullmatch(r"[a-z_][a-z0-9_$]*", part)
                    else '"' + part.replace('"', '""') + '"' for part in parts)
