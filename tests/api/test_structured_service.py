"""Structured outputs through the service: OpenAI's ``response_format`` and vLLM's fields on the online
routes and batch lines, ``structured`` on /v1/jobs; bad constraints refused at submission, no job made.

The worker serves a tiny random model: under a finite grammar its every answer is still valid."""

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from sqlalchemy import func, select

from core.models import Job
from tests.api import test_batches
from tests.api.test_batches import file_lines, request_line, start_batch, wait_status

# test_batches' fixtures: its real API over HTTP, the SDK on it, a real worker, the database
settings, db, api_url, client, worker = (
    test_batches.settings,
    test_batches.db,
    test_batches.api_url,
    test_batches.client,
    test_batches.worker,
)

DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"label": {"enum": ["spam", "ham"]}, "score": DIGIT},
        "required": ["label", "score"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"vendor": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "total": DIGIT},
        "required": ["vendor", "total"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
]


def constrained(i: int) -> dict[str, Any]:
    """Line i's body: schema i % 3, asked for in each of the ways clients send one."""
    schema = SCHEMAS[i % 3]
    asked = [
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema, "strict": True},
            }
        },
        {"structured_outputs": {"json": schema}},
        {"guided_json": schema},
    ][i % 3 if i < 15 else 0]
    messages = [{"role": "user", "content": f"Document {i}: extract the fields."}]
    return {"messages": messages, "max_tokens": 60, "temperature": 0} | asked


def test_a_batch_with_three_schemas_returns_valid_json_on_every_line(client, api_url, worker, db, settings):
    batch = start_batch(client, [request_line(f"doc-{i}", constrained(i)) for i in range(30)])
    done = wait_status(client, batch.id, {"completed"}, timeout=240)
    assert done.request_counts.completed == 30
    lines = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in lines] == [f"doc-{i}" for i in range(30)]
    for i, line in enumerate(lines):
        choice = line["response"]["body"]["choices"][0]
        assert choice["finish_reason"] == "stop", line
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMAS[i % 3])
        job = httpx.get(f"{api_url}/v1/jobs/{line['response']['request_id']}").json()
        assert job["output"] == choice["message"]["content"]  # the job keeps the text as well

    online = client.chat.completions.create(
        model=Path(settings.model).name,
        messages=[{"role": "user", "content": "Classify."}],
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS[0]}},
    )
    jsonschema.validate(json.loads(online.choices[0].message.content), SCHEMAS[0])
    job = httpx.post(
        f"{api_url}/v1/jobs",
        json={"prompt": "Pick", "max_tokens": 20, "structured": {"choice": ["left", "right"]}},
        headers={"Prefer": "wait=60"},
    ).json()
    assert job["status"] == "succeeded" and job["output"] in ("left", "right"), job


BAD = [
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "nope"}},
            }
        },
        "nope",
    ),
    ({"guided_regex": "[0-"}, "regex"),
    ({"structured_outputs": {"grammar": "start: missing_rule"}}, "missing_rule"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "give one of"),
    (
        {"response_format": {"type": "json_object"}, "use_beam_search": True, "n": 2, "temperature": 0},
        "beam search does not support structured",
    ),
]


def test_bad_constraints_are_refused_at_submission_and_make_no_job(client, api_url, db):
    for extra, words in BAD:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8} | extra
        reply = httpx.post(f"{api_url}/v1/chat/completions", json=body)
        assert reply.status_code == 400, (extra, reply.text)
        assert words in reply.json()["error"]["message"], reply.json()
    reply = httpx.post(f"{api_url}/v1/jobs", json={"prompt": "Hi", "structured": {"json": {"type": "nope"}}})
    assert reply.status_code == 422 and "nope" in reply.text
    reply = httpx.post(
        f"{api_url}/v1/jobs", json={"prompt": "Hi", "structured": {"regex": "a", "choice": ["a"]}}
    )
    assert reply.status_code == 422 and "exactly one" in reply.text

    good = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    lines = [request_line("ok", good)] + [
        request_line(f"bad-{i}", good | extra) for i, (extra, _) in enumerate(BAD)
    ]
    batch = start_batch(client, lines)
    assert batch.status == "failed"
    assert [error.line for error in batch.errors.data] == list(range(2, 2 + len(BAD)))
    for error, (_, words) in zip(batch.errors.data, BAD, strict=True):
        assert words in error.message, error
    with db.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0
