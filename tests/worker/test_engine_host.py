"""The worker's roles as its composition root wires them (worker/main.py's ``engine_host``), on the real
PostgreSQL and the tiny model, without Celery: pool threads' jobs run in the one engine to their written
results, and a stop requeues what still runs before it lets the threads go."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from core.models import Worker, storable
from core.states import JobStatus
from tests.support.roles import add_job, row
from tests.support.services import wait_for
from worker.claimer import RunResult
from worker.connections import WorkerConnections
from worker.engine import LLM, SamplingParams
from worker.health import WorkerHealth
from worker.main import engine_host
from worker.store import JobStore

GREEDY = {"temperature": 0.0, "max_tokens": 8, "ignore_eos": True}


def test_jobs_run_to_their_results_and_a_stop_requeues_what_still_runs(service_settings, tmp_path: Path):
    connections = WorkerConnections.connect(service_settings)
    model = service_settings.served_model_name
    store, heartbeats = (
        JobStore(connections.job_sessions, model),
        JobStore(connections.heartbeat_sessions, model),
    )
    health = WorkerHealth(tmp_path / "worker-status.json", refresh_every=1.0, worker_id="w1")
    published: list[tuple[str, int]] = []

    def publish(*message) -> None:
        published.append(message)

    host = engine_host(
        service_settings,
        service_settings.engine_config(),
        store,
        heartbeats,
        publish,
        "w1",
        health,
        None,
        connections.turns,
    )
    quick = add_job(store, model=store.model, prompt_token_ids=[1, 2, 3], params=GREEDY)
    slow = add_job(store, model=store.model, params=GREEDY | {"max_tokens": 900})
    host.start()
    with store.sessions() as session:  # registered, with the engine's stats and its weights as loaded
        worker = session.get_one(Worker, "w1")
        assert worker.stats["num_running"] == 0
        assert worker.weights == host.loop.engine.runner.weights.as_json()
    try:
        with ThreadPoolExecutor(2) as pool:  # Celery's threads pool, as the worker runs it
            quick_run, slow_run = pool.submit(host.run, quick), pool.submit(host.run, slow)
            assert quick_run.result(timeout=60) is RunResult.FINISHED
            wait_for(lambda: row(store, slow).completion_tokens > 0, 30, "the slow job's progress")
            host.stop()
            assert slow_run.result(timeout=30) is RunResult.FINISHED  # its requeue is written
        with store.sessions() as session:  # and it left the workers table
            assert session.get(Worker, "w1") is None
    finally:
        connections.dispose()
    reference = LLM(service_settings.model, device="cpu", dtype="float32", kv_cache_bytes=16 << 20)
    [expected] = reference.generate([[1, 2, 3]], SamplingParams(**GREEDY))
    done, requeued = row(store, quick), row(store, slow)
    assert (done.status, done.completion_tokens) == ("succeeded", 8)
    assert done.output_text == storable(expected.outputs[0].text)
    assert (requeued.status, requeued.attempt, requeued.worker_id) == (JobStatus.QUEUED, 1, None)
    assert published == [(slow, 0)]
