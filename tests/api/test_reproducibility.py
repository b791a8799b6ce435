"""A job's manifest and its replays, through the API with keys on, against a real worker."""

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core import keys
from core.replay import Comparison, counted, first_divergence
from core.settings import Settings
from tests.support.jobs_client import Database, start_worker
from tests.support.services import wait_for
from worker.engine import LLM, SamplingParams


@pytest.fixture
def settings(service_settings: Settings) -> Settings:
    return service_settings.model_copy(update={"auth": "required"})


@pytest.fixture
def people(db: Database) -> tuple[dict[str, str], dict[str, str]]:
    """Two user keys, made before the API starts (with auth on, it needs a key to exist)."""
    return bearer(db, "alice"), bearer(db, "bob")


@pytest.fixture
def client(settings: Settings, db: Database, tmp_path: Path, people: tuple) -> Iterator[TestClient]:
    worker = start_worker(settings, db, tmp_path / "worker.log")
    try:
        with TestClient(create_app(settings)) as client:
            yield client
    finally:
        worker.stop()


def bearer(db: Database, name: str) -> dict[str, str]:
    with db.sessions.begin() as session:
        return {"Authorization": f"Bearer {keys.create(session, name, False)[1]}"}


def test_a_jobs_manifest_replays_it_token_for_token_for_its_own_key_only(
    client: TestClient, db: Database, settings: Settings, people: tuple
) -> None:
    alice, bob = people
    body = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0.9, "ignore_eos": True}
    job_id = client.post("/v1/jobs", json=body, headers=alice).json()["id"]  # no seed: the API picks one
    db.wait_until([job_id], {"succeeded"}, timeout=120)
    manifest = client.get(f"/v1/jobs/{job_id}/manifest", headers=alice).json()
    seed = manifest["params"]["seed"]
    assert isinstance(seed, int) and manifest["model"] == settings.served_model_name
    served = manifest["served_by"]
    assert served["model_digest"].startswith("sha256:") and served["tokenizer_digest"].startswith("sha256:")
    assert (served["device"], served["dtype"], served["batch_invariant"]) == ("cpu", "float32", True)
    llm = LLM(settings.model, device="cpu", dtype="float32", kv_cache_bytes=64 * 2**20)
    [reference] = llm.generate([manifest["prompt_token_ids"]], SamplingParams(**manifest["params"]))
    assert manifest["output_token_ids"] == [reference.outputs[0].token_ids]  # the manifest reproduces it

    replayed = client.post(f"/v1/jobs/{job_id}/replay", headers=alice)
    assert replayed.status_code == 202 and replayed.json()["replay"]["identical"] is None
    replay_id = replayed.json()["id"]
    db.wait_until([replay_id], {"succeeded"}, timeout=120)
    view = client.get(f"/v1/jobs/{replay_id}", headers=alice).json()
    assert view["params"]["seed"] == seed
    assert view["replay"] == {
        "replay_of": job_id,
        "identical": True,
        "first_divergence": None,
        "same_model": True,
    }
    again = client.get(f"/v1/jobs/{replay_id}/manifest", headers=alice).json()
    assert again["output_token_ids"] == manifest["output_token_ids"] and again["replay_of"] == job_id

    for path in (f"/v1/jobs/{job_id}/manifest", f"/v1/jobs/{job_id}/replay"):
        call = client.get if path.endswith("manifest") else client.post
        assert call(path, headers=bob).status_code == 404
    assert client.delete(f"/v1/jobs/{job_id}", headers=alice).status_code in (200, 204)
    assert client.post(f"/v1/jobs/{job_id}/replay", headers=alice).status_code == 404
    gone = client.get(f"/v1/jobs/{replay_id}", headers=alice).json()["replay"]
    assert gone == {"replay_of": job_id, "identical": None, "first_divergence": None, "same_model": None}


def upload_batch(client: TestClient, headers: dict[str, str], bodies: list[dict[str, Any]]) -> str:
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions", "body": body}
        for i, body in enumerate(bodies)
    ]
    content = "\n".join(json.dumps(line) for line in lines).encode()
    files = {"file": ("in.jsonl", io.BytesIO(content))}
    uploaded = client.post("/v1/files", files=files, data={"purpose": "batch"}, headers=headers)
    assert uploaded.status_code == 200, uploaded.text
    request = {
        "input_file_id": uploaded.json()["id"],
        "endpoint": "/v1/completions",
        "completion_window": "24h",
    }
    created = client.post("/v1/batches", json=request, headers=headers)
    assert created.status_code == 200 and created.json()["status"] == "in_progress", created.text
    return created.json()["id"]


