"""Binary column values of the text search types: ``tsvector`` and ``tsquery``, as the text
``tsvectorout`` and ``tsqueryout`` print (what text mode keeps: decoder/text_parsers.py).

``tsvector_send``: the lexeme count, then per lexeme its NUL-terminated text, the count of
its positions and each position (14 bits) with its weight (2 bits).  ``tsquery_send``: the
item count, then the items in prefix order: an operand (type 1, weight bits, prefix flag,
NUL-terminated text) or an operator (type 2, operator, and for ``<N>`` the distance).
"""

from __future__ import annotations

import struct
from typing import Final

from decoder import values as v
from decoder.binary_scalars import BinaryDecoder, done, i32_at, u16_at


def _quote_lexeme(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _cstring(raw: bytes, pos: int) -> tuple[str, int]:
    end = raw.index(b"\x00", pos)
    return raw[pos:end].decode("utf-8"), end + 1


_WEIGHTS: Final = ("", "C", "B", "A")  # a position's weight: D (0, not printed) to A (3)


def _tsvector(raw: bytes) -> str:
    """``tsvectorout``: quoted lexemes, each with its positions and weights."""
    (count,) = i32_at(raw, 0)
    pos, out = 4, []
    for _ in range(count):
        lexeme, pos = _cstring(raw, pos)
        (npos,) = u16_at(raw, pos)
        positions = struct.unpack_from(f"!{npos}H", raw, pos + 2)
        pos += 2 + 2 * npos
        word = _quote_lexeme(lexeme)
        if npos:
            word += ":" + ",".join([f"{p & 0x3FFF}{_WEIGHTS[p >> 14]}" for p in positions])
        out.append(word)
    done(raw, pos)
    return " ".join(out)


_QI_VAL, _QI_OPR = 1, 2
_OP_NOT, _OP_AND, _OP_OR, _OP_PHRASE = 1, 2, 3, 4
_PRIORITY: Final = {_OP_NOT: 4, _OP_AND: 2, _OP_OR: 1, _OP_PHRASE: 3}


def _tsquery(raw: bytes) -> str:
    """``tsqueryout``: the items come in prefix order (operator, right, left), printed in
    infix with the parentheses ``infix()`` in tsquery.c puts."""
    (count,) = i32_at(raw, 0)
    # (item type, operator or weight, distance or prefix flag, operand)
    items: list[tuple[int, int, int, str]] = []
    pos = 4
    for _ in range(count):
        kind = raw[pos]
        if kind == _QI_VAL:
            weight, prefix = raw[pos + 1], raw[pos + 2]
            operand, pos = _cstring(raw, pos + 3)
            items.append((kind, weight, prefix, operand))
        elif kind == _QI_OPR:
            operator = raw[pos + 1]
            if operator not in _PRIORITY:
                msg = f"tsquery operator {operator}"
                raise ValueError(msg)
            distance = struct.unpack_from("!h", raw, pos + 2)[0] if operator == _OP_PHRASE else 0
            pos += 4 if operator == _OP_PHRASE else 2
            items.append((kind, operator, distance, ""))
        else:
            msg = f"tsquery item type {kind}"
            raise ValueError(msg)
    done(raw, pos)
    if not items:
        return ""
    at = 0

    def infix(parent: int, right_phrase: bool) -> str:
        nonlocal at
        kind, operator, extra, operand = items[at]
        at += 1
        if kind == _QI_VAL:
            text = _quote_lexeme(operand)
            if operator or extra:
                text += ":" + ("*" if extra else "") + "".join(
                    letter for bit, letter in ((8, "A"), (4, "B"), (2, "C"), (1, "D"))
                    if operator & bit)
            return text
        priority = _PRIORITY[operator]
        if operator == _OP_NOT:
            text = "!" + infix(priority, False)
            return f"( {text} )" if priority < parent else text
        right = infix(priority, operator == _OP_PHRASE)
        left = infix(priority, False)
        if operator == _OP_PHRASE:
            sign = "<->" if extra == 1 else f"<{extra}>"
        else:
            sign = "&" if operator == _OP_AND else "|"
        text = f"{left} {sign} {right}"
        parens = priority < parent or (operator == _OP_PHRASE and right_phrase)
        return f"( {text} )" if parens else text

    text = infix(-1, False)
    if at != len(items):
        msg = f"{len(items) - at} tsquery items outside the tree"
        raise ValueError(msg)
    return text


TEXT_SEARCH: Final[dict[int, BinaryDecoder]] = {v.TSVECTOR: _tsvector, v.TSQUERY: _tsquery}
"""The decoders of this module by type OID."""
