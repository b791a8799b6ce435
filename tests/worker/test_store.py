"""The worker's conditional writes on the real PostgreSQL: a stale run can never overwrite a newer one."""

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text, update
from sqlalchemy.exc import OperationalError

from api.batches.bulk_insert import insert_jobs
from core.db import make_db_engine, make_sessionmaker
from core.models import Job, Worker, utcnow
from core.queue import celery_priority, priorities_at
from core.settings import Settings
from core.states import JobStatus
from tests.support.bulk_jobs import job_row, shared_values
from worker.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from worker.results import Clock, JobResult
from worker.store import JobStore, Progress, database_away


@pytest.fixture
def store(service_settings: Settings) -> Iterator[JobStore]:
    engine = make_db_engine(service_settings)
    yield JobStore(make_sessionmaker(engine), "tiny")
    engine.dispose()


# ``JobStore.take``'s marks, as a claimer with nothing else claiming would make them: each accepted.
MARKS = (lambda _: True, lambda _: None)


def add_job(store: JobStore) -> str:
    with store.sessions.begin() as session:
        job = Job(model="tiny", prompt_token_ids=[1, 2, 3], params={"max_tokens": 4}, published_at=utcnow())
        session.add(job)
        session.flush()
        return job.id


def get(store: JobStore, job_id: str) -> Job:
    with store.sessions() as session:
        return session.get_one(Job, job_id)


def test_a_job_is_claimed_once(store: JobStore) -> None:
    job_id = add_job(store)
    first = store.claim(job_id, "w1")
    assert first is not None and first.attempt == 1 and first.prompt_token_ids == [1, 2, 3]
    assert store.claim(job_id, "w2") is None
    assert get(store, job_id).worker_id == "w1"


def test_stale_attempt_cannot_overwrite_the_result_of_a_newer_one(store: JobStore) -> None:
    job_id = add_job(store)
    stale = store.claim(job_id, "w1")
    store.heartbeat("w1", {})
    with store.sessions.begin() as session:  # w1 falls silent
        session.execute(update(Worker).values(heartbeat_at=utcnow() - timedelta(minutes=5)))
    assert store.requeue_orphans(heartbeat_timeout=30) == [(job_id, 0)]
    fresh = store.claim(job_id, "w2")
    assert stale is not None and fresh is not None and fresh.attempt == stale.attempt + 1

    done = Progress(job_id, fresh.attempt, "fresh", 1, token_times_ms=[1.0], status=JobStatus.SUCCEEDED)
    assert store.write([done]) == set()
    late = Progress(job_id, stale.attempt, "stale", 2, token_times_ms=[1.0, 2.0], status=JobStatus.FAILED)
    assert store.write([late]) == {job_id}
    assert store.requeue(job_id, stale.attempt) is None
    job = get(store, job_id)
    assert (job.status, job.output_text, job.completion_tokens) == ("succeeded", "fresh", 1)


def test_one_write_of_many_runs_finds_exactly_the_stale_ones(store: JobStore) -> None:
    ids = [add_job(store) for _ in range(4)]
    runs = [store.claim(job_id, "w1") for job_id in ids]
    assert all(run is not None for run in runs)
    with store.sessions.begin() as session:  # another run took the second job over
        session.execute(update(Job).where(Job.id == ids[1]).values(attempt=Job.attempt + 1))
    progress = [Progress(run.id, run.attempt, f"text {i}", i) for i, run in enumerate(runs) if run]
    progress[3].status = JobStatus.SUCCEEDED  # results and partial progress in the same flush

    assert store.write(progress) == {ids[1]}
    jobs = [get(store, job_id) for job_id in ids]
    assert [job.output_text for job in jobs] == ["text 0", "", "text 2", "text 3"]
    assert [job.status for job in jobs] == ["running", "running", "running", "succeeded"]


