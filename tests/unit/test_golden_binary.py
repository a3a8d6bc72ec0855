"""pgoutput's ``binary`` option, from bytes a real server sent (``python -m
tests.golden.capture --binary``): the same stream read twice, with text values and with
binary ones; every value of every type decodes to the same Python value both ways."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from decoder import pgoutput as pg
from decoder.binary import BinaryDecoders
from decoder.type_registry import TypeRegistry

GOLDEN = Path(__file__).parent.parent / "golden" / "pgoutput_v3_binary.txt"


def _sections() -> list[list[pg.Message]]:
    sections: list[list[pg.Message]] = []
    for line in GOLDEN.read_text().splitlines():
        if line.startswith("# options:"):
            sections.append([])
        elif line.strip() and not line.startswith("#"):
            tag, inside, raw = line.split(" ")
            sections[-1].append(pg.parse(bytes.fromhex(raw), streaming=inside == "1"))
    return sections


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and (a == b or str(a) == str(b) == "NaN")


def _tuples(message: pg.Message) -> list[tuple[Any, ...]]:
    if isinstance(message, pg.Insert):
        return [message.new]
    if isinstance(message, pg.Update):
        return [t for t in (message.old, message.new) if t is not None]
    if isinstance(message, pg.Delete):
        return [message.old]
    return []


def test_the_two_passes_hold_the_same_messages() -> None:
    text, binary = _sections()
    assert len(text) == len(binary) > 100
    assert [type(m) for m in text] == [type(m) for m in binary]


def test_every_value_decodes_the_same_from_text_and_from_binary() -> None:
    text, binary = _sections()
    registry = TypeRegistry()
    decoders = BinaryDecoders(registry)
    names: dict[str, int] = {}
    relations: dict[int, pg.Relation] = {}
    compared: dict[int, int] = {}
    for t, b in zip(text, binary, strict=True):
        if isinstance(b, pg.Type):
            names[b.name] = b.oid
            if b.name.startswith("_") and b.name[1:] in names:
                registry.register_array(b.oid, names[b.name[1:]])
            else:
                registry.register_enum(b.oid)  # the workload's only custom type: mood
        if isinstance(b, pg.Relation):
            relations[b.oid] = b
        for old_or_new_t, old_or_new_b in zip(_tuples(t), _tuples(b), strict=True):
            relation = relations[getattr(b, "relation_oid")]  # noqa: B009
            for column, tv, bv in zip(relation.columns, old_or_new_t, old_or_new_b,
                                      strict=True):
                if tv is None or tv is pg.UNCHANGED_TOAST:
                    assert bv is tv
                    continue
                assert isinstance(tv, str) and isinstance(bv, bytes), column.name
                expected = registry.decoder_for(column.type_oid)(tv)
                got = decoders.decoder_for(column.type_oid)(bv)
                assert _same(expected, got), (relation.name, column.name, tv, expected, got)
                compared[column.type_oid] = compared.get(column.type_oid, 0) + 1
    typed = next(r for r in relations.values() if r.name == "typed")
    assert {c.type_oid for c in typed.columns} <= set(compared)  # every type was compared
    assert len(typed.columns) == 49
