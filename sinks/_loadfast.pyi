from collections.abc import Callable, Iterator

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
JSON_FALLBACK: int
JSON_STRING: int
JSON_INTEGER: int
JSON_BOOLEAN: int
JSON_FLOAT: int
JSON_NUMERIC: int
JSON_NUMERIC_VARIABLE: int
JSON_DATE_DAYS: int
JSON_TIME_MICROS: int
JSON_TIME_MILLIS: int
JSON_TS_MICROS: int
JSON_TS_MILLIS: int
JSON_TSTZ: int
JSON_BASE64: int
JSON_UUID: int
JSON_INT_ARRAY: int
JSON_FLOAT_BARE: int
JSON_TEXT_NUMERIC: int
JSON_ISO_DATE: int
JSON_ISO_TIMESTAMP: int

class Producer:
    def __init__(self, library: str, config: list[tuple[str, str]], /) -> None: ...
    def poll(self, timeout_ms: int, /) -> int: ...
    def flush(self, timeout_ms: int, /) -> int: ...
    def close(self) -> None: ...

class Table:
    def __init__(self, producer: Producer, topic: str, headers: list[tuple[str, bytes]],
                 kinds: tuple[int, ...], fallbacks: tuple[object, ...],
                 key_columns: tuple[int, ...], middle: bytes, tail: bytes,
                 key_head: bytes = ..., value_head: bytes = ..., /) -> None: ...
    def rows(self, lines: Iterator[object], limit: int, ordinal: int, now_ms: int, /) -> int: ...
    def encode(self, line: object, ordinal: int, now_ms: int, /) -> tuple[bytes, bytes]: ...

class JsonTable:
    def __init__(self, producer: Producer, topic: str, headers: list[tuple[str, bytes]],
                 kinds: tuple[int, ...], args: tuple[int, ...], fallbacks: tuple[object, ...],
                 key_columns: tuple[int, ...], prefixes: tuple[bytes, ...],
                 key_prefixes: tuple[bytes, ...], head: bytes, middle: bytes,
                 pieces: tuple[bytes, ...], dump: Callable[[object], str], /) -> None: ...
    def rows(self, lines: Iterator[object], limit: int, ordinal: int, now_ms: int, /) -> int: ...
    def encode(self, line: object, ordinal: int, now_ms: int, /) -> tuple[bytes, bytes]: ...

class CopyError(ConnectionError): ...
class ProduceError(RuntimeError): ...

class CopyOut:
    def __init__(self, library: str, pgconn_ptr: int, query: bytes, /) -> None: ...
    def __iter__(self) -> CopyOut: ...
    def __next__(self) -> bytes: ...
    def close(self) -> None: ...