def test_a_flush_of_many_runs_is_one_statement_for_their_progress_and_one_for_their_times(
    store: JobStore,
) -> None:
    """At 256 running jobs a flush comes about every token: a statement per job was one per token."""
    runs = [store.claim(add_job(store), "w1") for _ in range(20)]
    progress = [
        Progress(
            run.id, run.attempt, f"piece {i}", 2, token_times_ms=[1.0, 2.5], token_ids=[7, i], text_from=0
        )
        for i, run in enumerate(runs)
        if run
    ]
    statements: list[tuple[str, bool]] = []

    def count(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        statements.append((statement.split()[0], executemany))

    engine = store.sessions.kw["bind"]
    event.listen(engine, "before_cursor_execute", count)
    try:
        assert store.write(progress) == set()
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert statements == [("UPDATE", False), ("INSERT", False)]
    jobs = [get(store, p.job_id) for p in progress]
    assert [(job.output_text, job.completion_tokens) for job in jobs] == [
        (f"piece {i}", 2) for i in range(20)
    ]
    assert all(job.token_times_ms == [1.0, 2.5] and job.choices is None for job in jobs)


def test_a_result_written_beside_a_stale_one_keeps_its_token_times(store: JobStore) -> None:
    """Two results in one flush, one from a run another took over: the write matches one row of two, and
    the row it did write must not then be taken for lost (its times and its end would go)."""
    ids = [add_job(store) for _ in range(2)]
    runs = [store.claim(job_id, "w1") for job_id in ids]
    assert all(run is not None for run in runs)
    with store.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == ids[0]).values(attempt=Job.attempt + 1))
    results = [
        Progress(run.id, run.attempt, "done", 3, token_times_ms=[1.0, 2.0, 3.0], status=JobStatus.SUCCEEDED)
        for run in runs
        if run
    ]

    assert store.write(results) == {ids[0]}
    job = get(store, ids[1])
    assert (job.status, job.completion_tokens, job.token_times_ms) == ("succeeded", 3, [1.0, 2.0, 3.0])


def test_orphan_with_a_pending_cancel_ends_cancelled_not_requeued(store: JobStore) -> None:
    job_id = add_job(store)
    store.claim(job_id, "gone")
    with store.sessions.begin() as session:
        session.execute(update(Job).values(cancel_requested=True))
    assert store.requeue_orphans(heartbeat_timeout=30) == []
    assert get(store, job_id).status == JobStatus.CANCELLED


def test_a_job_abandoned_on_its_last_allowed_attempt_fails_instead_of_looping(store: JobStore) -> None:
    store.max_attempts = 2
    orphan, drained = add_job(store), add_job(store)
    for worker in ("w1", "w2"):
        assert store.claim(orphan, worker) is not None
        store.heartbeat(worker, {})
        with store.sessions.begin() as session:  # the worker dies mid-run
            session.execute(update(Worker).values(heartbeat_at=utcnow() - timedelta(minutes=5)))
        requeued = store.requeue_orphans(heartbeat_timeout=30)
        assert requeued == ([(orphan, 0)] if worker == "w1" else [])
    job = get(store, orphan)
    assert (job.status, job.attempt, job.worker_id) == (JobStatus.FAILED, 2, None)
    assert job.error is not None and job.error.startswith("abandoned by 2 workers (PAGEDQ_MAX_ATTEMPTS=2)")

    first = store.claim(drained, "w3")
    assert first is not None and store.requeue(drained, first.attempt) == 0  # a drain gives it back
    last = store.claim(drained, "w3")
    assert last is not None and store.requeue(drained, last.attempt) is None
    assert get(store, drained).status == JobStatus.FAILED


def test_only_queued_jobs_of_the_probed_step_past_their_publish_age_are_republished(store: JobStore) -> None:
    old, new, urgent = add_job(store), add_job(store), add_job(store)
    with store.sessions.begin() as session:
        minute_ago = utcnow() - timedelta(seconds=60)
        session.execute(update(Job).where(Job.id.in_([old, urgent])).values(published_at=minute_ago))
        session.execute(update(Job).where(Job.id == urgent).values(priority=-100))
    before = utcnow() - timedelta(seconds=30)
    assert store.waiting_priorities(before) == {0, -100}
    assert priorities_at(celery_priority(0)) == (-11, 11)
    assert store.republish_due(before, priorities_at(celery_priority(0))) == [(old, 0)]
    assert store.republish_due(before, priorities_at(celery_priority(0))) == []  # stamped: not again
    assert store.waiting_priorities(before) == {-100}
    assert get(store, new).status == JobStatus.QUEUED


