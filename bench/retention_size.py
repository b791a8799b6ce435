"""The database's size before and after a retention purge, against the real PostgreSQL.

    python -m bench.retention_size [--jobs 2000] [--files 3] [--file-mib 20] [--url postgresql://HOST:PORT]

Makes a scratch database, migrates it, and fills it with ``--jobs`` ended jobs past their time (each with
a prompt, an output of about 250 tokens, its token ids, per-token times in four chunks and a webhook
delivery) and as many that are kept, plus ``--files`` expired batch input files of ``--file-mib`` MiB
of JSONL and one that is kept. Then runs the worker's purge (``core/purge.py``) and prints the sizes
(``pg_database_size``, ``pg_total_relation_size`` of each table) before the purge, after it, after
a plain ``VACUUM`` (what autovacuum does: the space is free for new rows, the files keep their size),
after writing as many expired jobs and files again (they fill the freed space) and after a second
purge and ``VACUUM FULL`` (the files rewritten: the space goes back to the operating system), with the
first purge's wall time, its transactions and the longest one (how long it held row locks).
"""

import argparse
import random
import time
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import Engine, event, insert

from bench.fresh_database import fresh_settings
from core.db import make_db_engine, make_sessionmaker
from core.models import FRESH_RESULTS, File, Job, TokenTimes, WebhookDelivery, new_file_id, utcnow
from core.purge import Purger

DATABASE = "pagedq_bench_retention"
TABLES = ("jobs", "job_token_times", "files", "webhook_deliveries")
_LETTERS = random.Random(1)
WORDS = [
    "".join(_LETTERS.choices("etaoinshrdlucmfwypvbgkjqxz", k=_LETTERS.randint(2, 9))) for _ in range(5000)
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--file-mib", type=int, default=20)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432")
    args = parser.parse_args()
    settings = fresh_settings(args.url, DATABASE)
    engine = make_db_engine(settings)
    try:
        fill(engine, args.jobs, args.files, args.file_mib)
        url = f"{args.url}/{DATABASE}"
        run(engine, url, args.jobs)
        fill(engine, args.jobs, args.files, args.file_mib, kept=False, first=2 * args.jobs)
        report(engine, url)
    finally:
        engine.dispose()
        with psycopg.connect(f"{args.url}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


def fill(engine: Engine, jobs: int, files: int, file_mib: int, kept: bool = True, first: int = 0) -> None:
    """``jobs`` and ``files`` past their time, and as many jobs and one file kept (``kept``)."""
    now, rng = utcnow(), random.Random(first)
    past, future = now - timedelta(hours=1), now + timedelta(days=30)
    rows = [_job(first + i, rng, past if i < jobs else future) for i in range(2 * jobs if kept else jobs)]
    with make_sessionmaker(engine).begin() as session:
        session.execute(insert(Job), rows)
        session.execute(insert(TokenTimes), [_times(row["id"], k, rng) for row in rows for k in range(4)])
        session.execute(insert(WebhookDelivery), [_delivery(row["id"]) for row in rows])
        for i in range(files + 1 if kept else files):
            content = _jsonl(rng, file_mib * 2**20)
            expires = past if i < files else future
            session.execute(
                insert(File).values(
                    id=new_file_id(), purpose="batch", filename=f"in{i}.jsonl", bytes=len(content),
                    content=content, created_at=now, expires_at=expires,
                )
            )  # fmt: skip


def _job(i: int, rng: random.Random, expires_at: Any) -> dict[str, Any]:
    text = " ".join(rng.choices(WORDS, k=250))
    return FRESH_RESULTS | {
        "id": f"job_bench{i:08d}", "status": "succeeded", "model": "bench", "priority": 0,
        "prompt": " ".join(rng.choices(WORDS, k=120)), "prompt_token_ids": rng.choices(range(49152), k=128),
        "params": {"max_tokens": 256}, "meta": {}, "attempt": 1, "cancel_requested": False,
        "output_text": text, "finish_reason": "length", "prompt_tokens": 128, "completion_tokens": 256,
        "queued_at": utcnow(), "finished_at": utcnow(), "expires_at": expires_at,
    }  # fmt: skip


def _times(job_id: str, k: int, rng: random.Random) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": 1,
        "first": 64 * k,
        "times_ms": [rng.uniform(0, 9e3) for _ in range(64)],
    }


