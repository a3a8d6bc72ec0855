"""``pgcdc catalog show | history | diff``: the time-travel catalog, inspectable."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ConfigError
from decoder.lsn import format_lsn, parse_lsn
from pgcdc.state_paths import state_dir
from snapshot_builder.catalog import TableVersion
from snapshot_builder.datatype import TypeVersion
from snapshot_builder.history import (
    Catalog,
    CatalogHistory,
    Change,
    DropTable,
    HistoryFile,
    PutTable,
    PutType,
)

if TYPE_CHECKING:
    import argparse


def _describe(table: TableVersion) -> list[str]:
    lines = [f"{table.qualified_name}  oid {table.oid}  version {table.version}"
             f"  replica identity {table.replica_identity}"
             + (f"  -- {table.comment}" if table.comment else "")]
    for c in table.columns:
        flags = [c.type_name]
        if c.typmod >= 0:
            flags.append(f"typmod {c.typmod}")
        if c.is_key:
            flags.append("key")
        if c.not_null:
            flags.append("not null")
        if c.default is not None:
            flags.append(f"default {c.default}")
        lines.append(f"    {c.name}: {', '.join(flags)}")
    return lines


def _describe_type(dtype: TypeVersion) -> str:
    what = [dtype.kind]
    if dtype.labels:
        what.append("(" + ", ".join(repr(label) for label in dtype.labels) + ")")
    if dtype.attributes:
        what.append("(" + ", ".join(f"{a.name} oid {a.type_oid}" for a in dtype.attributes)
                    + ")")
    if dtype.base_oid is not None:
        what.append(f"of oid {dtype.base_oid}")
    if dtype.not_null:
        what.append("not null")
    what += list(dtype.constraints)
    if dtype.default is not None:
        what.append(f"default {dtype.default}")
    return (f"type {dtype.qualified_name}  oid {dtype.oid}  version {dtype.version}  "
            + " ".join(what) + (f"  -- {dtype.comment}" if dtype.comment else ""))


def show(catalog: Catalog) -> str:
    head = f"catalog version {catalog.version} (effective at LSN {format_lsn(catalog.lsn)})"
    body = [line for t in sorted(catalog.tables.values(), key=lambda t: t.qualified_name)
            for line in _describe(t)]
    types = [_describe_type(t) for t in sorted(catalog.types.values(),
                                                key=lambda t: t.qualified_name)]
    return "\n".join([head, *body, *types])


def _change_line(change: Change) -> str:
    if isinstance(change, PutTable):
        return (f"put {change.table.qualified_name} (oid {change.table.oid}) "
                f"version {change.table.version}")
    if isinstance(change, PutType):
        return (f"put type {change.type.qualified_name} (oid {change.type.oid}, "
                f"{change.type.kind}) version {change.type.version}")
    if isinstance(change, DropTable):
        return f"drop oid {change.oid}"
    return f"drop type oid {change.oid}"


def history_lines(history: CatalogHistory) -> str:
    lines = [f"versions {history.base.version} to {history.latest.version}"]
    for entry in history.entries():
        lines.append(f"{entry.version:>6}  lsn {format_lsn(entry.lsn)}  "
                     f"{_change_line(entry.change)}")
    return "\n".join(lines)


def diff(before: Catalog, after: Catalog) -> str:
    lines = [f"from version {before.version} to version {after.version}"]
    for oid in sorted(set(before.tables) | set(after.tables)):
        old, new = before.table(oid), after.table(oid)
        if old == new:
            continue
        if old is None and new is not None:
            lines.append(f"+ {new.qualified_name} (oid {oid}) created")
        elif new is None and old is not None:
            lines.append(f"- {old.qualified_name} (oid {oid}) dropped")
        elif old is not None and new is not None:
            lines.append(f"~ {new.qualified_name} (oid {oid}) {old.version} -> {new.version}")
            if old.qualified_name != new.qualified_name:
                lines.append(f"    renamed from {old.qualified_name}")
            old_cols = {c.name: c for c in old.columns}
            new_cols = {c.name: c for c in new.columns}
            for name in new_cols.keys() - old_cols.keys():
                lines.append(f"    + column {name} {new_cols[name].type_name}")
            for name in old_cols.keys() - new_cols.keys():
                lines.append(f"    - column {name}")
            for name in old_cols.keys() & new_cols.keys():
                if old_cols[name] != new_cols[name]:
                    lines.append(f"    ~ column {name}: {old_cols[name].type_name} -> "
                                 f"{new_cols[name].type_name}")
    for oid in sorted(set(before.types) | set(after.types)):
        was, now = before.types.get(oid), after.types.get(oid)
        if was == now:
            continue
        if was is None and now is not None:
            lines.append(f"+ type {now.qualified_name} (oid {oid}) created")
        elif now is None and was is not None:
            lines.append(f"- type {was.qualified_name} (oid {oid}) dropped")
        elif was is not None and now is not None:
            lines.append(f"~ type {now.qualified_name} (oid {oid}) {was.version} -> "
                         f"{now.version}")
            if was.qualified_name != now.qualified_name:
                lines.append(f"    renamed from {was.qualified_name}")
            for label in now.labels:
                if label not in was.labels:
                    lines.append(f"    + label {label!r}")
            for label in was.labels:
                if label not in now.labels:
                    lines.append(f"    - label {label!r}")
    return "\n".join(lines)


def catalog_command(args: argparse.Namespace) -> int:
    """``pgcdc catalog``: the slot's catalog history read (never written), as ``args.action``
    asks: the history's lines, one version shown, or the difference between two."""
    catalog_dir = Path(args.catalog_dir) if args.catalog_dir \
        else state_dir() / f"{args.slot}.catalog"
    if not catalog_dir.exists():
        msg = f"no catalog history in {catalog_dir}: run pgcdc first, or pass --catalog-dir"
        raise ConfigError(msg)
    history = HistoryFile(catalog_dir).load(read_only=True)  # pgcdc may be writing it
    if args.action == "history":
        print(history_lines(history))
    elif args.action == "show":
        at = history.catalog_at(parse_lsn(args.at)) if args.at else history.latest
        print(show(at))
    else:
        if not args.at:
            msg = "catalog diff needs --at LSN (and optionally --to LSN)"
            raise ConfigError(msg)
        before = history.catalog_at(parse_lsn(args.at))
        after = history.catalog_at(parse_lsn(args.to)) if args.to else history.latest
        print(diff(before, after))
    return 0
