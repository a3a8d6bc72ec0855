"""The Java runtime the JVM services run on: Kafka, the schema registry, Spark.

``$JAVA_HOME/bin/java`` when it exists, else ``java`` on ``PATH``; neither is a
:class:`~core.errors.JavaMissingError` that says how to install one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from core.errors import JavaMissingError


def java_binary() -> str:
    """The ``java`` executable to start a JVM with (raises :class:`JavaMissingError`)."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise JavaMissingError
    return found
