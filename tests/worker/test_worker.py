"""The worker against the real PostgreSQL, Redis and Celery: results, batching, cancellation, faults."""

import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from core.models import WebhookDelivery, Worker, storable
from core.queue import queue_name
from core.settings import Settings
from tests.support.jobs_client import Database, api_client, start_worker, submit
from tests.support.services import Process, service_env, wait_for
from worker.engine import LLM, SamplingParams

PROMPTS = [f"The quick brown fox {i} jumps over" for i in range(100)]


@pytest.fixture
def workers(service_settings: Settings, db: Database, tmp_path: Path) -> Iterator[list[Process]]:
    """The workers a test spawned; all are stopped at its end."""
    started: list[Process] = []
    yield started
    for worker in started:
        worker.stop()


def spawn(settings: Settings, db: Database, workers: list[Process], tmp_path: Path, **overrides: object):
    worker = start_worker(settings.model_copy(update=overrides), db, tmp_path / f"worker{len(workers)}.log")
    workers.append(worker)
    return worker


def submit_greedy(client, prompt: str, max_tokens: int) -> str:
    return submit(client, prompt=prompt, max_tokens=max_tokens, temperature=0, ignore_eos=True)


def greedy(settings: Settings, prompts: list[str], max_tokens: int) -> list[str]:
    llm = LLM(settings.model, device="cpu", dtype="float32", kv_cache_bytes=64 * 2**20)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    return [storable(out.outputs[0].text) for out in outputs]  # as the database stores it


def test_job_result_matches_the_engine_and_has_one_timing_per_token(service_settings, db, workers, tmp_path):
    spawn(service_settings, db, workers, tmp_path)
    with api_client(service_settings) as client:
        job_id = submit_greedy(client, PROMPTS[0], 24)
        [job] = db.wait_until([job_id], {"succeeded"}, timeout=60)
        body = client.get(f"/v1/jobs/{job_id}").json()
    assert job.output_text == greedy(service_settings, PROMPTS[:1], 24)[0]
    assert job.completion_tokens == 24 == len(job.token_times_ms)
    assert job.token_times_ms == sorted(job.token_times_ms) and job.token_times_ms[0] >= 0
    assert job.queued_at <= job.started_at <= job.first_token_at <= job.finished_at
    assert job.attempt == 1 and job.finish_reason == "length"
    assert body["status"] == "succeeded" and body["timings"]["token_times_ms"] == job.token_times_ms


def test_hundred_concurrent_jobs_batch_together_in_one_engine(service_settings, db, workers, tmp_path):
    worker = spawn(service_settings, db, workers, tmp_path)
    with api_client(service_settings) as client, ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda p: submit_greedy(client, p, 16), PROMPTS))
    jobs = db.wait_until(ids, {"succeeded"}, timeout=180)
    assert [job.output_text for job in jobs] == greedy(service_settings, PROMPTS, 16)
    stats = db.worker_stats(worker.popen.pid)
    assert stats is not None and stats["peak_running"] > 1, stats


def test_cancelling_a_running_job_aborts_it_and_keeps_its_partial_output(
    service_settings, db, workers, tmp_path
):
    worker = spawn(service_settings, db, workers, tmp_path)
    with api_client(service_settings) as client:
        job_id = submit_greedy(client, PROMPTS[0], 900)
        wait_for(lambda: db.jobs([job_id])[0].completion_tokens > 0, 60, "partial output to be flushed")
        assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
        [job] = db.wait_until([job_id], {"cancelled"}, timeout=1.5)
    assert 0 < job.completion_tokens < 900 and job.output_text
    assert len(job.token_times_ms) == job.completion_tokens
    wait_for(
        lambda: (
            (s := db.worker_stats(worker.popen.pid)) and s["num_running"] == 0 and s["kv_cache_usage"] == 0
        ),
        5,
        "the engine to free the job's KV blocks",
    )