def test_output_with_nul_is_stored_with_a_replacement_character(store: JobStore) -> None:
    job_id = add_job(store)
    run = store.claim(job_id, "w1")
    assert run is not None
    assert store.write([Progress(job_id, run.attempt, "a\x00b", 2, status=JobStatus.SUCCEEDED)]) == set()
    assert get(store, job_id).output_text == "a\ufffdb"


def test_a_row_the_database_refuses_fails_that_job_alone(store: JobStore) -> None:
    good, bad = add_job(store), add_job(store)
    runs = [store.claim(job_id, "w1") for job_id in (good, bad)]
    assert all(runs)
    progress = [
        Progress(good, 1, "fine", 1, token_times_ms=[1.0], status=JobStatus.SUCCEEDED),
        Progress(bad, 1, "odd", 1, token_times_ms=[float("nan")], status=JobStatus.SUCCEEDED),
    ]
    assert store.write(progress) == set()
    assert get(store, good).status == JobStatus.SUCCEEDED and get(store, good).output_text == "fine"
    failed = get(store, bad)
    assert failed.status == JobStatus.FAILED and "could not be stored" in (failed.error or "")


def test_token_times_are_appended_per_flush_and_a_new_run_starts_without_them(store: JobStore) -> None:
    job_id = add_job(store)
    run = store.claim(job_id, "w1")
    assert run is not None
    store.write([Progress(job_id, run.attempt, "ab", 2, token_times_ms=[1.0, 2.0])])
    store.write([Progress(job_id, run.attempt, "abc", 3, token_times_ms=[3.0], token_times_from=2)])
    again = Progress(job_id, run.attempt, "abcd", 4, token_times_ms=[3.0, 4.0], token_times_from=2)
    assert store.write([again]) == set()  # a chunk sent again after an unknown outcome replaces itself
    assert get(store, job_id).token_times_ms == [1.0, 2.0, 3.0, 4.0]
    stale = Progress(job_id, run.attempt - 1, "x", 5, token_times_ms=[9.0], token_times_from=4)
    assert store.write([stale]) == {job_id}
    assert get(store, job_id).token_times_ms == [1.0, 2.0, 3.0, 4.0]

    assert store.requeue(job_id, run.attempt) == 0
    rerun = store.claim(job_id, "w2")
    assert rerun is not None and get(store, job_id).token_times_ms == []
    late = Progress(job_id, run.attempt, "old", 5, token_times_ms=[5.0], token_times_from=4)
    assert store.write([late]) == {job_id}  # the old run, still going, is refused
    store.write([Progress(job_id, rerun.attempt, "n", 1, token_times_ms=[7.0], status=JobStatus.SUCCEEDED)])
    assert get(store, job_id).token_times_ms == [7.0]


def test_the_text_is_appended_per_flush_and_a_retry_or_a_new_run_writes_the_same(store: JobStore) -> None:
    job_id = add_job(store)
    run = store.claim(job_id, "w1")
    assert run is not None
    store.write([Progress(job_id, run.attempt, "ab", 2)])
    store.write([Progress(job_id, run.attempt, "cd", 4, text_from=2)])
    assert store.write([Progress(job_id, run.attempt, "cde", 5, text_from=2)]) == set()  # sent again, grown
    assert get(store, job_id).output_text == "abcde"
    assert store.write([Progress(job_id, run.attempt - 1, "x", 6, text_from=5)]) == {job_id}
    assert store.requeue(job_id, run.attempt) == 0
    rerun = store.claim(job_id, "w2")
    assert rerun is not None and get(store, job_id).output_text == ""
    store.write([Progress(job_id, rerun.attempt, "n\x00", 2, text_from=0)])
    store.write([Progress(job_id, rerun.attempt, "ew", 4, text_from=2, status=JobStatus.SUCCEEDED)])
    assert get(store, job_id).output_text == "n\ufffdew"


