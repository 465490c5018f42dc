"""The daemon's log lines: one an event, text or one JSON object a line, to standard error or a file."""

from __future__ import annotations

import json
import logging

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# The handler configure() installed: reopen() reopens its file.
_handler: logging.Handler | None = None


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, and the exception's traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, form: str, file: str = "") -> None:
    """Log at ``level``, in ``form`` ("text" or "json"), to ``file`` (appended to) or else standard error."""
    global _handler
    handler = logging.FileHandler(file, encoding="utf-8") if file else logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if form == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    _handler = handler


def reopen() -> None:
    """Open the log file again (logrotate moved it away, and the next lines go to a new one)."""
    handler = _handler
    if isinstance(handler, logging.FileHandler):
        old = handler.setStream(open(handler.baseFilename, "a", encoding="utf-8"))  # noqa: SIM115
        if old is not None:
            old.close()