def test_killed_worker_loses_no_job_and_every_job_succeeds_once(service_settings, db, workers, tmp_path):
    first = spawn(service_settings, db, workers, tmp_path, max_num_seqs=8)
    prompts = PROMPTS[:50]
    with api_client(service_settings) as client:
        ids = [submit_greedy(client, p, 48) for p in prompts]

    def some_done_some_running() -> bool:
        """Jobs run in waves of 8: not between two waves, and not in the last (its jobs may all end
        between this read and the kill; with a wave still queued, ended jobs are replaced at once)."""
        statuses = [j.status for j in db.jobs(ids)]
        return statuses.count("succeeded") >= 5 and "running" in statuses and statuses.count("queued") >= 8

    wait_for(some_done_some_running, 120, "some jobs to finish while others run")
    first.kill()
    killed_running = {j.id for j in db.jobs(ids) if j.status == "running"}
    assert killed_running, "the kill should land while jobs are running"
    spawn(service_settings, db, workers, tmp_path, max_num_seqs=8)
    jobs = db.wait_until(ids, {"succeeded"}, timeout=240)
    assert [job.output_text for job in jobs] == greedy(service_settings, prompts, 48)
    assert all(job.completion_tokens == 48 == len(job.token_times_ms) for job in jobs)
    assert {j.id for j in jobs if j.attempt == 2} >= killed_running


def test_a_job_that_kills_its_worker_fails_after_max_attempts_with_its_webhook_event(
    service_settings, db, workers, tmp_path
):
    settings = service_settings.model_copy(update={"max_attempts": 1, "webhook_allow_private": True})
    pair = [Process(["worker"], service_env(settings), tmp_path / f"worker{i}.log") for i in range(2)]
    workers.extend(pair)  # started side by side: one runs the job, the other's reconciler finds it orphaned
    wait_for(lambda: all(db.worker_stats(w.popen.pid) for w in pair), 120, "both workers to register")
    with api_client(settings) as client:
        job_id = submit(
            client, prompt=PROMPTS[0], max_tokens=900, ignore_eos=True, webhook_url="http://127.0.0.1:9/"
        )
    wait_for(lambda: db.jobs([job_id])[0].completion_tokens > 0, 60, "the job to start")
    owner = db.jobs([job_id])[0].worker_id or ""
    [running] = [w for w in pair if owner.endswith(f":{w.popen.pid}")]
    running.kill()  # as a job that crashes its worker would; it was the job's last allowed attempt
    [job] = db.wait_until([job_id], {"failed"}, timeout=30)
    assert job.attempt == 1 and job.error.startswith("abandoned by 1 workers (PAGEDQ_MAX_ATTEMPTS=1)")
    with db.sessions() as session:
        events = session.scalars(select(WebhookDelivery.event_type).where(WebhookDelivery.job_id == job_id))
        assert list(events) == ["job.failed"]


def test_a_worker_killed_beside_a_live_one_loses_its_job_at_once_not_a_heartbeat_timeout_later(
    service_settings, db, workers, tmp_path
):
    """Same host and PID namespace: the live worker's reconciler sees the dead one's process gone
    (worker/liveness.py) and takes its job over, resumed, with the heartbeat timeout at ten minutes."""
    settings = service_settings.model_copy(update={"heartbeat_timeout": 600.0})
    pair = [Process(["worker"], service_env(settings), tmp_path / f"worker{i}.log") for i in range(2)]
    workers.extend(pair)
    wait_for(
        lambda: all(db.worker_stats(w.popen.pid) is not None for w in pair), 120, "both workers to register"
    )
    with api_client(settings) as client:
        job_id = submit_greedy(client, PROMPTS[0], 600)
    wait_for(lambda: db.jobs([job_id])[0].completion_tokens > 0, 60, "the job to flush some tokens")
    owner = db.jobs([job_id])[0].worker_id or ""
    [running] = [w for w in pair if owner.endswith(f":{w.popen.pid}")]
    running.kill()
    [job] = db.wait_until([job_id], {"succeeded"}, timeout=120)  # far within the heartbeat timeout
    assert job.attempt == 2 and job.runs[-1]["resumed_from_token"] > 0
    assert job.completion_tokens == 600 == len(job.token_times_ms)
    assert db.worker_stats(running.popen.pid) is None, "the dead worker left the workers table"


