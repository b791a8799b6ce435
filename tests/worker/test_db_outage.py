"""A PostgreSQL outage while jobs finish: the worker keeps every result and writes it when the database is
back, with no restart; it says it is unhealthy meanwhile; and every job succeeds exactly once.

The database is a private cluster this test stops and starts (``tests/support/private_postgres.py``).
"""

import ast
import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

from core.models import WebhookDelivery, storable
from core.settings import Settings
from tests.support.jobs_client import Database, api_client, job_messages, start_worker, submit
from tests.support.private_postgres import PrivatePostgres, private_postgres
from tests.support.services import redis_url, service_env, wait_for
from tests.worker.test_worker import PROMPTS
from worker.engine import LLM, SamplingParams

JOBS = 8
Service = tuple[Settings, PrivatePostgres]


@pytest.fixture
def outage_service(tmp_path: Path, tiny_llama: Path) -> Iterator[Service]:
    """A job service on a private cluster; every job end is recorded as a webhook event (never sent)."""
    model = tmp_path / f"tiny-{uuid.uuid4().hex[:8]}"  # this test's own queue
    model.symlink_to(tiny_llama, target_is_directory=True)
    webhook_queue = f"pagedq.webhooks.test-{model.name}"
    with private_postgres() as server:
        yield (
            Settings(
                database_url=server.create_migrated_database(),
                broker_url=redis_url(),
                model=str(model),
                data_dir=tmp_path / "data",
                device="cpu",
                dtype="float32",
                max_num_seqs=JOBS,
                kv_cache_bytes=64 * 2**20,
                flush_interval=0.1,
                heartbeat_interval=0.25,
                requeue_after=2.0,
                reconcile_interval=0.5,
                shutdown_grace=5.0,
                webhook_url="http://127.0.0.1:9/unused",
                webhook_queue=webhook_queue,
            ),
            server,
        )
    broker = redis.Redis.from_url(redis_url())
    if leftovers := broker.keys(webhook_queue + "*"):
        broker.delete(*leftovers)


def submit_greedy(settings: Settings, lengths: tuple[int, ...]) -> list[str]:
    with api_client(settings) as client:
        return [
            submit(client, prompt=prompt, max_tokens=n, temperature=0, ignore_eos=True)
            for prompt, n in zip(PROMPTS, lengths, strict=False)
        ]


