"""Several models behind one API (in-process, the real PostgreSQL and Redis; no worker needed): each
model's own encoder, context and queue; unknown models and the wrong kind refused at submission."""

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core.models import Worker, utcnow
from core.queue import make_celery, queue_depth, queue_name
from core.settings import Settings
from pagedq.serve import model_dir
from tests.support.tiny_models import make_tiny_model

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def short_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second generate model: another architecture's tiny model with a context of 64 tokens."""
    return make_tiny_model(tmp_path_factory.mktemp("short"), "qwen2", max_position_embeddings=64)


@pytest.fixture
def names() -> dict[str, str]:
    tag = uuid.uuid4().hex[:6]  # queues of this test's own
    return {"chat": f"chat-{tag}", "short": f"short-{tag}", "embed": f"embed-{tag}"}


@pytest.fixture
def client(
    service_settings: Settings, tiny_llama: Path, short_llama: Path, names: dict[str, str]
) -> Iterator[TestClient]:
    models = [
        {"name": names["chat"], "source": str(tiny_llama)},
        {"name": names["short"], "source": str(short_llama), "seats": 4},
        {"name": names["embed"], "source": "/nowhere/minilm", "kind": "embed", "workers": 0},
    ]
    settings = Settings(**{**service_settings.model_dump(), "models": json.dumps(models)})
    with TestClient(create_app(settings)) as client:
        yield client


def _depth(client: TestClient, model: str) -> int:
    return queue_depth(make_celery(client.app.state.service.settings), queue_name(model))


def test_each_model_takes_its_jobs_on_its_own_queue_and_loads_its_encoder_on_first_use(
    client: TestClient, names: dict[str, str]
) -> None:
    registry = client.app.state.service.models
    assert registry.default_chat == names["chat"] and names["short"] not in registry._encoders

    default = client.post("/v1/jobs", json={"prompt": PROMPT, "max_tokens": 4})
    short = client.post("/v1/jobs", json={"prompt": PROMPT, "max_tokens": 4, "model": names["short"]})

    assert default.status_code == short.status_code == 202, short.text
    assert (default.json()["model"], short.json()["model"]) == (names["chat"], names["short"])
    assert _depth(client, names["chat"]) == 1 and _depth(client, names["short"]) == 1
    assert registry.encoder(names["short"]).context_length == 64  # its own config, loaded once and kept
    listed = client.get("/v1/jobs", params={"model": names["short"]}).json()["data"]
    assert [job["id"] for job in listed] == [short.json()["id"]]


def test_the_context_rule_is_each_models_own(client: TestClient, names: dict[str, str]) -> None:
    body = {"prompt": PROMPT, "max_tokens": 100}
    assert client.post("/v1/jobs", json=body).status_code == 202
    refused = client.post("/v1/jobs", json=body | {"model": names["short"]})
    assert refused.status_code == 422 and "context of 64 tokens" in refused.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/jobs", {"prompt": PROMPT}),
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/generate", {"prompt": PROMPT}),
    ],
)
def test_an_unknown_model_is_a_404_naming_the_served_ones_and_an_embedding_model_cannot_chat(
    client: TestClient, names: dict[str, str], path: str, body: dict[str, Any]
) -> None:
    unknown = client.post(path, json=body | {"model": "gpt-4"})
    assert unknown.status_code == 404
    served = ", ".join(names.values())
    assert unknown.json()["detail"] == f"model 'gpt-4' is not served here; served: {served}"

    embed = client.post(path, json=body | {"model": names["embed"]})
    assert embed.status_code == 400 and f"model {names['embed']!r} is of kind 'embed'" in embed.text
    if path.startswith("/v1/c"):  # OpenAI's routes: OpenAI's error too
        assert unknown.json()["error"]["code"] == "model_not_found"
        assert embed.json()["error"]["param"] == "model"
    assert _depth(client, names["chat"]) == 0


