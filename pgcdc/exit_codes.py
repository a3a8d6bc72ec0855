"""The ``pgcdc`` command's exit codes.

0 success; 1 the demo's lake differs from its source; 2 bad usage or configuration; 3 a
terminal error (act on the message); 4 a transient error (retrying later may succeed).
"""

from __future__ import annotations

EXIT_DIFFERS = 1
EXIT_USAGE = 2
EXIT_TERMINAL = 3
EXIT_TRANSIENT = 4
