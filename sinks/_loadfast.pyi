from collections.abc import Iterator

FALLBACK: int
TEXT: int
INT: int
LONG: int
BOOLEAN: int
FLOAT: int
DOUBLE: int
NUMERIC: int
DATE: int
TIMESTAMP: int
INT_ARRAY: int

class Producer:
    def __init__(self, library: str, config: list[tuple[str, str]], /) -> None: ...
    def poll(self, timeout_ms: int, /) -> int: ...
    def flush(self, timeout_ms: int, /) -> int: ...
    def close(self) -> None: ...
    def counts(self) -> tuple[int, int, int]: ...

class Table:
    def __init__(self, producer: Producer, topic: str, headers: list[tuple[str, bytes]],
                 kinds: tuple[int, ...], fallbacks: tuple[object, ...],
                 key_columns: tuple[int, ...], middle: bytes, tail: bytes, /) -> None: ...
    def rows(self, lines: Iterator[object], limit: int, ordinal: int, now_ms: int, /) -> int: ...
    def encode(self, line: object, ordinal: int, now_ms: int, /) -> tuple[bytes, bytes]: ...
