"""Errors of the decoder: the protocol, the replication stream and the slot."""

from __future__ import annotations

from core.errors import ConfigError, PgcdcError, TerminalError, TransientError


class DecodeError(TerminalError):
    """A pgoutput or replication message could not be parsed.

    Carries the message tag and the byte offset where parsing failed, so a
    captured buffer can be replayed against the parser.
    """

    def __init__(self, reason: str, *, tag: str | None, offset: int) -> None:
        self.reason = reason
        self.tag = tag
        self.offset = offset
        where = f"message {tag!r}" if tag else "message"
        super().__init__(
            f"malformed pgoutput {where} at offset {offset}: {reason}; "
            "this is a bug or a protocol mismatch: report it with the server version"
        )


class ReplicationError(PgcdcError):
    """Base of replication stream and slot errors."""


class WalLevelError(ReplicationError, TerminalError):
    def __init__(self, level: str) -> None:
        super().__init__(
            f"PostgreSQL runs with wal_level={level}, logical decoding needs wal_level=logical: "
            "set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) "
            "and restart the server"
        )


class SlotInUseError(ReplicationError, TransientError):
    def __init__(self, slot: str, pid: int | None) -> None:
        who = f"PID {pid}" if pid else "another process"
        super().__init__(
            f'replication slot "{slot}" is active for {who}; '
            "stop the other consumer or choose another slot with --slot"
        )


class SlotMissingError(ReplicationError, TerminalError):
    def __init__(self, slot: str) -> None:
        super().__init__(
            f'replication slot "{slot}" does not exist; '
            "create it with 'pgcdc slot create' (or let 'pgcdc run --create-slot' do it)"
        )


class SlotInvalidatedError(ReplicationError, TerminalError):
    def __init__(self, slot: str) -> None:
        super().__init__(
            f'replication slot "{slot}" was invalidated (wal_status lost): PostgreSQL removed '
            "WAL it still needed (max_slot_wal_keep_size was exceeded), so changes are lost; "
            "re-snapshot the tables into a new slot (pgcdc snapshot) and raise "
            "max_slot_wal_keep_size or keep pgcdc running"
        )


class PublicationMissingError(ReplicationError, TerminalError):
    def __init__(self, publication: str) -> None:
        super().__init__(
            f'publication "{publication}" does not exist; create it '
            f"(CREATE PUBLICATION {publication} FOR TABLE ...) or let pgcdc create it "
            "with --create-publication"
        )


class PublishedTableMissingError(ReplicationError, ConfigError):
    """A table to publish (``--tables``) that does not exist: a configuration error."""

    def __init__(self, publication: str, tables: list[str], reason: str) -> None:
        super().__init__(
            f"cannot create publication {publication} for --tables {','.join(tables)}: "
            f"{reason.strip()}; name existing tables as schema.table, as the catalog "
            "spells them (a part holding a comma, a dot or a double quote double-quoted, "
            'an inner double quote doubled: public."my,table"), or create the table first')


class MissingIdentityError(ReplicationError, TerminalError):
    def __init__(self, tables: list[str]) -> None:
        names = ", ".join(tables)
        super().__init__(
            f"table(s) {names} have neither a primary key nor a usable replica identity, "
            "so their updates and deletes cannot be keyed: add a primary key, or run "
            "ALTER TABLE ... REPLICA IDENTITY USING INDEX <unique index> (or REPLICA IDENTITY FULL)"
        )


class ConnectionLostError(ReplicationError, TransientError):
    """The replication connection ended; reconnect from the durable position."""
