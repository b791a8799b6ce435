"""The claim's pick at scale: ms to choose the fairest queued job, today's query against the indexed one.

    python -m bench.claim_scale [--sizes 2000,50000,200000] [--picks 30] [--url postgresql://HOST:PORT]

For each size, a scratch database (migrated) gets that many queued jobs by COPY, shaped like a busy
service's queue: 12 keys and the open mode (no key), each with batches (lines sharing one queued_at and a
1 h or 24 h window, 30 prompt prefixes among them) and online jobs of priorities 0 and 5 submitted over
the last hour (some with a completion_window), plus 32 running jobs spread over the keys (with
batches' prefix keys: other workers hold those). Then it times
``--picks`` picks of each query on the same rows, in turns:
- baseline: ``ORDER BY fair_order(...) LIMIT 1`` over every queued row (the pick before the index);
- indexed: ``worker/fair.fairest`` (a skip scan of ``ix_jobs_fair_heads``, one head per group);
then ``--picks`` whole picks (``JobStore.pick`` with prefix-aware order: the running jobs read, the
fairest found, the rows submitted with it probed for a held prefix), ``--picks`` two-step claims (``pick``
then ``claim`` in a second transaction: the claim before ``take``) and ``--picks`` claims as the worker
makes them (``JobStore.take``: pick and ``UPDATE`` in one transaction), the row taken each time.
Each indexed answer is checked against the baseline's. Prints
median/p95 ms and the baseline / indexed ratio of medians.
"""

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import func, select

from api.batches.bulk_insert import insert_jobs
from bench.fresh_database import fresh_settings
from core import keys
from core.db import make_db_engine, make_sessionmaker
from core.models import FRESH_RESULTS, Job, utcnow
from core.states import JobStatus
from worker.fair import fair_order, fairest, skipping
from worker.store import JobStore