def test_sigterm_requeues_jobs_that_outlast_the_grace_period(service_settings, db, workers, tmp_path):
    # 900 tokens outlast a 0.1 s grace on any machine (the tiny model takes ~1 s for them on a fast one)
    first = spawn(service_settings, db, workers, tmp_path, shutdown_grace=0.1)
    with api_client(service_settings) as client:
        job_id = submit_greedy(client, PROMPTS[0], 900)
    wait_for(lambda: db.jobs([job_id])[0].completion_tokens > 0, 60, "the job to start")
    first.signal(signal.SIGTERM)
    assert first.popen.wait(30) == 0, first.log()[-3000:]
    [job] = db.jobs([job_id])
    assert job.status == "queued" and job.attempt == 1 and job.worker_id is None
    spawn(service_settings, db, workers, tmp_path)
    [job] = db.wait_until([job_id], {"succeeded"}, timeout=120)
    assert job.attempt == 2 and job.completion_tokens == 900


def test_sigterm_lets_short_jobs_finish_within_the_grace_period(service_settings, db, workers, tmp_path):
    # Queued before the worker starts, so its threads claim all four at once. The grace outlasts them on
    # any machine: this waits on the jobs' ends, not on how fast they are.
    with api_client(service_settings) as client:
        ids = [submit(client, prompt=p, max_tokens=800, ignore_eos=True) for p in PROMPTS[:4]]
    first = spawn(service_settings, db, workers, tmp_path, shutdown_grace=600)
    wait_for(lambda: all(j.attempt == 1 for j in db.jobs(ids)), 60, "the jobs to be claimed")
    running = [j.id for j in db.jobs(ids) if j.status == "running"]
    first.signal(signal.SIGTERM)
    assert running, "the test needs jobs still running at the SIGTERM"
    assert first.popen.wait(600) == 0, first.log()[-3000:]
    assert all(job.status == "succeeded" and job.attempt == 1 for job in db.jobs(ids))


def test_sigterm_exits_within_the_grace_requeueing_what_still_runs(service_settings, db, workers, tmp_path):
    grace = 2.0
    first = spawn(service_settings, db, workers, tmp_path, shutdown_grace=grace)
    with api_client(service_settings) as client:
        ids = [submit_greedy(client, p, 1000) for p in PROMPTS[:4]]
    wait_for(lambda: all(j.completion_tokens > 0 for j in db.jobs(ids)), 60, "the jobs to start")
    signalled = time.monotonic()
    first.signal(signal.SIGTERM)
    assert first.popen.wait(60) == 0, first.log()[-3000:]
    took = time.monotonic() - signalled
    assert took < grace + 2.0, f"a {grace:g} s grace took {took:.1f} s"
    # on a quiet box the tiny model may finish some within the grace; none may be left running or failed
    ended = [(j.status, j.attempt, j.completion_tokens) for j in db.jobs(ids)]
    assert all(e[:2] == ("queued", 1) or e == ("succeeded", 1, 1000) for e in ended), ended


def test_a_second_ctrl_c_requeues_at_once_and_quietly(service_settings, db, workers, tmp_path):
    first = spawn(service_settings, db, workers, tmp_path, shutdown_grace=600)
    with api_client(service_settings) as client:
        ids = [submit_greedy(client, p, 1000) for p in PROMPTS[:4]]
    wait_for(lambda: all(j.completion_tokens > 0 for j in db.jobs(ids)), 60, "the jobs to start")
    first.signal(signal.SIGINT)  # Ctrl-C, as a terminal sends it to the process group
    wait_for(lambda: '"draining"' in first.log(), 30, "the worker to drain")
    first.signal(signal.SIGINT)
    assert first.popen.wait(30) == 0, first.log()[-3000:]
    assert all(j.status == "queued" and j.attempt == 1 and j.worker_id is None for j in db.jobs(ids))
    log = first.log()
    assert '"levelname": "ERROR"' not in log and "NotImplementedError" not in log, log[-3000:]


