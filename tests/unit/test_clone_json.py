"""The clone oracle's canonical JSON (pgcdc/clone_json.py ``canonical_json``): PostgreSQL's
``to_json`` of a value and the lake's JSON of the same value (docs/types.md, spelled as
sinks/envelope.py writes it) give one text; a value that differs in any part (a digit, a
decimal's scale, a bound's flag, a microsecond) gives another, and a part spelled otherwise
than its side documents is never equal to anything.  The pairs below were printed by
PostgreSQL 15 (``to_json(v)::text`` under the replication session's settings) and by
``text_of`` of the text decoder's value of the same literal."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.clone_json import Shape, canonical_json, canonical_timetz

_INT4 = Shape("int4")
_NUMERIC = Shape("numeric")
_INT4RANGE = Shape("range", (_INT4,))
_TSTZRANGE = Shape("range", (Shape("timestamptz"),))
_TEXTRANGE = Shape("range", (Shape("text"),))
_PAIR = Shape("composite", (_INT4, Shape("text"), Shape("array", (_INT4,))),
              ("k", "label", "tags"))


def _array(element: Shape) -> Shape:
    return Shape("array", (element,))


def _multi(subtype: Shape) -> Shape:
    return Shape("multirange", (Shape("range", (subtype,)),))


_RANGE = '{{"lower":{},"upper":{},"lower_inc":{},"upper_inc":{},"empty":{}}}'
_EMPTY = _RANGE.format("null", "null", "false", "false", "true")

# (the column's shape, to_json of the source value, the lake's JSON of it)
SAME: list[tuple[Shape, str, str]] = [
    (_array(Shape("numeric")), '[0.00000010,1.50000000,"NaN",null,0.00000000]',
     '["1.0E-7","1.50000000","NaN",null,"0E-8"]'),
    (_array(_NUMERIC), '[0.0000001,3.14159265358979323846,0,"NaN","Infinity","-Infinity"]',
     '["1E-7","3.14159265358979323846","0","NaN","Infinity","-Infinity"]'),
    (_array(_NUMERIC), "[]", "[]"),
    (_INT4RANGE, '"[1,10)"', _RANGE.format(1, 10, "true", "false", "false")),
    (_INT4RANGE, '"empty"', _EMPTY),
    (_INT4RANGE, '"(,6)"', _RANGE.format("null", 6, "false", "false", "false")),
    (_INT4RANGE, '"(,)"', _RANGE.format("null", "null", "false", "false", "false")),
    (_TSTZRANGE, '"[\\"2024-01-01 00:00:00+00\\",)"',
     _RANGE.format('"2024-01-01T00:00:00+00:00"', "null", "true", "false", "false")),
    (_TSTZRANGE, '"[-infinity,infinity]"',
     _RANGE.format('"-infinity"', '"infinity"', "true", "true", "false")),
    (_TSTZRANGE, '"[\\"0001-01-01 00:00:00+00 BC\\",\\"12345-06-07 08:09:10.000011+00\\")"',
     _RANGE.format('"0001-01-01 00:00:00+00 BC"', '"12345-06-07 08:09:10.000011+00"',
                   "true", "false", "false")),
    (Shape("range", (_NUMERIC,)), '"[1.50,)"',
     _RANGE.format('"1.50"', "null", "true", "false", "false")),
    (Shape("range", (Shape("timestamp"),)), '"[\\"2024-01-01 00:00:00.5\\",infinity)"',
     _RANGE.format('"2024-01-01T00:00:00.500000"', '"infinity"', "true", "false", "false")),
    (_multi(_INT4), '"{[1,3),[7,9)}"', "[" + _RANGE.format(1, 3, "true", "false", "false")
     + "," + _RANGE.format(7, 9, "true", "false", "false") + "]"),
    (_multi(_INT4), '"{}"', "[]"),
    (_TEXTRANGE, '"[\\"a\\\\\\\\\\"\\"b\\",\\"z,)\\"]"',
     _RANGE.format('"a\\\\\\"b"', '"z,)"', "true", "true", "false")),
    (_TEXTRANGE, '"[\\"\\",x)"', _RANGE.format('""', '"x"', "true", "false", "false")),
    (_array(_INT4RANGE), '["[1,2)","empty",null]',
     "[" + _RANGE.format(1, 2, "true", "false", "false") + "," + _EMPTY + ",null]"),
    (_array(_multi(_INT4)), '[["{[1,2)}"],["{}"]]',
     "[[[" + _RANGE.format(1, 2, "true", "false", "false") + "]],[[]]]"),
    (_array(Shape("timestamp")),
     '["2024-02-29T13:14:15.123456","infinity","0044-03-15T12:00:00.5 BC",'
     '"10000-01-01T00:00:00"]',
     '["2024-02-29T13:14:15.123456","infinity","0044-03-15 12:00:00.5 BC",'
     '"10000-01-01 00:00:00"]'),
    (_array(Shape("timestamptz")),
     '["2024-02-29T13:14:15.5+00:00","0001-01-01T00:00:00+00:00 BC",'
     '"12345-06-07T08:09:10.000011+00:00"]',
     '["2024-02-29T13:14:15.500000+00:00","0001-01-01 00:00:00+00 BC",'
     '"12345-06-07 08:09:10.000011+00"]'),
    (_array(Shape("date")), '["2024-02-29","-infinity","0044-03-15 BC"]',
     '["2024-02-29","-infinity","0044-03-15 BC"]'),
    (_array(Shape("time")), '["13:14:15.5","24:00:00"]', '["13:14:15.500000","24:00:00"]'),
    (_array(Shape("timetz")), '["13:14:15.5+02","00:00:00-01:30"]',
     '["13:14:15.500000+02:00","00:00:00-01:30"]'),
    (_array(Shape("float4")), '[0.1,3.4e+38,-0,"NaN","-Infinity",1e-45,1.2345679e+08]',
     "[0.1,3.4e+38,-0.0,NaN,-Infinity,1e-45,123456790.0]"),
    (_array(Shape("float8")), '[0.1,1e+16,-0,"NaN",5e-324,100]',
     "[0.1,1e+16,-0.0,NaN,5e-324,100.0]"),
    (_array(Shape("bytea")), '["\\\\xdeadbeef",null,"\\\\x"]', '["3q2+7w==",null,""]'),
    (_array(Shape("money")), '["$1,234.56","-$1.00"]', '["1234.56","-1.00"]'),
    (_array(Shape("pg_lsn")), '["16/B374D848","0/0"]', "[97500059720,0]"),
    (_array(Shape("xid")), '["1","4294967295"]', "[1,4294967295]"),
    (_array(Shape("jsonb")), '[{"a": [1.50, 2]},null]', '["{\\"a\\": [1.50, 2]}",null]'),
    (_array(_INT4), "[[1,null],[3,4]]", "[[1,null],[3,4]]"),
    (_PAIR, '{"k":1,"label":"say \\"hi\\", ok","tags":[7,null]}',
     '{"k":1,"label":"say \\"hi\\", ok","tags":[7,null]}'),
    (_array(_PAIR), '[{"k":null,"label":null,"tags":null},null]',
     '[{"k":null,"label":null,"tags":null},null]'),
    (_array(Shape("point")), '["(1,2)","(1.5,-0)","(1e+300,-1.5e-07)"]',
     '[{"x":1.0,"y":2.0},{"x":1.5,"y":-0.0},{"x":1e+300,"y":-1.5e-07}]'),
    (Shape("line"), '"{0.5,-1,0}"', '{"a":0.5,"b":-1.0,"c":0.0}'),
    (Shape("lseg"), '"[(1,2),(3,4)]"', '{"start":{"x":1.0,"y":2.0},"end":{"x":3.0,"y":4.0}}'),
    (Shape("box"), '"(3,4),(1,2)"', '{"high":{"x":3.0,"y":4.0},"low":{"x":1.0,"y":2.0}}'),
    (_array(Shape("path")), '["[(1,2),(3,4)]","((1,2),(3,4),(5,6))"]',
     '[{"points":[{"x":1.0,"y":2.0},{"x":3.0,"y":4.0}],"closed":false},'
     '{"points":[{"x":1.0,"y":2.0},{"x":3.0,"y":4.0},{"x":5.0,"y":6.0}],"closed":true}]'),
    (Shape("polygon"), '"((1,2),(3,4),(5,0.5))"',
     '{"points":[{"x":1.0,"y":2.0},{"x":3.0,"y":4.0},{"x":5.0,"y":0.5}]}'),
    (Shape("circle"), '"<(1,2),3.5>"', '{"center":{"x":1.0,"y":2.0},"radius":3.5}'),
]


@pytest.mark.parametrize(("shape", "source", "lake"), SAME)
def test_both_spellings_of_one_value_are_one_text(shape: Shape, source: str, lake: str) -> None:
    mine = canonical_json(source, shape, lake=False)
    assert mine == canonical_json(lake, shape, lake=True)
    assert "unreadable" not in mine


# (the column's shape, to_json of the source value, the lake's JSON of another value)
DIFFERENT: list[tuple[Shape, str, str]] = [
    (_array(_NUMERIC), "[1.50000000]", '["1.5"]'),  # the scale differs
    (_array(_NUMERIC), "[0.00000010]", '["1.0E-6"]'),
    (_array(_NUMERIC), '["NaN"]', '["Infinity"]'),
    (_array(_NUMERIC), "[0.00000010]", '["1.0E-7","1.0E-7"]'),
    (_array(_NUMERIC), "[0.5]", "[0.5]"),  # a number where the lake writes a string
    (_INT4RANGE, '"[1,10)"', _RANGE.format(1, 10, "true", "true", "false")),
    (_INT4RANGE, '"[1,10)"', _RANGE.format(1, 11, "true", "false", "false")),
    (_INT4RANGE, '"(,)"', _EMPTY),
    (_INT4RANGE, '"[1,10)"', '"[1,10)"'),  # the lake documents an object, not the text
    (_INT4RANGE, '"[1,10)"', '{"lower":1,"upper":10,"lower_inc":true,"upper_inc":false}'),
    (_TSTZRANGE, '"[\\"2024-01-01 00:00:00+00\\",)"',
     _RANGE.format('"2024-01-01T00:00:00.000001+00:00"', "null", "true", "false", "false")),
    (_TSTZRANGE, '"[\\"2024-01-01 00:00:00+00\\",)"',
     _RANGE.format('"2024-01-01T00:00:00+01:00"', "null", "true", "false", "false")),
    (_TSTZRANGE, '"[\\"0001-01-01 00:00:00+00 BC\\",)"',
     _RANGE.format('"0001-01-01 00:00:00+00"', "null", "true", "false", "false")),
    (_multi(_INT4), '"{[1,3),[7,9)}"', "[" + _RANGE.format(1, 3, "true", "false", "false")
     + "]"),
    (_multi(_INT4), '"{}"', "[" + _EMPTY + "]"),
    (_array(Shape("float8")), "[0.1]", "[0.10000000000000002]"),
    (_array(Shape("float8")), "[-0]", "[0.0]"),
    (_array(Shape("float4")), '["NaN"]', "[Infinity]"),
    (_array(Shape("timestamp")), '["2024-02-29T13:14:15.5"]', '["2024-02-29T13:14:15.050000"]'),
    (_array(Shape("time")), '["24:00:00"]', '["00:00:00"]'),
    (_array(Shape("bytea")), '["\\\\xdeadbeef"]', '["3q2+7g=="]'),
    (_array(Shape("money")), '["-$1.00"]', '["1.00"]'),
    (_array(Shape("pg_lsn")), '["16/B374D848"]', "[97500059721]"),
    (_array(Shape("jsonb")), '[{"a": 1.50}]', '["{\\"a\\": 1.5}"]'),
    (_array(_INT4), "[[1,null],[3,4]]", "[1,null,3,4]"),
    (_array(_INT4), "[1]", '["1"]'),
    (_PAIR, '{"k":1,"label":"x","tags":[7]}', '{"k":1,"label":"x","tags":[8]}'),
    (_PAIR, '{"k":1,"label":"x","tags":null}', '{"k":1,"label":"x"}'),
    (Shape("point"), '"(1,2)"', '{"x":2.0,"y":1.0}'),
    (Shape("point"), '"(1,2)"', '{"x":1.0,"y":2.0000000000000004}'),
    (Shape("box"), '"(3,4),(1,2)"', '{"high":{"x":1.0,"y":2.0},"low":{"x":3.0,"y":4.0}}'),
    (Shape("path"), '"[(1,2),(3,4)]"',
     '{"points":[{"x":1.0,"y":2.0},{"x":3.0,"y":4.0}],"closed":true}'),
    (Shape("circle"), '"<(1,2),3.5>"', '{"center":{"x":1.0,"y":2.0},"radius":3.5,"r":1}'),
    (Shape("circle"), '"<(1,2),3.5>"', '"<(1,2),3.5>"'),
]


@pytest.mark.parametrize(("shape", "source", "lake"), DIFFERENT)
def test_a_differing_value_gives_another_text(shape: Shape, source: str, lake: str) -> None:
    assert canonical_json(source, shape, lake=False) != canonical_json(lake, shape, lake=True)


def test_an_unreadable_part_equals_nothing() -> None:
    """A spelling neither side documents is a marker naming the side, so that the same
    unreadable text on both sides does not compare equal either."""
    source = canonical_json('"[1,10"', _INT4RANGE, lake=False)
    lake = canonical_json('"[1,10"', _INT4RANGE, lake=True)
    assert source.startswith("\0unreadable in the source: ")
    assert lake.startswith("\0unreadable in the lake: ")
    assert source != lake
    assert canonical_json('["1.5x"]', _array(_NUMERIC), lake=True).startswith("\0unreadable")
    assert canonical_json("not json", _array(_INT4), lake=True).startswith("\0unreadable")


_DECIMALS = st.decimals(allow_nan=False, allow_infinity=False, places=8,
                        min_value=Decimal("-99.99999999"), max_value=Decimal("99.99999999"))


@given(st.lists(_DECIMALS, max_size=4), st.lists(_DECIMALS, max_size=4))
def test_numeric_arrays_are_equal_exactly_when_their_values_are(
        mine: list[Decimal], theirs: list[Decimal]) -> None:
    """A ``numeric(10,8)[]``: PostgreSQL's ``to_json`` writes each element with its eight
    decimals (``format(d, 'f')``), the lake ``str(Decimal)`` as a string (docs/types.md):
    one canonical text for the same values, two for different ones."""
    shape = _array(_NUMERIC)
    source = "[" + ",".join(format(d, "f") for d in mine) + "]"
    lake = "[" + ",".join(f'"{d}"' for d in theirs) + "]"
    same = [str(d) for d in mine] == [str(d) for d in theirs]
    assert (canonical_json(source, shape, lake=False)
            == canonical_json(lake, shape, lake=True)) == same


def test_a_timetz_column_in_one_spelling() -> None:
    """A ``timetz`` column (not JSON): PostgreSQL's text and the lake's (Python's
    ``isoformat``, as sinks/envelope.py writes it) are one; another time or offset is not."""
    assert canonical_timetz("13:14:15.5+02") == canonical_timetz("13:14:15.500000+02:00")
    assert canonical_timetz("00:00:00-01:30") == canonical_timetz("00:00:00-01:30")
    assert canonical_timetz("24:00:00+00") == canonical_timetz("24:00:00+00:00")
    assert canonical_timetz("13:14:15.5+02") != canonical_timetz("13:14:15.500000+03:00")
    assert canonical_timetz("13:14:15.5+02") != canonical_timetz("13:14:15.050000+02:00")
    assert canonical_timetz("13:14:15.5+02") != canonical_timetz("13:14:15.5+02:30")
    assert canonical_timetz("not a time") == "not a time"  # compared as it is
