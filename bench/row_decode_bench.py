"""The tuple loop alone on one row of the decoder benchmark's table, in text and in binary.

    python -m bench.row_decode_bench [--rows 200000]

``decoder.tuples.decode_row`` on the TupleData of one ``bench.items`` row (bigint,
numeric(12,2), timestamptz, text, jsonb, integer[], an enum) as pgoutput sends it in text
and with the ``binary`` option, with the column decoders the pipeline uses: text; binary
with the compiled decoders (decoder/_fastrow_binary.h); binary with the Python decoders
alone (the compiled decoders' ``fallback``).  Prints the CPU microseconds per row of each
(``time.process_time``), after checking that all three decode to the same row.  No server:
the bytes are built here; bench/decoder_bench.py measures the whole pipeline.
"""

from __future__ import annotations

import argparse
import struct
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from decoder import tuples
from decoder import values as v
from decoder.binary import BinaryDecoders
from decoder.type_registry import TypeRegistry

_MOOD = 50_000  # the enum's OID in this process
_COLUMNS = (("id", v.INT8), ("amount", v.NUMERIC), ("updated_at", v.TIMESTAMPTZ),
            ("label", v.TEXT), ("doc", v.JSONB), ("tags", 1007), ("mood", _MOOD))
_TEXT = (b"123456", b"1234.56", b"2026-11-24 22:05:26.123456+00", b"label number 123456",
         b'{"a": 1, "b": "xyz"}', b"{1,2,3,4}", b"great")


def _binary_values() -> list[bytes]:
    at = datetime(2026, 11, 24, 22, 5, 26, 123456, tzinfo=UTC)
    micros = (at - datetime(2000, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    tags = struct.pack("!iiIii", 1, 0, v.INT4, 4, 1) + b"".join(
        struct.pack("!ii", 4, n) for n in (1, 2, 3, 4))
    return [struct.pack("!q", 123456), struct.pack("!hhHH2H", 2, 0, 0, 2, 1234, 5600),
            struct.pack("!q", micros), b"label number 123456", b'\x01{"a": 1, "b": "xyz"}',
            tags, b"great"]


def _tuple(kind: bytes, values: list[bytes] | tuple[bytes, ...]) -> bytes:
    out = struct.pack("!h", len(values))
    for raw in values:
        out += kind + struct.pack("!i", len(raw)) + raw
    return out


def _per_row(buf: bytes, columns: tuples.Columns, rows: int) -> float:
    start = time.process_time()
    for _ in range(rows):
        tuples.decode_row(buf, 0, columns)
    return 1e6 * (time.process_time() - start) / rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that only shows the benchmark still works (CI): "
                             "1,000 rows; its figures mean nothing")
    args = parser.parse_args()
    if args.smoke:
        args.rows = 1000
    registry = TypeRegistry()
    registry.register_enum(_MOOD, name="mood")
    binary = BinaryDecoders(registry)
    text_columns: list[Any] = []
    compiled_columns: list[Any] = []
    python_columns: list[Any] = []
    for name, oid in _COLUMNS:
        text = registry.decoder_for(oid)
        decode_text = None if text is str else text
        decode = binary.decoder_for(oid)
        text_columns.append((name, decode_text))
        compiled_columns.append((name, decode_text, decode))
        python_columns.append((name, decode_text, getattr(decode, "fallback", decode)))
    text_buf, binary_buf = _tuple(b"t", _TEXT), _tuple(b"b", _binary_values())
    runs = (("text", text_buf, tuple(text_columns)),
            ("binary, compiled decoders", binary_buf, tuple(compiled_columns)),
            ("binary, Python decoders", binary_buf, tuple(python_columns)))
    rows = [tuples.decode_row(buf, 0, columns)[0] for _, buf, columns in runs]
    if not rows[0] == rows[1] == rows[2] or rows[0]["amount"] != Decimal("1234.56"):
        msg = f"the three paths disagree: {rows}"
        raise SystemExit(msg)
    print(f"decoder._fastrow loaded: {tuples.COMPILED}; {args.rows:,} rows each")
    for label, buf, columns in runs:
        print(f"{label:28s} {_per_row(buf, columns, args.rows):6.2f} us/row")


if __name__ == "__main__":
    main()
