"""``POST /v1/embeddings`` through a real ``pagedq api`` process and a real embedding worker of the
built-in all-MiniLM-L6-v2 on PostgreSQL and Redis, driven by the official ``openai`` SDK: vectors equal
sentence-transformers' on the same weights (float and base64), each request a job in ``/v1/jobs`` with its
timings, and every bad request refused at submission with a 4xx, no job made."""

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
import torch.nn.functional as F
from sentence_transformers import SentenceTransformer

from core.settings import Settings
from pagedq import cli
from tests.support.jobs_client import Database, start_worker
from tests.support.services import Process, database_from, free_port, redis_url, service_env, wait_for
from worker.engine.default_model import resolve_model

PARAGRAPH = " ".join(
    f"The {word} river winds through the valley, carrying silt from the mountains to the sea."
    for word in ["long", "quiet", "old", "wide", "cold", "slow"] * 5
)  # about 300 words: cut to MiniLM's 256 tokens
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "héllo wörld — ça va? Grüße aus München!",
    "東京は日本の首都です。",
    "I love pizza 🍕🔥 and tacos 🌮!!",
    "def add(a, b):\n    return a + b  # sum",
    "a",
    PARAGRAPH,
]


@pytest.fixture(scope="module")
def service(pg_template: str, tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The API and a worker of the embedding model, named uniquely (its queue is this module's own)."""
    tmp = tmp_path_factory.mktemp("embeddings")
    chat = tmp / f"tiny-{uuid.uuid4().hex[:8]}"
    chat.symlink_to(tiny_llama, target_is_directory=True)
    name = f"minilm-{uuid.uuid4().hex[:8]}"
    models = [
        {"name": chat.name, "source": str(chat)},
        {"name": name, "source": "all-minilm-l6-v2", "kind": "embed"},
    ]
    with database_from(pg_template) as url:
        settings = Settings(
            database_url=url,
            broker_url=redis_url(),
            model=str(chat),
            models=json.dumps(models),
            data_dir=tmp,
            port=free_port(),
            device="cpu",
            dtype="float32",
            flush_interval=0.1,
        )
        db = Database(settings)
        worker = start_worker(settings, db, tmp / "worker.log", model=name)
        api = Process(["api"], service_env(settings), tmp / "api.log")
        base = f"http://127.0.0.1:{settings.port}"
        try:
            wait_for(lambda: _healthy(base), 60, "the API to answer", interval=0.2)
            yield {"base": base, "model": name, "chat": chat.name, "db": db}
        finally:
            assert api.stop() == 0, api.log()[-3000:]
            worker.stop()
            db.close()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz").status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def client(service: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=service["base"] + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    return SentenceTransformer(str(resolve_model("all-minilm-l6-v2")), device="cpu")


def assert_parity(mine: list[list[float]], theirs: np.ndarray) -> None:
    mine_t, theirs_t = torch.tensor(mine), torch.from_numpy(theirs).float()
    assert mine_t.shape == theirs_t.shape
    assert F.cosine_similarity(mine_t, theirs_t).min().item() >= 0.99999


def test_vectors_equal_sentence_transformers_as_floats_and_base64(client, service, reference) -> None:
    expected = reference.encode(SENTENCES, batch_size=4)
    floats = client.embeddings.create(model=service["model"], input=SENTENCES, encoding_format="float")
    assert [item.index for item in floats.data] == list(range(len(SENTENCES)))
    assert_parity([item.embedding for item in floats.data], expected)
    tokens = [min(len(ids), 256) for ids in reference.tokenizer(SENTENCES)["input_ids"]]
    assert tokens[-1] == 256  # the paragraph is cut to max_seq_length, and usage counts what was embedded
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (sum(tokens), sum(tokens))
    encoded = client.embeddings.create(model=service["model"], input=SENTENCES, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(item.embedding), dtype="<f4").tolist() for item in encoded.data]
    assert decoded == [item.embedding for item in floats.data]  # the same float32 values
    by_sdk = client.embeddings.create(model=service["model"], input=SENTENCES[0])  # asks base64, decodes
    assert by_sdk.data[0].embedding == floats.data[0].embedding


def test_token_ids_and_truncate_prompt_tokens(client, service, reference) -> None:
    ids = reference.tokenizer(["The quick brown fox jumps over the lazy dog."])["input_ids"][0]
    as_ids = client.embeddings.create(model=service["model"], input=[ids, ids[:5]], encoding_format="float")
    as_text = client.embeddings.create(model=service["model"], input=SENTENCES[0], encoding_format="float")
    assert as_ids.data[0].embedding == as_text.data[0].embedding
    assert as_ids.usage.prompt_tokens == len(ids) + 5
    cut = client.embeddings.create(
        model=service["model"],
        input=PARAGRAPH,
        encoding_format="float",
        extra_body={"truncate_prompt_tokens": 16},
    )
    reference.max_seq_length = 16
    try:
        assert_parity([cut.data[0].embedding], reference.encode([PARAGRAPH]))
    finally:
        reference.max_seq_length = 256
    assert cut.usage.prompt_tokens == 16


def test_an_embedding_request_is_a_job_with_its_timings(client, service) -> None:
    client.embeddings.create(model=service["model"], input=["one", "two"])
    jobs = httpx.get(service["base"] + "/v1/jobs", params={"limit": 50}).json()["data"]
    job = next(job for job in jobs if job["model"] == service["model"])
    assert job["status"] == "succeeded" and job["usage"]["completion_tokens"] == 0
    timings = job["timings"]
    assert timings["queue_time_ms"] is not None and timings["time_to_first_token_ms"] is not None
    assert timings["e2e_latency_ms"] >= timings["queue_time_ms"] + timings["time_to_first_token_ms"]


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        ({"input": ""}, 400, "input", "empty string"),
        ({"input": []}, 400, "input", "not empty"),
        ({"input": [[]]}, 400, "input", "input 0 is empty"),
        ({"input": ["a"] * 2049}, 400, "input", "at most 2048"),
        ({"input": [1, True]}, 400, "input", "must be a string"),
        ({"input": [[1, 10**6]]}, 400, "input", "[0, 30522)"),
        ({"input": [[1, -1]]}, 400, "input", "[0, 30522)"),
        ({"input": "hi", "dimensions": 100}, 400, "dimensions", "384 dimensions"),
        ({"input": "hi", "truncate_prompt_tokens": 257}, 400, "truncate_prompt_tokens", "[1, 256]"),
        ({"input": "hi", "encoding_format": "int8"}, 400, "encoding_format", "float"),
        ({"input": "hi", "model": "nope"}, 404, "model", "served: "),
        ({"input": "hi", "model": "CHAT"}, 400, "model", "of kind 'generate'"),
    ],
)
def test_bad_requests_are_refused_at_submission(service, body, status, param, says) -> None:
    body = {"model": service["model"]} | body
    if body["model"] == "CHAT":
        body["model"] = service["chat"]
    before = httpx.get(service["base"] + "/v1/jobs", params={"limit": 100}).json()["data"]
    answer = httpx.post(service["base"] + "/v1/embeddings", json=body, timeout=30)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and says in error["message"], error
    if status == 404:
        assert error["code"] == "model_not_found" and service["model"] in error["message"]
    after = httpx.get(service["base"] + "/v1/jobs", params={"limit": 100}).json()["data"]
    assert len(after) == len(before)  # nothing was queued


