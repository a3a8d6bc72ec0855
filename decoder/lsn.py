"""Log sequence numbers: 64-bit integers, printed as ``X/Y`` like PostgreSQL does."""

from __future__ import annotations

from core.errors import ConfigError


def format_lsn(lsn: int) -> str:
    """``format_lsn(0x16B3748) == '0/16B3748'``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """Parse ``X/Y`` into its integer value; one hexadecimal number (the 64-bit value, as
    older pgcdc releases printed it) is accepted too."""
    high, sep, low = text.strip().partition("/")
    try:
        value = (int(high, 16) << 32) | int(low, 16) if sep else int(high, 16)
        if not (0 <= value < 1 << 64) or (sep and int(low, 16) >= 1 << 32):
            raise ValueError(text)
        return value
    except ValueError:
        msg = (f"invalid LSN {text!r}: expected two hexadecimal numbers as X/Y, e.g. "
               "0/16B3748 (or the 64-bit value in hexadecimal)")
        raise ConfigError(msg) from None
