"""Jobs are keyed by their prompt's prefix at submission (contract/prefix.py): a batch's questions about one
document share a key, another document's have another, a job of /v1/jobs is keyed alike; with
``PAGEDQ_PREFIX_AWARE_ORDER=false`` none is."""

import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from contract.prefix import prefix_key
from core.models import Job
from tests.support.jobs_client import api_client, submit

DOCUMENTS = [" ".join(f"{word}{i}" for i in range(60)) for word in ("river", "mountain", "meadow")]


def batch(client: TestClient, prompts: list[str]) -> str:
    line = {"method": "POST", "url": "/v1/completions"}
    bodies = [{"prompt": prompt, "max_tokens": 2} for prompt in prompts]
    lines = [line | {"custom_id": f"l{i}", "body": body} for i, body in enumerate(bodies)]
    upload = client.post(
        "/v1/files",
        files={"file": ("in.jsonl", "".join(json.dumps(line) + "\n" for line in lines))},
        data={"purpose": "batch"},
    )
    body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
    return client.post("/v1/batches", json=body).json()["id"]


def keyed(db, **where: object) -> list[Job]:
    with db.sessions() as session:
        return list(session.scalars(select(Job).filter_by(**where).order_by(Job.id)))


@pytest.mark.parametrize("on", [True, False])
def test_a_document_s_questions_share_a_prefix_key(service_settings, db, on):
    settings = service_settings.model_copy(update={"prefix_aware_order": on})
    questions = ["What flows here?", "Who lives there?"]
    with api_client(settings) as client:
        prompts = [f"{doc}\n{q}" for doc in DOCUMENTS[:2] for q in questions]
        batch_id = batch(client, [*prompts, f"{DOCUMENTS[2]}\n{questions[0]}"])  # one line of its own
        online = submit(client, prompt=f"{DOCUMENTS[0]}\nHow old is it?", max_tokens=2)
    lines, job = keyed(db, batch_id=batch_id), keyed(db, id=online)[0]
    keys = [line.prefix_key for line in lines]
    if not on:
        assert keys == [None] * 5 and job.prefix_key is None
        return
    assert keys[0] == keys[1] == job.prefix_key and keys[2] == keys[3] and keys[0] != keys[2], keys
    assert keys[0] == prefix_key(lines[0].prompt_token_ids, settings.block_size) is not None
    assert keys[4] not in (None, keys[0], keys[2])
