"""The root of every error pgcdc raises on purpose.

Each package derives its own domain errors from :class:`PgcdcError`.  The two
mixins say what a caller may do about one: a :class:`TransientError` may go
away if the same step is retried after a pause (a server restarting, a broker
election), a :class:`TerminalError` will not (a lost slot, missing privileges,
bad configuration) and must stop the pipeline where it can resume.

Every message says what happened, why, and what to do about it.
"""

from __future__ import annotations


class PgcdcError(Exception):
    """Base class of all pgcdc errors."""


class TransientError(PgcdcError):
    """Retrying the same step later may succeed."""


class TerminalError(PgcdcError):
    """Retrying will not help; a person has to act on the message."""


class ConfigError(TerminalError):
    """A configuration value is missing or invalid."""


class JavaMissingError(TerminalError):
    """No Java runtime for Kafka or Spark."""

    def __init__(self) -> None:
        super().__init__(
            "no Java runtime found on PATH; Kafka and Spark need Java 17: "
            "install it (e.g. 'apt-get install openjdk-17-jre-headless') or set JAVA_HOME"
        )