def ended_batch(client: TestClient, headers: dict[str, str], batch_id: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        batch = client.get(f"/v1/batches/{batch_id}", headers=headers).json()
        return batch if batch["status"] == "completed" else None

    return wait_for(ended, 120, f"batch {batch_id} to complete", interval=0.2)  # type: ignore[return-value]


def output_lines(client: TestClient, headers: dict[str, str], batch: dict[str, Any]) -> list[dict[str, Any]]:
    content = client.get(f"/v1/files/{batch['output_file_id']}/content", headers=headers).content
    return [json.loads(line) for line in content.splitlines()]


def test_a_batch_replays_line_for_line_and_its_lines_carry_their_manifests_digest(
    client: TestClient, people: tuple
) -> None:
    alice, bob = people
    prompts = ["The quick brown fox", "Once upon a time", "In a hole in the ground", "It was a bright cold"]
    bodies = [
        {"prompt": prompts[0], "max_tokens": 8, "temperature": 0, "ignore_eos": True},  # greedy
        {"prompt": prompts[1], "max_tokens": 8, "temperature": 0.9, "seed": 7, "ignore_eos": True},
        {
            "prompt": prompts[2],
            "max_tokens": 8,
            "temperature": 1.2,
            "top_k": 50,
            "ignore_eos": True,
        },  # seed picked
        {"prompt": prompts[3], "max_tokens": 8, "temperature": 0, "n": 2, "ignore_eos": True},
    ]
    batch_id = upload_batch(client, alice, bodies)
    original = ended_batch(client, alice, batch_id)
    assert original["replay"] is None and original["request_counts"]["completed"] == 4
    lines = output_lines(client, alice, original)
    for line in lines:
        manifest = client.get(f"/v1/jobs/{line['response']['request_id']}/manifest", headers=alice).json()
        assert line["manifest_digest"] == manifest["digest"]
        content = {key: value for key, value in manifest.items() if key != "digest"}
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert manifest["digest"] == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

    assert client.post(f"/v1/batches/{batch_id}/replay", headers=bob).status_code == 404
    replayed = client.post(f"/v1/batches/{batch_id}/replay", headers=alice)
    assert replayed.status_code == 202, replayed.text
    replay_id = replayed.json()["id"]
    assert replayed.headers["Location"] == f"/v1/batches/{replay_id}" and replay_id != batch_id
    pending = {"replay_of": batch_id, "identical": None, "different": None, "same_model": None}
    assert replayed.json()["replay"] == pending and replayed.json()["request_counts"]["total"] == 4

    replay = ended_batch(client, alice, replay_id)
    assert replay["replay"] == {"replay_of": batch_id, "identical": 4, "different": 0, "same_model": True}
    again = output_lines(client, alice, replay)
    assert [line["custom_id"] for line in again] == [line["custom_id"] for line in lines]
    texts = [[c["text"] for c in line["response"]["body"]["choices"]] for line in (*lines, *again)]
    assert texts[:4] == texts[4:] and len(texts[3]) == 2
    jobs = [client.get(f"/v1/jobs/{line['response']['request_id']}", headers=alice).json() for line in again]
    assert [job["replay"]["replay_of"] for job in jobs] == [line["response"]["request_id"] for line in lines]
    assert all(job["batch_id"] == replay_id and job["replay"]["identical"] for job in jobs)
    assert {line["manifest_digest"] for line in again}.isdisjoint(line["manifest_digest"] for line in lines)


@pytest.mark.fast
def test_a_replay_batch_counts_lines_identical_different_and_whether_one_model_served_them() -> None:
    same, differs, unknown = (
        Comparison(True, None, True),
        Comparison(False, 3, True),
        Comparison(None, None, None),
    )
    assert counted([same, differs, unknown]) == {"identical": 1, "different": 1, "same_model": True}
    upgraded = Comparison(False, 0, False)
    assert counted([same, upgraded]) == {"identical": 1, "different": 1, "same_model": False}
    assert counted([unknown]) == {"identical": 0, "different": 0, "same_model": None}


@pytest.mark.fast
@pytest.mark.parametrize(
    ("original", "replay", "expected"),
    [
        ([[1, 2, 3]], [[1, 2, 3]], None),
        ([[1, 2, 3]], [[1, 9, 3]], 1),
        ([[1, 2, 3]], [[1, 2]], 2),
        ([[1, 2], [4, 5]], [[1, 2], [4, 6]], 1),
        ([[1, 2], [4, 5]], [[1, 2]], 0),
    ],
)
def test_first_divergence_is_the_first_token_where_some_choice_differs(original, replay, expected) -> None:
    assert first_divergence(original, replay) == expected
