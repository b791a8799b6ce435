"""What each flush of one long job costs the worker's store, against the real PostgreSQL.

    python -m bench.token_times_flush [--tokens 4096] [--per-flush 16] [--url postgresql://HOST:PORT]

Makes a scratch database, migrates it, claims one job and writes its progress as the flusher does:
``--per-flush`` new tokens each time (about 4 characters of text a token), the last write final.
Prints each flush's wall time, this process's CPU time and the bytes of token times it sent, then the
medians of each eighth of the run: flat when a flush's cost does not grow with the tokens already
written. Commits skip the wait for the WAL flush (``synchronous_commit=off``, this bench's connections
only): on a shared machine the fsync's latency would drown the cost of the write itself. Runs on this
checkout's store, whichever design it has (the per-token times rewritten whole each flush, or appended a
chunk at a time): run it from the checkout's root, so that its code is the one imported.
"""

import argparse
import json
import statistics
import time
from dataclasses import fields
from typing import Any

import psycopg
from sqlalchemy import event

from bench.fresh_database import fresh_settings
from core.db import make_db_engine, make_sessionmaker
from core.models import Job, utcnow
from core.states import JobStatus
from worker.store import JobStore, Progress

DATABASE = "pagedq_bench_token_times"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--per-flush", type=int, default=16)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432")
    args = parser.parse_args()
    settings = fresh_settings(args.url, DATABASE)
    engine = make_db_engine(settings)
    event.listen(engine, "connect", _without_fsync_wait)
    try:
        durations = flushes(JobStore(make_sessionmaker(engine), "bench"), args.tokens, args.per_flush)
    finally:
        engine.dispose()
        with psycopg.connect(f"{args.url}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
    report(durations, args.per_flush)


def _without_fsync_wait(connection: Any, _record: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
    connection.commit()


def flushes(store: JobStore, tokens: int, per_flush: int) -> list[tuple[float, float, int]]:
    with store.sessions.begin() as session:
        job = Job(model="bench", prompt_token_ids=[1, 2, 3], params={}, published_at=utcnow())
        session.add(job)
        session.flush()
        job_id = job.id
    run = store.claim(job_id, "bench-worker")
    assert run is not None
    appends = "token_times_from" in {f.name for f in fields(Progress)}
    times: list[float] = []
    durations: list[tuple[float, float, int]] = []
    for done in range(per_flush, tokens + 1, per_flush):
        new = [round(25.0 * i + 0.123, 3) for i in range(len(times), done)]
        times += new
        progress = Progress(run.id, run.attempt, "word" * done, done, started_at=utcnow())
        if appends:
            progress.token_times_ms, progress.token_times_from = new, done - len(new)
        else:
            progress.token_times_ms = list(times)
        if done == tokens:
            progress.status, progress.finish_reason = JobStatus.SUCCEEDED, "length"
        sent = len(json.dumps(progress.token_times_ms))
        started, cpu = time.perf_counter(), time.process_time()
        assert store.write([progress]) == set()
        wall, cpu = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
        durations.append((wall, cpu, sent))
    with store.sessions() as session:
        stored = session.get_one(Job, job_id).token_times_ms
    assert stored == times, "the stored times differ from those written"
    return durations


def report(durations: list[tuple[float, float, int]], per_flush: int) -> None:
    for i, (wall, cpu, sent) in enumerate(durations, 1):
        print(f"flush {i:4d}  tokens {i * per_flush:5d}  {wall:7.3f} ms  cpu {cpu:6.3f} ms  {sent:6d} B")
    eighth = max(len(durations) // 8, 1)
    parts = [durations[i : i + eighth] for i in range(0, len(durations), eighth)]
    for name, column in (("wall ms", 0), ("cpu ms", 1), ("bytes", 2)):
        medians = (statistics.median(row[column] for row in part) for part in parts)
        print(f"median {name} per eighth of the run:", " ".join(f"{m:.3f}" for m in medians))
    print(f"total {sum(row[0] for row in durations):.1f} ms over {len(durations)} flushes")


if __name__ == "__main__":
    main()
