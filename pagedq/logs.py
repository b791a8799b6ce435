"""How every pagedq process logs: JSON lines for machines, short lines for a person at a terminal, both
redacted (``core/logs.py``), and without the chatter of libraries nobody asked to hear (migrations
applied, Celery's per-task lines)."""

import logging
import sys
import warnings
from datetime import datetime

from pythonjsonlogger.core import RESERVED_ATTRS

from core.logs import log_formatter, redact

QUIET_LIBRARIES = ("alembic", "celery", "kombu", "httpx")  # WARNING and up, unless PAGEDQ_LOG_LEVEL=DEBUG
NOT_FIELDS = frozenset(RESERVED_ATTRS) | {"taskName", "color_message", "message", "asctime"}


def configure_logging(level: str, log_format: str = "auto") -> None:
    """Records on stderr: JSON lines, or short text lines (``auto``: text when stderr is a terminal)."""
    text = log_format == "text" or (log_format == "auto" and sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter() if text else log_formatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    if logging.getLogger().level > logging.DEBUG:
        for name in QUIET_LIBRARIES:
            logging.getLogger(name).setLevel(logging.WARNING)
    # Celery's advice for containers run as root; pagedq's workers accept JSON only, never pickle.
    warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges")


class TextFormatter(logging.Formatter):
    """``12:00:01 message  key=value …``, the level only when it is not INFO."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        fields = "".join(
            f"  {key}={value}" for key, value in record.__dict__.items() if key not in NOT_FIELDS
        )
        line = f"{when} {level}{record.getMessage()}{fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return redact(line)