def test_a_long_jobs_flushes_carry_only_the_new_text(store: JobStore) -> None:
    job_id = add_job(store)
    run = store.claim(job_id, "w1")
    assert run is not None
    sizes: list[int] = []

    def record(*args: Any) -> None:  # before_cursor_execute: conn, cursor, statement, params, context, many
        statement, params, many = args[2], args[3], args[5]
        if statement.startswith("UPDATE jobs"):
            rows = params if many else [params]
            sizes.append(max(len(str(row)) for row in rows))

    piece = "token " * 100
    engine = store.sessions.kw["bind"]
    event.listen(engine, "before_cursor_execute", record)
    result, metrics = JobResult.of({}), RequestMetrics(arrival_time=0.0, first_scheduled_time=0.0)
    try:
        for _ in range(50):  # a step's text, then a flush of the run's progress, as the worker does
            step = RequestOutput(job_id, None, [1], [CompletionOutput(0, piece, [1])], False, metrics)
            result.fold(step, str)
            progress = result.progress(job_id, run.attempt, Clock())
            assert store.write([progress]) == set()
            result.written(progress)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert get(store, job_id).output_text == piece * 50  # 30,000 characters written...
    assert len(sizes) == 50 and max(sizes) < 2 * len(piece)  # ...by statements as small as one piece


def test_a_requeued_run_hands_its_flushed_tokens_to_the_next_and_that_one_to_the_one_after(
    store: JobStore,
) -> None:
    job_id = add_job(store)
    run = store.claim(job_id, "w1")
    assert run is not None and run.resume is None
    started = utcnow() - timedelta(seconds=5)
    store.write(
        [
            Progress(
                job_id, run.attempt, "ab", 2, token_times_ms=[1.0, 2.0], token_ids=[5, 6], started_at=started
            )
        ]
    )
    store.write(
        [
            Progress(
                job_id,
                run.attempt,
                "c",
                3,
                token_times_ms=[3.0],
                token_times_from=2,
                token_ids=[7],
                text_from=2,
                started_at=started,
            )
        ]
    )
    for attempt in (2, 3):  # the second run dies before its first flush: the third goes on from the same
        assert store.requeue(job_id, attempt - 1) == 0
        again = store.claim(job_id, f"w{attempt}")
        assert again is not None and again.attempt == attempt and again.resume is not None
        resume = again.resume
        assert (resume.token_ids, resume.times_ms, resume.text) == ([5, 6, 7], [1.0, 2.0, 3.0], "abc")
        assert resume.started_at == started
        job = get(store, job_id)
        assert (job.output_text, job.completion_tokens, job.token_times_ms) == ("abc", 3, [1.0, 2.0, 3.0])
        assert job.runs[-1] == {"attempt": attempt, "resumed_from_token": 3}
    assert get(store, job_id).runs[0] == {"attempt": 1, "resumed_from_token": 0}


@pytest.mark.parametrize("params", [{"n": 2}, {"logprobs": 1}, {"use_beam_search": True}])
def test_runs_that_cannot_resume_start_over(store: JobStore, params: dict[str, Any]) -> None:
    job_id = add_job(store)
    with store.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == job_id).values(params={"max_tokens": 4} | params))
    run = store.claim(job_id, "w1")
    assert run is not None
    store.write(
        [
            Progress(
                job_id, run.attempt, "ab", 2, token_times_ms=[1.0, 2.0], token_ids=[5, 6], started_at=utcnow()
            )
        ]
    )
    assert store.requeue(job_id, run.attempt) == 0
    again = store.claim(job_id, "w2")
    assert again is not None and again.resume is None
    job = get(store, job_id)
    assert (job.output_text, job.completion_tokens, job.token_times_ms, job.started_at) == ("", 0, [], None)
    assert job.runs[-1] == {"attempt": 2, "resumed_from_token": 0}


def test_a_bad_statement_on_sqlite_is_a_bug_and_a_busy_file_an_outage(tmp_path) -> None:
    """SQLite raises OperationalError for both; only the busy file is waited out (an outage)."""
    engine = create_engine(f"sqlite:///{tmp_path / 'store.db'}", connect_args={"timeout": 0})
    with pytest.raises(OperationalError) as bad, engine.connect() as connection:
        connection.execute(text("SELECT no_such_function(1)"))
    assert not database_away(bad.value)
    with engine.connect() as holder, engine.connect() as other:
        holder.exec_driver_sql("BEGIN EXCLUSIVE")
        with pytest.raises(OperationalError) as busy:
            other.execute(text("SELECT 1 FROM sqlite_master"))
        holder.rollback()
    assert database_away(busy.value)
    engine.dispose()