def test_models_are_listed_and_looked_up_as_openai_does(client: TestClient, names: dict[str, str]) -> None:
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == list(names.values())
    assert client.get(f"/v1/models/{names['embed']}").json()["id"] == names["embed"]
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_batch_runs_its_first_lines_model_and_refuses_lines_naming_another(
    client: TestClient, names: dict[str, str]
) -> None:
    def line(i: int, model: str) -> str:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 2}
        return json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body})

    def batch(*models: str) -> dict[str, Any]:
        content = "\n".join(line(i, model) for i, model in enumerate(models)).encode()
        file = client.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})
        body = {"input_file_id": file.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
        return client.post("/v1/batches", json=body).json()

    good = batch(names["short"], names["short"])
    assert good["status"] == "in_progress" and good["model"] == names["short"]
    assert _depth(client, names["short"]) == 2

    bad = batch(names["short"], names["chat"], "gpt-4")
    codes = [(error["line"], error["code"]) for error in bad["errors"]["data"]]
    assert bad["status"] == "failed" and codes == [(2, "model_mismatch"), (3, "model_not_found")]


def test_models_and_readiness_report_each_models_kind_context_live_workers_and_weights(
    client: TestClient, names: dict[str, str]
) -> None:
    older = {"types": {"F32": 15}, "bytes": 460_032, "kernels": "float32-onednn"}
    newest = {"types": {"F32": 5, "Q4_1": 16}, "bytes": 91_136, "kernels": "gguf-float-fma-avx2"}
    now = utcnow()
    with client.app.state.service.sessions.begin() as session:
        for i, (at, weights) in enumerate(((now - timedelta(minutes=1), older), (now, newest))):
            short = names["short"]
            session.add(
                Worker(id=f"w:{i}", model=short, started_at=at, heartbeat_at=now, stats={}, weights=weights)
            )
        silent = now - timedelta(hours=1)  # not live: neither counted nor its weights reported
        session.add(Worker(id="w:gone", model=names["chat"], heartbeat_at=silent, stats={}, weights=older))
    listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    reported = {
        name: (m["kind"], m["context_length"], m["live_workers"], m["weights"]) for name, m in listed.items()
    }
    assert reported == {
        names["chat"]: ("generate", 1024, 0, None),  # no live worker: no weights to tell
        names["short"]: ("generate", 64, 2, newest),  # its newest live worker's
        names["embed"]: ("embed", None, 0, None),
    }
    ready = client.get("/readyz").json()
    assert ready["models"][names["short"]] == {
        "kind": "generate",
        "workers": 1,
        "live_workers": 2,
        "weights": newest,
    }
    assert ready["models"][names["chat"]]["weights"] is None
    # The chat model has no live worker; the embedding model, listed with workers = 0, needs none.
    assert ready["checks"]["worker"].startswith(f"failed: no worker serving {names['chat']} has")


def test_a_gguf_file_is_tokenized_by_its_own_metadata_as_its_directory_is(
    service_settings: Settings, tiny_llama_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API locates a .gguf source as `pagedq serve` does (``model_dir``): its config and tokenizer,
    prepared once from the file's metadata, tokenize a chat and apply its context, as the directory that
    holds it with a Hugging Face config does."""
    monkeypatch.setenv("PAGEDQ_CACHE_DIR", str(tmp_path / "cache"))
    tag = uuid.uuid4().hex[:6]
    file, folder = f"file-{tag}", f"folder-{tag}"
    models = [
        {"name": file, "source": str(tiny_llama_gguf / "model.gguf")},  # quantization: gguf, its default
        {"name": folder, "source": str(tiny_llama_gguf), "quantization": "gguf"},
    ]
    settings = Settings(**{**service_settings.model_dump(), "models": json.dumps(models)})
    chat = {"messages": [{"role": "user", "content": "héllo wörld 🙂, the quick brown fox"}], "max_tokens": 4}
    with TestClient(create_app(settings, model_dir)) as client:
        jobs = {name: client.post("/v1/jobs", json=chat | {"model": name}) for name in (file, folder)}
        asked = {
            name: client.get(f"/v1/jobs/{job.json()['id']}/request").json() for name, job in jobs.items()
        }
        too_long = client.post("/v1/jobs", json=chat | {"model": file, "max_tokens": 1020})
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert [job.status_code for job in jobs.values()] == [202, 202], jobs[file].text
    assert asked[file]["prompt_tokens"] == asked[folder]["prompt_tokens"] > 10
    assert too_long.status_code == 422 and "context of 1024 tokens" in too_long.text
    assert listed[file]["context_length"] == 1024
