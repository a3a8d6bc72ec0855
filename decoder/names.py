"""Table names as ``--tables`` gives them: ``schema.table``, either part double-quoted.

A list is split at the commas outside double quotes (:func:`split_table_list`); each name
is then read as one or two parts separated by a dot outside quotes
(:func:`parse_table_name`). A quoted part is taken exactly, with ``""`` standing for one
``"``: ``"my,table"``, ``"we""ird"``, ``public."Mixed Case"``, ``"a.b"``. An unquoted part
is taken as written, case kept (as pgcdc always did: ``public.Orders`` names ``Orders``,
not ``orders``). A name without a schema is in ``public``.
"""

from __future__ import annotations


class TableNameError(ValueError):
    """A table list or name pgcdc cannot read; the message names the text and the fix."""


def _bad(text: str, problem: str, kind: str = "table name") -> TableNameError:
    return TableNameError(f"{kind} {text!r} has {problem}: {_FIX}")


_FIX = ('write schema.table, double-quoting a part that holds a comma, a dot or a double '
        'quote, with a double quote inside doubled: public."my,table", public."we""ird"')


def split_table_list(text: str) -> list[str]:
    """The names of a comma-separated list, split at commas outside double quotes and
    stripped of surrounding blanks; empty entries are left out."""
    names: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted  # a doubled quote toggles twice: still inside
        if char == "," and not quoted:
            names.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if quoted:
        raise _bad(text, "an unterminated double quote", "table list")
    names.append("".join(current).strip())
    return [name for name in names if name]


def parse_table_name(name: str) -> tuple[str, str]:
    """``(schema, table)`` of one name (the schema ``public`` when it names none)."""
    parts: list[str] = []
    i, n = 0, len(name)
    while True:
        while i < n and name[i].isspace():
            i += 1
        if i < n and name[i] == '"':
            part: list[str] = []
            i += 1
            while True:
                if i >= n:
                    raise _bad(name, "an unterminated double quote")
                if name[i] == '"':
                    if i + 1 < n and name[i + 1] == '"':
                        part.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                part.append(name[i])
                i += 1
            text = "".join(part)
            while i < n and name[i].isspace():
                i += 1
            if not text:
                raise _bad(name, "an empty quoted part")
        else:
            end = i
            while end < n and name[end] != ".":
                if name[end] == '"':
                    raise _bad(name, "a double quote inside an unquoted part")
                end += 1
            text = name[i:end].strip()
            i = end
            if not text:
                raise _bad(name, "an empty part")
        parts.append(text)
        if i >= n:
            break
        if name[i] != ".":
            raise _bad(name, "text after a closing quote")
        i += 1
    if len(parts) > 2:
        raise _bad(name, "more than two parts")
    return (parts[0], parts[1]) if len(parts) == 2 else ("public", parts[0])


def quoted_table_name(schema: str, table: str) -> str:
    """``"schema"."table"``, both parts always double-quoted, a double quote inside
    doubled: how pgcdc names the tables it asks to read (one spelling, so that two such
    names compare equal exactly when they name the same table)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in (schema, table))


def format_table_name(schema: str, table: str) -> str:
    """The name ``parse_table_name`` reads back as ``(schema, table)``: a part holding a
    comma, a dot or a double quote (or blanks at its ends, or nothing) double-quoted, a
    double quote inside doubled."""
    def part(text: str) -> str:
        if text and text == text.strip() and not any(c in text for c in ',."'):
            return text
        return '"' + text.replace('"', '""') + '"'

    return f"{part(schema)}.{part(table)}"