def test_queued_job_whose_message_was_lost_is_republished(service_settings, db, workers, tmp_path):
    with api_client(service_settings) as client:
        job_id = submit(client, prompt=PROMPTS[0], max_tokens=8)
    broker = redis.Redis.from_url(service_settings.resolved_broker_url)
    lost = broker.keys(queue_name(service_settings.served_model_name) + "*")
    assert lost and broker.delete(*lost) >= 1
    spawn(service_settings, db, workers, tmp_path)
    [job] = db.wait_until([job_id], {"succeeded"}, timeout=60)
    assert job.attempt == 1


def test_a_lost_message_is_republished_while_the_queue_never_drains(service_settings, db, workers, tmp_path):
    broker = redis.Redis.from_url(service_settings.resolved_broker_url)
    queue = queue_name(service_settings.served_model_name)
    backlog = 12  # of 32-token jobs: a fast machine's worker drained 6 of 8 tokens between two top-ups
    with api_client(service_settings) as client:
        lost = submit(client, prompt=PROMPTS[0], max_tokens=8)
        assert broker.delete(*broker.keys(queue + "*")) >= 1  # its message is gone
        depths: list[int] = []
        stop = threading.Event()

        def keep_a_backlog() -> None:  # the one-seat worker never catches up
            while not stop.is_set():
                depth = sum(broker.llen(key) for key in broker.keys(queue + "*"))
                depths.append(depth)
                if depth < backlog:
                    submit(client, prompt=PROMPTS[len(depths) % 50], max_tokens=32, ignore_eos=True)
                else:
                    stop.wait(0.05)  # polls the depth again, or ends at once when told

        with ThreadPoolExecutor(1) as pool:
            feeding = pool.submit(keep_a_backlog)
            wait_for(lambda: len(depths) > 0 and depths[-1] >= backlog, 30, "a backlog")
            # Fair share off: with it, the first message would claim the lost job (the oldest), and the
            # probe, the repair this tests (of broker order, fair share's too), would have nothing to do.
            spawn(service_settings, db, workers, tmp_path, max_num_seqs=1, fair_share=False)
            watched_from = len(depths)
            try:
                [job] = db.wait_until([lost], {"succeeded"}, timeout=90)
            finally:
                stop.set()
                feeding.result()
    assert job.attempt == 1
    assert min(depths[watched_from:]) > 0, "the queue drained; the test proves nothing"
    assert job.published_at is not None and job.published_at > job.queued_at  # republished


def test_a_beam_search_job_returns_every_beam_best_first(service_settings, db, workers, tmp_path):
    spawn(service_settings, db, workers, tmp_path)
    params = {"max_tokens": 12, "temperature": 0, "use_beam_search": True, "n": 3}
    with api_client(service_settings) as client:
        job_id = submit(client, prompt=PROMPTS[0], **params)
        db.wait_until([job_id], {"succeeded"}, timeout=60)
        body = client.get(f"/v1/jobs/{job_id}").json()
    llm = LLM(service_settings.model, device="cpu", dtype="float32", kv_cache_bytes=64 * 2**20)
    [want] = llm.generate([PROMPTS[0]], SamplingParams(**params))
    assert [c["text"] for c in body["choices"]] == [storable(o.text) for o in want.outputs]
    assert body["output"] == body["choices"][0]["text"] and len(body["choices"]) == 3
    assert body["usage"]["completion_tokens"] == sum(len(o.token_ids) for o in want.outputs)


def test_heartbeat_period_follows_the_timeout_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDQ_HEARTBEAT_INTERVAL", raising=False)
    monkeypatch.setenv("PAGEDQ_HEARTBEAT_TIMEOUT", "12")
    assert Settings().heartbeat_period == 2.0  # six heartbeats per timeout: one lost is no death
    monkeypatch.setenv("PAGEDQ_HEARTBEAT_INTERVAL", "0.5")
    assert Settings().heartbeat_period == 0.5
    monkeypatch.setenv("PAGEDQ_HEARTBEAT_INTERVAL", "12")
    with pytest.raises(ValueError, match="must be shorter than PAGEDQ_HEARTBEAT_TIMEOUT"):
        Settings()