def test_chat_of_the_embedding_model_is_refused_naming_its_kind(client, service) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=service["model"], messages=[{"role": "user", "content": "hi"}])
    assert "of kind 'embed'" in refused.value.body["message"]


def test_an_embeddings_batch_file_round_trips_through_client_batches(client, service, reference) -> None:
    lines = [
        {"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/embeddings", "body": body}
        for i, body in enumerate(
            [
                {"model": service["model"], "input": SENTENCES[:3]},
                {"model": service["model"], "input": PARAGRAPH, "encoding_format": "base64"},
                {"model": service["model"], "input": "a"},
            ]
        )
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("embed.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    batch = wait_for(lambda: _ended(client, batch.id), 120, "the batch to end", interval=0.2)
    assert (batch.status, batch.request_counts.completed, batch.request_counts.failed) == ("completed", 3, 0)
    out = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    bodies = {line["custom_id"]: line["response"]["body"] for line in out}
    first, second, third = bodies["doc-0"], bodies["doc-1"], bodies["doc-2"]
    assert first["object"] == "list" and first["model"] == service["model"]
    assert_parity([item["embedding"] for item in first["data"]], reference.encode(SENTENCES[:3]))
    decoded = np.frombuffer(base64.b64decode(second["data"][0]["embedding"]), dtype="<f4")
    assert_parity([decoded.tolist()], reference.encode([PARAGRAPH]))
    assert second["usage"]["prompt_tokens"] == 256
    online = client.embeddings.create(model=service["model"], input="a", encoding_format="float")
    assert third["data"][0]["embedding"] == online.data[0].embedding  # online and batched: the same vector


def _ended(client: openai.OpenAI, batch_id: str):
    batch = client.batches.retrieve(batch_id)
    return batch if batch.status in ("completed", "failed", "cancelled", "expired") else None


def test_a_batch_of_bad_embedding_lines_fails_naming_each(client, service) -> None:
    bodies = [
        {"model": service["model"], "input": ""},
        {"model": service["model"], "input": [[1, 10**6]]},
        {"model": service["chat"], "input": "hi"},
        {"model": service["model"], "input": "fine", "dimensions": 7},
    ]
    lines = [
        {"custom_id": str(i), "method": "POST", "url": "/v1/embeddings", "body": b}
        for i, b in enumerate(bodies)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("bad.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    assert batch.status == "failed"
    errors = {error.line: (error.code, error.param) for error in batch.errors.data}
    assert errors == {
        1: ("invalid_value", "body.input"),
        2: ("invalid_value", "body.input"),
        3: ("invalid_value", "body.model"),
        4: ("invalid_value", "body.dimensions"),
    }


def test_pagedq_submit_batch_with_the_embeddings_endpoint(service, tmp_path: Path, capsys) -> None:
    path, out = tmp_path / "embed.jsonl", tmp_path / "vectors.jsonl"
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": service["model"], "input": text},
        }
        for i, text in enumerate(SENTENCES[:2])
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = [
        "submit",
        str(path),
        "--batch",
        "--endpoint",
        "/v1/embeddings",
        "--out",
        str(out),
        "--url",
        service["base"],
    ]
    assert cli.main(argv) == 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == ["e0", "e1"]
    assert all(len(r["response"]["body"]["data"][0]["embedding"]) == 384 for r in results)
    assert "completed: 2 completed, 0 failed" in capsys.readouterr().err
