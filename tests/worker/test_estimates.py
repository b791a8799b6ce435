"""A running batch's estimated end (worker/estimates.py) on the real PostgreSQL: the model's measured rate
(the prompt and max tokens of its jobs that ended lately, over the time they took) against the work left
of the batch and of the jobs ranked with or before it; one ``batch.at_risk`` event when it will miss its
window; the batch's view shows both while it runs."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from api.batches.schemas import BatchOut
from core.batches import tally
from core.db import make_db_engine, make_sessionmaker
from core.models import Batch, File, Job, WebhookDelivery, utcnow
from core.settings import Settings
from core.states import BatchStatus, JobStatus
from core.webhooks import Outbox
from worker.estimates import Estimator, remaining

MODEL = "tiny"


@pytest.fixture
def sessions(service_settings: Settings) -> Iterator[object]:
    engine = make_db_engine(service_settings)
    yield make_sessionmaker(engine)
    engine.dispose()


def job(status: JobStatus, prompt: int, max_tokens: int, **values: object) -> Job:
    return Job(
        model=MODEL,
        status=status,
        prompt_tokens=prompt,
        prompt_token_ids=[1],
        params={"max_tokens": max_tokens},
        **values,
    )


def running_batch(session, now, total: int, **fields) -> Batch:
    """An in-progress batch of ``total`` lines, due in an hour, flushed so that its id is known."""
    upload = File(purpose="batch", filename="in.jsonl", bytes=1, content=b"x")
    session.add(upload)
    session.flush()
    batch = Batch(
        status=BatchStatus.IN_PROGRESS,
        endpoint="/v1/completions",
        model=MODEL,
        input_file_id=upload.id,
        completion_window="1h",
        created_at=now,
        expires_at=now + timedelta(hours=1),
        total=total,
        **fields,
    )
    session.add(batch)
    session.flush()
    return batch


def test_the_estimate_is_the_work_ahead_over_the_measured_rate_and_a_late_batch_is_at_risk_once(
    service_settings, sessions
):
    now = utcnow()
    with sessions.begin() as session:
        batch = running_batch(session, now, 5, priority=10, webhook_url="https://example.com/hook")
        started = now - timedelta(seconds=100)
        done = [
            job(JobStatus.SUCCEEDED, 20, 30, started_at=started, finished_at=now - timedelta(seconds=5))
            for _ in range(4)
        ]
        lines = [
            job(JobStatus.QUEUED, 10, 10, batch_id=batch.id, priority=10, queued_at=now) for _ in range(4)
        ]
        lines.append(
            job(
                JobStatus.RUNNING,
                10,
                10,
                batch_id=batch.id,
                priority=10,
                queued_at=now,
                first_token_at=now,
                completion_tokens=4,
            )
        )
        online = job(JobStatus.QUEUED, 30, 20, priority=0, queued_at=now)  # ranked before the batch
        later = job(JobStatus.QUEUED, 500, 500, priority=100, queued_at=now)  # ranked after it: not counted
        session.add_all([*done, *lines, online, later])
    estimator = Estimator(Outbox(service_settings, None))  # type: ignore[arg-type]
    with sessions.begin() as session:
        assert estimator.estimate(session) == []  # an hour of window, 68 s of work left: not at risk
    with sessions() as session:
        batch = session.get_one(Batch, batch.id)
        # 4 x 50 tokens of work done in ~100 s: 2 a second; left: 4 x 20 + (10 - 4) + 50 = 136 tokens.
        seconds = (batch.estimated_completion_at - now).total_seconds()
        assert 136 / 2 - 1 < seconds < 136 / 2 + 1, seconds
        view = BatchOut.of(batch, tally(session, [batch.id])[batch.id])
        assert (
            view.estimated_completion_at == int(batch.estimated_completion_at.timestamp())
            and not view.at_risk
        )

    with sessions.begin() as session:
        session.get_one(Batch, batch.id).expires_at = now + timedelta(seconds=30)  # it will miss this
    for _ in range(2):
        with sessions.begin() as session:
            estimator.estimate(session)
    with sessions() as session:
        batch = session.get_one(Batch, batch.id)
        events = select(func.count()).where(
            WebhookDelivery.batch_id == batch.id, WebhookDelivery.event_type == "batch.at_risk"
        )
        assert batch.at_risk_at is not None and session.scalar(events) == 1  # once, however many rounds
        assert BatchOut.of(batch, tally(session, [batch.id])[batch.id]).at_risk


def test_before_any_job_ends_the_rate_is_what_the_running_jobs_have_generated(service_settings, sessions):
    now = utcnow()
    with sessions.begin() as session:
        batch = running_batch(session, now, 9)
        started = now - timedelta(seconds=100)
        line = {"batch_id": batch.id, "priority": 10, "queued_at": now}
        decoding = {"started_at": started, "first_token_at": started, "completion_tokens": 15}
        running = [job(JobStatus.RUNNING, 20, 30, **decoding, **line) for _ in range(4)]  # 4 x 35 done
        prefilling = job(JobStatus.RUNNING, 20, 30, started_at=now, **line)  # no token yet: nothing done
        queued = [job(JobStatus.QUEUED, 20, 30, **line) for _ in range(4)]
        session.add_all([*running, prefilling, *queued])
    with sessions.begin() as session:
        Estimator(Outbox(service_settings, None)).estimate(session)  # type: ignore[arg-type]
    with sessions() as session:
        estimated = session.get_one(Batch, batch.id).estimated_completion_at
        # 140 tokens of work in 100 s; left: 4 x 15 + 50 + 4 x 50 = 310 tokens, 221 s. Counting only
        # ended jobs there would be no rate at all; once one of the four ended, a quarter of this one.
        assert estimated is not None
        seconds = (estimated - now).total_seconds()
        assert 310 / 1.4 - 3 < seconds < 310 / 1.4 + 3, seconds


def test_a_batch_sent_seconds_after_another_is_not_ahead_of_it_though_its_aged_priority_is_the_same(
    service_settings, sessions
):
    aging, now = service_settings.fair_aging_seconds, utcnow()
    bucket = datetime.fromtimestamp(now.timestamp() // aging * aging, UTC)  # one aged priority for all

    def line(batch: Batch, status: JobStatus, after: float, **values: object) -> Job:
        queued_at = bucket + timedelta(seconds=after)
        turn = {"priority": 10, "queued_at": queued_at, "deadline_at": queued_at + timedelta(hours=1)}
        return job(status, 10, 10, batch_id=batch.id, **turn, **values)

    with sessions.begin() as session:
        first, second = running_batch(session, now, 4), running_batch(session, now, 5)
        session.add_all([line(first, JobStatus.QUEUED, 1) for _ in range(4)])
        session.add_all([line(second, JobStatus.QUEUED, 2) for _ in range(4)])
        beside = line(second, JobStatus.RUNNING, 2, first_token_at=now, completion_tokens=4)
        no_window = job(JobStatus.QUEUED, 30, 20, priority=10, queued_at=bucket)  # after every deadline
        session.add_all([beside, no_window])
    with sessions() as session:
        # The first: its 4 x 20 and the second's running line (6 left); the second's queued lines wait.
        assert remaining(session, session.get_one(Batch, first.id), aging) == 4 * 20 + 6
        assert remaining(session, session.get_one(Batch, second.id), aging) == 4 * 20 + 4 * 20 + 6
