"""Reading pgcdc's metrics server (``--metrics-port``) from a test."""

from __future__ import annotations

import urllib.error
import urllib.request


def get(url: str) -> tuple[int, str]:
    """The status and body of a GET (an error status too); 0 and the reason when nothing
    answers yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not serving yet
        return 0, str(exc)


def sample(text: str, name: str) -> float | None:
    """The value of the unlabelled metric ``name`` in a /metrics body (None if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rpartition(" ")[2])
    return None