def _delivery(job_id: str) -> dict[str, Any]:
    payload = {"object": "event", "type": "job.succeeded", "data": {"id": job_id, "status": "succeeded"}}
    return {"id": f"msg_{job_id}", "event_type": "job.succeeded", "url": "https://hooks.example/x",
            "payload": payload, "job_id": job_id, "status": "delivered", "attempts": []}  # fmt: skip


def _jsonl(rng: random.Random, size: int) -> bytes:
    lines, total, i = [], 0, 0
    while total < size:
        words = " ".join(rng.choices(WORDS, k=40))
        line = f'{{"custom_id": "r{i}", "method": "POST", "url": "/v1/chat/completions", "body": '
        line += f'{{"messages": [{{"role": "user", "content": "{words}"}}], "max_tokens": 64}}}}\n'
        lines.append(line)
        total, i = total + len(line), i + 1
    return "".join(lines).encode()


def sizes(url: str) -> dict[str, int]:
    with psycopg.connect(url) as connection:
        found = {"database": connection.execute("SELECT pg_database_size(current_database())").fetchone()[0]}
        for table in TABLES:
            found[table] = connection.execute(f"SELECT pg_total_relation_size('{table}')").fetchone()[0]
    return found


def vacuum(url: str, full: bool) -> None:
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f"VACUUM {'FULL ' if full else ''}ANALYZE")


STAGES: dict[str, dict[str, int]] = {}


def run(engine: Engine, url: str, jobs: int) -> None:
    vacuum(url, full=False)  # settle the visibility map, so "before" and "after" differ only by the purge
    stages = STAGES
    stages["before the purge"] = sizes(url)
    transactions = TransactionTimes(engine)
    started = time.perf_counter()
    counts = Purger(make_sessionmaker(engine), chunk=500).purge()
    seconds = time.perf_counter() - started
    event.remove(engine, "begin", transactions.begin)
    event.remove(engine, "commit", transactions.commit)
    stages["after the purge"] = sizes(url)
    vacuum(url, full=False)
    stages["after VACUUM (autovacuum's work)"] = sizes(url)
    print(f"purged {counts} in {seconds:.2f} s: {len(transactions.durations)} transactions, the longest "
          f"{max(transactions.durations) * 1000:.0f} ms, median "
          f"{sorted(transactions.durations)[len(transactions.durations) // 2] * 1000:.0f} ms")  # fmt: skip


def report(engine: Engine, url: str) -> None:
    """The same volume written again reuses the freed space; then a purge and VACUUM FULL shrink it."""
    STAGES["after writing as much again"] = sizes(url)
    Purger(make_sessionmaker(engine), chunk=500).purge()
    vacuum(url, full=True)
    STAGES["after another purge and VACUUM FULL"] = sizes(url)
    print("| stage | " + " | ".join(["database", *TABLES]) + " |")
    print("| --- |" + " ---: |" * (len(TABLES) + 1))
    for stage, found in STAGES.items():
        print(f"| {stage} | " + " | ".join(f"{found[name] / 2**20:.1f} MiB" for name in found) + " |")


class TransactionTimes:
    """How long each committed transaction took, from BEGIN to COMMIT."""

    def __init__(self, engine: Engine) -> None:
        self.durations: list[float] = []
        self._began = 0.0
        event.listen(engine, "begin", self.begin)
        event.listen(engine, "commit", self.commit)

    def begin(self, _connection: Any) -> None:
        self._began = time.perf_counter()

    def commit(self, _connection: Any) -> None:
        self.durations.append(time.perf_counter() - self._began)


if __name__ == "__main__":
    main()
