"""Logs carry ids, never prompts, metadata, webhook tokens or passwords, even when the database fails."""

import io
import json
import logging
from collections.abc import Iterator

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core import keys
from core.logs import log_formatter, redact
from core.settings import Settings

SECRETS = ("prompt-secret-456", "meta-secret-123", "tok-secret-789", "pw-secret-000")
REQUEST = {
    "prompt": "my password is prompt-secret-456",
    "metadata": {"api_key": "meta-secret-123"},
    "webhook_url": "http://hook:pw-secret-000@127.0.0.1:9/hook?token=tok-secret-789",
    "priority": 7,  # what the failing constraint or trigger below refuses
}
# Both quote the refused row (every column: prompt, metadata, webhook URL) in the error's DETAIL.
FAILURES = {
    "constraint": "ALTER TABLE jobs ADD CONSTRAINT no_seven CHECK (priority <> 7)",
    "timeout": """
        CREATE FUNCTION time_out() RETURNS trigger AS $$ BEGIN
            IF NEW.priority = 7 THEN
                RAISE EXCEPTION 'canceling statement due to statement timeout'
                    USING ERRCODE = 'query_canceled', DETAIL = NEW::text;
            END IF;
            RETURN NEW;
        END $$ LANGUAGE plpgsql;
        CREATE TRIGGER time_out BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION time_out();
    """,
}


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """What the processes' own log handler writes (``pagedq.cli.configure_logging`` uses this formatter)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(log_formatter())
    root = logging.getLogger()
    root.addHandler(handler)
    yield stream
    root.removeHandler(handler)


@pytest.mark.parametrize(
    ("failure", "status", "level", "says"),
    [
        ("constraint", 422, "WARNING", "the database refused a job's data"),  # the job's own data: a 4xx
        ("timeout", 503, "ERROR", "INSERT INTO jobs"),
    ],
)
def test_a_database_error_on_a_submission_logs_no_user_content_or_secret(
    service_settings: Settings, captured: io.StringIO, failure: str, status: int, level: str, says: str
) -> None:
    settings = service_settings.model_copy(update={"webhook_allow_private": True})
    url = settings.resolved_database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(FAILURES[failure])
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.post("/v1/jobs", json=REQUEST)

    assert response.status_code == status, response.text
    logged = captured.getvalue()
    records = [json.loads(line) for line in logged.splitlines()]
    assert any(r["levelname"] == level and says in json.dumps(r) for r in records), logged
    assert "DETAIL" not in logged or "DETAIL: [redacted]" in logged
    assert not [secret for secret in SECRETS if secret in logged], logged


def test_urls_lose_userinfo_and_query_and_quoted_rows_are_dropped() -> None:
    assert redact("to https://u:p@hooks.example.com:8443/a/b?token=x#f failed") == (
        "to https://[redacted]@hooks.example.com:8443/a/b?[redacted] failed"
    )
    assert redact("http://example.com/plain") == "http://example.com/plain"
    text = redact(
        "IntegrityError: duplicate key\nDETAIL:  Key (idempotency_key)=(k-123) already exists.\n"
        "[SQL: INSERT ...] while posting to postgresql+psycopg://app:hunter2@db/pagedq\n"
        "1 validation error\n  Input should be a valid integer [type=int_parsing, "
        "input_value='my prompt', input_type=str]"
    )
    assert "k-123" not in text and "hunter2" not in text and "my prompt" not in text
    assert "DETAIL: [redacted]" in text and "postgresql+psycopg://[redacted]@db/pagedq" in text


def test_key_material_never_reaches_a_log_line() -> None:
    key = keys.new_key()
    line = redact(f"request failed: Authorization: Bearer {key}; key={key}")
    assert key not in line and key[3:] not in line
