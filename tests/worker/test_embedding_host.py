"""An embedding worker's roles as worker/embedding_host.py wires them, on the real PostgreSQL and a tiny
random BERT, without Celery: embedding jobs run to their written vectors (one per input, as the library
embeds them), a stale attempt cannot overwrite them, and a stop requeues what has not run."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from core.embeddings import floats, unpack
from core.models import Job, Worker
from core.served_models import ModelEntry
from core.states import JobStatus
from tests.support.roles import add_job, row
from worker.claimer import RunResult
from worker.connections import WorkerConnections
from worker.embedding_host import embedding
from worker.engine import LLM
from worker.health import WorkerHealth
from worker.main import engine_host
from worker.store import JobStore

INPUTS = [[2, 40, 41, 3], [2, 50, 3], [2, 60, 61, 62, 63, 3]]


@pytest.fixture
def host_parts(service_settings, tiny_bert_model: Path, tmp_path: Path):
    entry = ModelEntry(name=f"bert-{tmp_path.name}"[:60], source=str(tiny_bert_model), kind="embed")
    connections = WorkerConnections.connect(service_settings)
    store = JobStore(connections.job_sessions, entry.name)
    heartbeats = JobStore(connections.heartbeat_sessions, entry.name)
    health = WorkerHealth(tmp_path / "worker-status.json", refresh_every=1.0, worker_id="e1")
    published: list[tuple[str, int]] = []
    engine_config = entry.engine_config(service_settings.engine_config())
    host = engine_host(
        service_settings,
        engine_config,
        store,
        heartbeats,
        lambda *m: published.append(m),
        "e1",
        health,
        None,
        connections.turns,
        embedding(engine_config),
    )
    yield host, store, entry, published
    connections.dispose()


def test_embedding_jobs_run_to_their_vectors(host_parts, tiny_bert_model: Path) -> None:
    host, store, entry, _ = host_parts
    jobs = [
        add_job(store, model=entry.name, prompt_token_ids=INPUTS, params={}, endpoint="/v1/embeddings"),
        add_job(store, model=entry.name, prompt_token_ids=INPUTS[:1], params={"truncate_prompt_tokens": 2}),
    ]
    host.start()
    try:
        with store.sessions() as session:  # registered with the embedding engine's stats and weights
            worker = session.get_one(Worker, "e1")
            assert worker.stats["num_running"] == 0
            assert worker.weights == host.loop.engine.engine.runner.weights.as_json()
            assert list(worker.weights["types"]) == ["F32"] and worker.weights["bytes"] > 0
        with ThreadPoolExecutor(2) as pool:
            assert all(r is RunResult.FINISHED for r in pool.map(host.run, jobs, timeout=60))
        assert host.run(jobs[0]) is RunResult.SKIPPED  # a redelivered message: its job is done
    finally:
        host.stop()
    reference = LLM(str(tiny_bert_model), kind="embed", device="cpu", dtype="float32")
    expected = [output.embedding for output in reference.embed(INPUTS)]
    whole, truncated = row(store, jobs[0]), row(store, jobs[1])
    assert (whole.status, whole.attempt, whole.finish_reason) == (JobStatus.SUCCEEDED, 1, "stop")
    assert [floats(v) for v in unpack(whole.embeddings, 3)] == expected  # float32, bit for bit
    assert whole.started_at <= whole.first_token_at <= whole.finished_at and whole.engine_ms > 0
    [cut] = reference.embed([INPUTS[0][:2]])
    assert floats(truncated.embeddings) == cut.embedding
    assert truncated.completion_tokens == 0 and not whole.token_time_chunks  # no per-token rows


def test_a_stale_attempts_vectors_are_not_written(host_parts) -> None:
    host, store, entry, _ = host_parts
    job_id = add_job(store, model=entry.name, prompt_token_ids=INPUTS, params={})
    host.start()
    try:
        flight = host.claimer.claim(job_id)
        with store.sessions.begin() as session:  # presumed dead: another worker runs attempt 2 meanwhile
            session.get_one(Job, job_id).attempt = 2
        host.loop.add(flight)
        flight.done.wait(60)
    finally:
        host.stop()
    job = row(store, job_id)
    assert (job.status, job.attempt, job.embeddings) == (JobStatus.RUNNING, 2, None)


def test_a_refused_job_fails_with_the_engines_reason(host_parts) -> None:
    host, store, entry, _ = host_parts
    job_id = add_job(store, model=entry.name, prompt_token_ids=[[2, 10**6, 3]], params={})
    host.start()
    try:
        assert host.run(job_id) is RunResult.FINISHED
    finally:
        host.stop()
    job = row(store, job_id)
    assert job.status == JobStatus.FAILED and "token ids must be integers in [0, " in job.error