DATABASE, MODEL, AGING, KEYS = "pagedq_bench_claim_scale", "bench", 30.0, 12
WIDTHS = (8, 13, 11, 11, 11, 11, 6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2000,50000,200000")
    parser.add_argument("--picks", type=int, default=30)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432")
    args = parser.parse_args()
    columns = ("queued", "baseline ms", "indexed ms", "pick ms", "2-step ms", "claim ms", "x")
    print(" ".join(f"{name:>{width}}" for name, width in zip(columns, WIDTHS, strict=True)))
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            measure(args.url, size, args.picks)
    finally:
        with psycopg.connect(f"{args.url}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def measure(url: str, size: int, picks: int) -> None:
    engine = make_db_engine(fresh_settings(url, DATABASE))
    sessions = make_sessionmaker(engine)
    try:
        fill(sessions, size, random.Random(size))
        with psycopg.connect(f"{url}/{DATABASE}", autocommit=True) as direct:
            direct.execute("VACUUM ANALYZE jobs")
        store = JobStore(sessions, MODEL, fair_aging=AGING, prefix_aware=True)
        with sessions() as session:
            held = running(session)
            baseline = select(Job.id).where(Job.model == MODEL, Job.status == JobStatus.QUEUED)
            baseline = baseline.where(Job.cancel_requested.is_(False))
            baseline = baseline.order_by(*fair_order(held, AGING)).limit(1)
            indexed = fairest(MODEL, AGING, "postgresql").params(skipping(()))
            want = session.scalar(baseline)
            times: dict[str, list[float]] = {"baseline": [], "indexed": []}
            for _ in range(picks):
                for name, statement in (("baseline", baseline), ("indexed", indexed)):
                    took, got = timed(lambda s=statement: session.scalar(s))
                    assert got == want, (name, got, want)
                    times[name].append(took)
        times["pick"] = [timed(lambda: store.pick("any", set()))[0] for _ in range(picks)]
        claims = [timed(lambda: claim_one(store))[0] for _ in range(picks)]
        takes = [timed(lambda: take_one(store))[0] for _ in range(picks)]
        median = {name: statistics.median(values) for name, values in times.items()}
        ratio = median["baseline"] / median["indexed"]
        cells = (size, *(show(times[name]) for name in times), show(claims), show(takes), f"{ratio:.0f}x")
        print(" ".join(f"{cell:>{width}}" for cell, width in zip(cells, WIDTHS, strict=True)), flush=True)
    finally:
        engine.dispose()


def claim_one(store: JobStore) -> None:
    """A ticket before ``take``: pick the fairest job, then claim it in a second transaction."""
    assert store.claim(store.pick("any", set()) or "none", "bench-worker") is not None


def take_one(store: JobStore) -> None:
    """What a ticket does (worker/claimer.py): pick the fairest job and claim it in one transaction."""
    picked, job = store.take("any", set, "bench-worker", lambda _: True, lambda _: None)
    assert job is not None and job.id == picked


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return (time.perf_counter() - start) * 1000, result


def show(values: list[float]) -> str:
    """median/p95"""
    ordered = sorted(values)
    return f"{statistics.median(ordered):.2f}/{ordered[int(0.95 * (len(ordered) - 1))]:.1f}"


def running(session: Any) -> dict[str | None, int]:
    query = select(Job.key_id, func.count()).where(Job.model == MODEL, Job.status == JobStatus.RUNNING)
    return dict(session.execute(query.group_by(Job.key_id)).all())  # type: ignore[arg-type]


def fill(sessions: Any, size: int, rng: random.Random) -> None:
    """Queued (and 32 running) jobs."""
    with sessions.begin() as session:
        owners: list[str | None] = [keys.create(session, f"k{i}")[0].id for i in range(KEYS)]
        session.flush()
        owners.append(None)
        shared = {
            "model": MODEL,
            "prompt_token_ids": [1, 2, 3],
            "params": {"max_tokens": 16},
            "meta": {},
            "attempt": 0,
            "cancel_requested": False,
            "prompt_tokens": 3,
        } | FRESH_RESULTS
        insert_jobs(session, shared, rows(owners, size, rng))


def rows(owners: list[str | None], size: int, rng: random.Random) -> Iterator[dict[str, Any]]:
    now, batch_prefixes = utcnow(), []
    made = 0
    while made < size:
        owner, status = rng.choice(owners), JobStatus.QUEUED.value
        if rng.random() < 0.8:  # a batch: its lines share queued_at and deadline
            count = min(size - made, rng.randint(100, max(100, size // 20)))
            queued, priority = now - timedelta(seconds=rng.uniform(0, 3600)), 10
            deadline: Any = queued + timedelta(hours=rng.choice((1, 24)))
            prefixes = [rng.getrandbits(63) for _ in range(30)]
            batch_prefixes += prefixes
            for _ in range(count):
                yield row(owner, status, priority, queued, deadline, rng.choice(prefixes))
        else:
            count = min(size - made, 200)
            for _ in range(count):
                queued = now - timedelta(seconds=rng.uniform(0, 3600))
                deadline = queued + timedelta(hours=1) if rng.random() < 0.1 else None
                yield row(owner, status, rng.choice((0, 5)), queued, deadline, rng.getrandbits(63))
        made += count
    for _ in range(32):  # running: the keys' counts, and prefixes that other workers hold
        owner, prefix = rng.choice(owners), rng.choice(batch_prefixes or [0])
        yield row(owner, JobStatus.RUNNING.value, 10, now, None, prefix)


def row(
    owner: str | None, status: str, priority: int, queued: Any, deadline: Any, prefix: int
) -> dict[str, Any]:
    return {
        "id": f"job_{uuid.uuid4().hex}",
        "key_id": owner,
        "status": status,
        "priority": priority,
        "queued_at": queued,
        "deadline_at": deadline,
        "prefix_key": prefix,
    }


if __name__ == "__main__":
    main()