def test_the_pick_stays_prepared_across_claims_and_the_workers_reads(service_settings: Settings) -> None:
    """A ROLLBACK makes psycopg drop what it prepared on the connection: the worker's reads end in COMMIT
    and its pool hands back the connection used last, so after a few claims the pick runs prepared, not
    parsed and planned afresh each time (core/db.py)."""
    engine = make_db_engine(service_settings, connections=2)
    store = JobStore(make_sessionmaker(engine), "tiny", fair_aging=60.0)
    try:
        for _ in range(8):  # psycopg prepares a statement on its fifth run on a connection
            picked, claimed = store.take(add_job(store), set, "w1", *MARKS)
            assert claimed is not None and claimed.id == picked
            store.cancel_requested([picked])  # the flusher's and the reconciler's reads between claims
            store.waiting_priorities(utcnow())
        with engine.connect() as connection:
            prepared = connection.execute(text("SELECT statement FROM pg_prepared_statements")).scalars()
            assert any("fair_groups" in statement for statement in prepared)
    finally:
        engine.dispose()


def test_a_claims_statements_are_planned_once_not_at_each_claim(service_settings: Settings) -> None:
    """Beside 20,000 ended jobs, lone jobs taken (the pick and the claim in one statement) and a batch's
    lines taken (the pick, the prefixes held, the claim) run on generic plans once psycopg has prepared
    them: with the status bound as a value, PostgreSQL's generic plan guessed a fifth of the table and it
    planned the pick anew at every claim (~1 ms of a 2 ms take)."""
    engine = make_db_engine(service_settings, connections=1)  # one connection: its prepared statements
    store = JobStore(make_sessionmaker(engine), "tiny", fair_aging=60.0, prefix_aware=True)
    try:
        with store.sessions.begin() as session:
            ended = shared_values("tiny", status=JobStatus.SUCCEEDED.value, attempt=1)
            insert_jobs(session, ended, (job_row(queued_at=utcnow()) for _ in range(20_000)))
            session.execute(text("ANALYZE jobs"))
        lone = [add_job(store) for _ in range(12)]
        with store.sessions.begin() as session:
            now = utcnow()
            lines = [Job(model="tiny", prompt_token_ids=[1], params={}, queued_at=now) for _ in range(20)]
            session.add_all(lines)
        for job_id in [*lone, *(line.id for line in lines)]:
            picked, claimed = store.take(job_id, set, "w1", *MARKS)
            assert claimed is not None and claimed.id == picked
        with engine.connect() as connection:
            query = "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            plans = connection.execute(text(query)).all()
    finally:
        engine.dispose()
    runs = {
        plan.statement.split()[0] + (" pick" if "fair_groups" in plan.statement else ""): plan
        for plan in plans
    }
    assert runs["WITH pick"].generic_plans >= 20 and runs["SELECT"].generic_plans >= 5, runs
    assert all(plan.custom_plans <= 5 for plan in plans), runs  # PostgreSQL plans the first five anew


def test_take_claims_a_first_run_without_a_transaction_and_a_later_run_with_what_it_resumes(
    store: JobStore,
) -> None:
    """A first run is claimed by one UPDATE in autocommit (no BEGIN and COMMIT round trips before its first
    token); a requeued run in a transaction that also hands it the earlier run's flushed tokens."""
    job_id = add_job(store)
    commits: list[object] = []
    event.listen(store.sessions.kw["bind"], "commit", commits.append)
    picked, first = store.take(job_id, set, "w1", *MARKS)
    assert picked == job_id and first is not None and (first.attempt, first.resume) == (1, None)
    assert commits == []
    assert store.take(job_id, set, "w2", *MARKS) == (job_id, None)  # running: not claimable
    flushed = Progress(job_id, 1, "ab", 2, token_times_ms=[1.0, 2.0], token_ids=[5, 6], started_at=utcnow())
    store.write([flushed])
    assert store.requeue(job_id, 1) == 0
    commits.clear()
    _, again = store.take(job_id, set, "w3", *MARKS)
    assert again is not None and again.attempt == 2 and again.resume is not None
    assert (again.resume.token_ids, again.resume.text) == ([5, 6], "ab")
    assert len(commits) == 1
    job = get(store, job_id)
    assert (job.worker_id, job.status) == ("w3", JobStatus.RUNNING)
    assert job.runs == [{"attempt": 1, "resumed_from_token": 0}, {"attempt": 2, "resumed_from_token": 2}]
