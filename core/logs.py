"""What logs may say: JSON lines without user content or secrets.

Code logs ids, not prompts, metadata or URLs; what it cannot control (exception messages from the
database driver, tracebacks, a URL inside an error) passes ``redact`` in the formatter: URLs lose their
userinfo and query string, PostgreSQL's ``DETAIL``/``CONTEXT`` lines (which quote the failing row) and
pydantic's echoed ``input_value`` are dropped, and so is anything that looks like an API key (``pq_…``)
or follows ``Bearer``. SQL parameters never reach a message
(``hide_parameters`` in ``core/db.py``).
"""

import re
from typing import Any

from pythonjsonlogger.json import JsonFormatter

REDACTED = "[redacted]"
_URL = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^\s/?#@'\"<>]*@)?"
    r"(?P<place>[^\s?#'\"<>]*)(?P<query>[?#][^\s'\"<>]*)?"
)
_QUOTED_DATA = re.compile(r"(?P<label>(?:DETAIL|CONTEXT):)[^\n]*")
_PYDANTIC_INPUT = re.compile(r"input_value=.*?, input_type=")
_KEY = re.compile(r"\bpq_[A-Za-z0-9_-]{8,}|(?<=Bearer )[^\s'\"]+", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every URL's userinfo and query string, quoted rows and echoed inputs replaced."""
    text = _URL.sub(_bare_url, text)
    text = _QUOTED_DATA.sub(rf"\g<label> {REDACTED}", text)
    text = _KEY.sub(REDACTED, text)
    return _PYDANTIC_INPUT.sub(f"input_value={REDACTED}, input_type=", text)


def _bare_url(match: re.Match[str]) -> str:
    userinfo = REDACTED + "@" if match["userinfo"] else ""
    query = "?" + REDACTED if match["query"] else ""
    return match["scheme"] + userinfo + match["place"] + query


class RedactingJsonFormatter(JsonFormatter):
    """python-json-logger's formatter with every string of the record (message, extras, traceback)
    passed through ``redact`` before it is written."""

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        return {key: _redacted(value) for key, value in log_data.items()}


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(item) for item in value]
    return value


def log_formatter() -> RedactingJsonFormatter:
    """The one log format of every pagedq process: a JSON object per record."""
    return RedactingJsonFormatter("{asctime}{levelname}{name}{message}", style="{")