def test_jobs_engine_ms_add_up_to_the_workers_busy_time(service_settings, db, workers, tmp_path):
    worker = spawn(service_settings, db, workers, tmp_path, heartbeat_interval=0.5)
    with api_client(service_settings) as client, ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda i: submit_greedy(client, PROMPTS[i] * (1 + i % 5), 4 + 3 * i), range(12)))
        jobs = db.wait_until(ids, {"succeeded"}, timeout=180)
        usage = [client.get(f"/v1/jobs/{job_id}").json()["usage"] for job_id in ids]

    last_end = max(job.finished_at for job in jobs)

    def settled() -> dict[str, float] | None:  # a heartbeat after the last job ended: its busy time is final
        with db.sessions() as session:
            beat = session.scalars(select(Worker).where(Worker.id.endswith(f":{worker.popen.pid}"))).one()
            return beat.stats if beat.heartbeat_at > last_end and beat.stats["num_running"] == 0 else None

    stats = wait_for(settled, 30, "a heartbeat of the idle engine")
    assert [u["engine_ms"] for u in usage] == [job.engine_ms for job in jobs]
    assert all(job.engine_ms > 0 for job in jobs)
    assert sum(job.engine_ms for job in jobs) == pytest.approx(stats["busy_ms"], rel=0.02)


def test_a_killed_workers_jobs_resume_from_their_flushed_tokens_and_end_as_uninterrupted_runs(
    service_settings, db, workers, tmp_path
):
    """kill -9 mid-run: the next worker goes on from the tokens the first one flushed (greedy, seeded, and
    unseeded with the seed the API chose), and each job ends exactly as a run without the kill would."""
    settings = service_settings.model_copy(update={"webhook_allow_private": True})
    first = spawn(settings, db, workers, tmp_path)
    max_tokens, hook = 400, "http://127.0.0.1:9/"
    bodies = [
        {"temperature": 0},
        {"temperature": 1.0, "top_p": 0.9, "seed": 1234},
        {"temperature": 0.8},
    ]
    with api_client(settings) as client:
        ids = [
            submit(
                client, prompt=PROMPTS[i], max_tokens=max_tokens, ignore_eos=True, webhook_url=hook, **body
            )
            for i, body in enumerate(bodies)
        ]
        wait_for(
            lambda: (
                all(0 < j.completion_tokens < max_tokens // 2 for j in db.jobs(ids))
                or any(j.completion_tokens >= max_tokens // 2 for j in db.jobs(ids))
            ),
            120,
            "every job to flush some of its tokens",
        )
        first.kill()
        before = db.jobs(ids)
        assert all(job.status == "running" and job.completion_tokens > 0 for job in before), before
        spawn(settings, db, workers, tmp_path)
        jobs = db.wait_until(ids, {"succeeded"}, timeout=240)
        views = [client.get(f"/v1/jobs/{job_id}").json() for job_id in ids]

    llm = LLM(settings.model, device="cpu", dtype="float32", kv_cache_bytes=64 * 2**20)
    for job, earlier, view in zip(jobs, before, views, strict=True):
        reference = llm.generate([job.prompt_token_ids], SamplingParams(**job.params))[0].outputs[0]
        assert job.output_token_ids == [reference.token_ids]
        assert job.output_text == storable(reference.text)
        assert job.completion_tokens == max_tokens == len(job.token_times_ms)
        resumed_from = earlier.completion_tokens
        assert job.runs == [
            {"attempt": 1, "resumed_from_token": 0},
            {"attempt": 2, "resumed_from_token": resumed_from},
        ]
        assert view["runs"] == job.runs and view["usage"]["completion_tokens"] == max_tokens
        assert job.token_times_ms[:resumed_from] == earlier.token_times_ms  # the earlier run's times stay
        assert (job.started_at, job.first_token_at) == (earlier.started_at, earlier.first_token_at)
    assert jobs[2].params["seed"] is not None  # chosen at submission: the resumed run sampled with it
    with db.sessions() as session:
        for job_id in ids:
            events = session.scalars(
                select(WebhookDelivery.event_type).where(WebhookDelivery.job_id == job_id)
            )
            assert list(events) == ["job.succeeded"]
