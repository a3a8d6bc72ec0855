"""Log lines as text or as one JSON object per line, passwords in connection strings
redacted; :func:`configure_logging` is the only place that installs a handler."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from pgcdc.config import redact_dsn


class TextFormatter(logging.Formatter):
    """The usual text line, with any connection-string password redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_dsn(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, thread and,
    when there is one, the exception; passwords in connection strings are redacted."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact_dsn(record.getMessage()),
            "thread": record.threadName,
        }
        if record.exc_info:
            entry["exception"] = redact_dsn(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


def configure_logging(level: str, log_format: str) -> None:
    """The only place that installs a handler: the library code just logs."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