def worker_check(settings: Settings) -> tuple[int, str]:
    """``pagedq worker --check``, as a compose healthcheck runs it."""
    command = [sys.executable, "-m", "pagedq", "worker", "--check"]
    done = subprocess.run(command, env=service_env(settings), capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout.strip()


@cache
def expected(model: Path, lengths: tuple[int, ...]) -> list[str]:
    """The engine's own greedy outputs, as the database stores them."""
    llm = LLM(str(model), device="cpu", dtype="float32", kv_cache_bytes=64 * 2**20)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    return [storable(out.outputs[0].text) for out in llm.generate(PROMPTS[: len(lengths)], params)]


def results_kept_unwritten(log: str) -> set[str]:
    """Jobs whose result waited for the database, as the worker's failed flushes name them."""
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    failed = [r for r in records if r.get("message") == "flush failed; retrying"]
    return {result["job_id"] for r in failed for result in r["unwritten_results"]}


def messages_given_back(log: str) -> Counter[str]:
    """The job ids the messages carry that the worker rejected back to the broker because their run's result
    was not written, as Celery's records name them (with fair share a message is a ticket: it may have run
    another job than its own)."""
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    rejected = [r for r in records if r.get("message", "").endswith("the job's result could be written")]
    return Counter(job_id for r in rejected for job_id in ast.literal_eval(r["data"]["args"]))


def succeeded_events(db: Database, ids: list[str]) -> dict[str, int]:
    with db.sessions() as session:
        query = (
            select(WebhookDelivery.job_id, func.count())
            .where(WebhookDelivery.job_id.in_(ids), WebhookDelivery.event_type == "job.succeeded")
            .group_by(WebhookDelivery.job_id)
        )
        return {job_id: count for job_id, count in session.execute(query).all()}


@pytest.mark.parametrize(
    ("heartbeat_timeout", "outage_s"),
    [(20.0, 2.0), (1.5, 3.0)],
    ids=["shorter-than-the-heartbeat-timeout", "longer-than-the-heartbeat-timeout"],
)
def test_jobs_finishing_during_a_database_outage_all_succeed_once(
    outage_service: Service, tiny_llama: Path, tmp_path: Path, heartbeat_timeout: float, outage_s: float
) -> None:
    settings, server = outage_service
    settings = settings.model_copy(update={"heartbeat_timeout": heartbeat_timeout})
    db = Database(settings)
    worker = start_worker(settings, db, tmp_path / "worker.log")
    try:
        # The first ends at once; the others, all running by then, one after another while the database is
        # away (long enough that none has ended when it goes, whatever the claim order).
        lengths = (6, *(6 + 60 * i for i in range(1, JOBS)))
        ids = submit_greedy(settings, lengths)
        wait_for(lambda: db.jobs(ids)[0].status == "succeeded", 60, "the first job to finish")
        server.stop()
        down_at = time.monotonic()
        _, line = wait_for(
            lambda: (check := worker_check(settings))[0] == 1 and "cannot write" in check[1] and check,
            30,
            "the worker to say it is unhealthy",
            interval=0.2,
        )
        assert line.startswith("unhealthy: cannot write to the database since "), line
        assert "OperationalError" in line, line
        wait_for(lambda: results_kept_unwritten(worker.log()) & set(ids), 60, "a job to end in the outage")
        time.sleep(max(0.0, outage_s - (time.monotonic() - down_at)))  # the outage lasts at least this
        server.start()

        jobs = db.wait_until(ids, {"succeeded"}, timeout=90)
        assert worker.popen.poll() is None, "the worker recovered by itself, not by a restart"
        assert [job.output_text for job in jobs] == expected(tiny_llama, lengths)
        assert [job.completion_tokens for job in jobs] == list(lengths)
        assert all(len(job.token_times_ms) == job.completion_tokens for job in jobs)
        assert results_kept_unwritten(worker.log()) & set(ids), "the test needs jobs that ended in the outage"
        assert succeeded_events(db, ids) == dict.fromkeys(ids, 1), "each job ended exactly once"
        # Never presumed dead, even past the heartbeat timeout: its reconciler judges only once it has been
        # connected for a heartbeat timeout, by when the worker has beaten again. Nothing ran twice.
        assert all(job.attempt == 1 for job in jobs), [job.attempt for job in jobs]
        wait_for(lambda: worker_check(settings)[0] == 0, 30, "the worker to say it is healthy", interval=0.2)
    finally:
        worker.stop()
        db.close()
    assert worker.popen.returncode == 0, worker.log()[-3000:]


def test_sigterm_during_an_outage_gives_unwritten_jobs_back_to_the_broker(
    outage_service: Service, tiny_llama: Path, tmp_path: Path
) -> None:
    settings, server = outage_service
    settings = settings.model_copy(update={"heartbeat_timeout": 1.5, "shutdown_grace": 0.5})
    db = Database(settings)
    lengths = (400,) * 4  # queued before the worker starts, and long enough that all four run at once
    ids = submit_greedy(settings, lengths)
    first = start_worker(settings, db, tmp_path / "worker1.log")
    try:
        wait_for(lambda: all(j.status == "running" for j in db.jobs(ids)), 60, "the jobs to be running")
        server.stop()
        first.signal(signal.SIGTERM)
        # The drain deadline, then the heartbeat timeout of retries: then it lets the runs go, unwritten.
        assert first.popen.wait(30) == 0, first.log()[-3000:]
    finally:
        first.stop()
    # A ticket may have run another job than the one it names, and the reconciler may have republished a
    # job whose ticket did so (one job, two messages); a spare ticket refused by the drain goes back too.
    # So the runs are counted by the messages given back, and those must still wait in the broker.
    messages = Counter(job_messages(settings))
    server.start()
    unwritten = {job.id for job in db.jobs(ids) if job.status == "running"}
    given_back = messages_given_back(first.log())
    assert unwritten and given_back.total() == len(unwritten), (given_back, unwritten)
    assert set(given_back) <= set(ids) and not given_back - messages, "their messages were not acknowledged"

    second = start_worker(settings, db, tmp_path / "worker2.log")
    try:
        jobs = db.wait_until(ids, {"succeeded"}, timeout=90)
        assert [job.output_text for job in jobs] == expected(tiny_llama, lengths)
        assert succeeded_events(db, ids) == dict.fromkeys(ids, 1)
        assert all(job.attempt == 2 for job in jobs if job.id in unwritten)
    finally:
        second.stop()
        db.close()
