from typing import Any

def encode(plan: tuple[Any, ...], event: tuple[Any, ...], now_ms: int, /
           ) -> tuple[bytes, bytes]: ...
