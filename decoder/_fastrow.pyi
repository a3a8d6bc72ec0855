from collections.abc import Callable
from typing import Any

class TupleError(ValueError): ...

def tuple_data(buf: bytes, pos: int, unchanged: object, /) -> tuple[tuple[Any, ...], int]: ...
def decode_row(buf: bytes, pos: int,
               columns: tuple[tuple[str, Callable[[str], Any] | None]
                              | tuple[str, Callable[[str], Any] | None,
                                      Callable[[bytes], Any] | None], ...], /
               ) -> tuple[dict[str, Any], tuple[str, ...], int]: ...

class BinaryDecoder:
    """A binary value of a common type read in C; `fallback` (decoder/binary.py) serves
    every value C cannot read exactly."""

    kind: str
    element: str | None
    element_oid: int
    fallback: Callable[[bytes], Any]
    def __init__(self, kind: str, fallback: Callable[[bytes], Any], element: str | None = None,
                 element_oid: int = 0) -> None: ...
    def __call__(self, raw: bytes, /) -> Any: ...
