"""Log sequence numbers: 64-bit integers, printed as ``X/Y`` like PostgreSQL does."""

from __future__ import annotations

from pgcdc.errors import ConfigError


def format_lsn(lsn: int) -> str:
    """``format_lsn(0x16B3748) == '0/16B3748'``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """Parse ``X/Y`` into its integer value."""
    high, sep, low = text.partition("/")
    try:
        if not sep:
            raise ValueError(text)
        return (int(high, 16) << 32) | int(low, 16)
    except ValueError:
        msg = f"invalid LSN {text!r}: expected two hexadecimal numbers as X/Y, e.g. 0/16B3748"
        raise ConfigError(msg) from None
