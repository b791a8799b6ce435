"""A job's manifest and its replays, through the API with keys on, against a real worker."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.jobs.schemas import first_divergence
from core import keys
from core.settings import Settings
from tests.support.jobs_client import Database, start_worker
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
