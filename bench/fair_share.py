"""Fair share: does a large batch of one key starve another key's online requests?

    python bench/fair_share.py [--model DIR] [--lines 2000] [--online 20] [--max-tokens 16]
        [--same-priority]

Needs PostgreSQL and Redis as the tests use them; starts its own ``pagedq api`` and ``pagedq worker``
on a fresh database, twice:
- off: ``PAGEDQ_FAIR_SHARE=false PAGEDQ_BATCH_PRIORITY=0``, the service before fair share (a message
  claims its own job, in broker order; a batch has the online requests' priority);
- on: the defaults (a message claims the fairest queued job; batches default to priority 10).
Each time, key A uploads a ``--lines`` chat batch and creates it; once it is ``in_progress``, key B sends
``--online`` chat completions at once. B's queue time (started_at − queued_at, from its job rows) is
printed as p50 and p95 for both runs, with the ratio off / on. ``--same-priority`` creates the batch at
priority 0 in both runs, so only the rule between keys can help B.

The API runs with ``PAGEDQ_AUTH=required``; the bench makes two user keys in the fresh database, and
each side sends its own (``Authorization: Bearer``), so the API records each job's owner.
"""

import argparse
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service_overhead import ADMIN_URL, batch_file, start  # noqa: E402

from contract.engine import DEFAULT_MODEL  # noqa: E402
from core import keys  # noqa: E402
from core.db import make_db_engine, make_sessionmaker  # noqa: E402
from core.queue import make_celery, queue_depth, queue_name  # noqa: E402
from core.settings import Settings  # noqa: E402
from migrations import upgrade  # noqa: E402

DATABASE, BROKER = "pagedq_bench_fair", "redis://127.0.0.1:6379/15"  # its own: other benches use 14
MODES = {"off": {"fair_share": False, "batch_priority": 0}, "on": {}}


KEYS = (("bench-a", False), ("bench-b", False), ("bench-admin", True))  # the admin key reads /readyz


def fresh_settings(model: str, **overrides: object) -> tuple[Settings, str, str, str]:
    """Settings of a fresh database, and the keys made in it: A's, B's and an admin's."""
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    base = ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    port = free_port()
    settings = Settings(
        database_url=f"{base}/{DATABASE}",
        broker_url=BROKER,
        model=model,
        port=port,
        auth="required",
        **overrides,
    )
    upgrade(settings)
    redis.Redis.from_url(BROKER).flushdb()
    engine = make_db_engine(settings)
    with make_sessionmaker(engine).begin() as session:
        made = [keys.create(session, name, admin)[1] for name, admin in KEYS]
    engine.dispose()
    return settings, *made


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_worker(url: str, admin_key: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", headers=bearer(admin_key)).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the service at {url} was not ready in {timeout}s")


def create_batch(client: httpx.Client, data: bytes, priority: int | None) -> str:
    file = client.post("/v1/files", files={"file": ("bench.jsonl", data)}, data={"purpose": "batch"})
    body = {
        "input_file_id": file.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    batch = client.post(
        "/v1/batches", json=body | ({} if priority is None else {"priority": priority})
    ).json()
    if batch.get("status") != "in_progress":
        raise SystemExit(f"the batch was not accepted: {batch}")
    return batch["id"]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def online_request(url: str, model: str, key: str, i: int, max_tokens: int) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Question {i}: name a colour."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=bearer(key), timeout=3600)
    response.raise_for_status()


def wait_published(settings: Settings, database_url: str, lines: int, timeout: float = 300) -> None:
    """Until every line's message is in the broker (or already taken): a batch's messages are published
    after its response, and B must come after all of them, as when a batch has been queued for a while."""
    celery, queue = make_celery(settings), queue_name(settings.served_model_name)
    deadline = time.monotonic() + timeout
    with psycopg.connect(database_url, autocommit=True) as db:
        while time.monotonic() < deadline:
            (taken,) = db.execute("SELECT count(*) FROM jobs WHERE status != 'queued'").fetchone()
            if queue_depth(celery, queue) + taken >= lines:
                return
            time.sleep(0.2)
    raise SystemExit(f"the batch's {lines} messages were not published in {timeout}s")


def queue_times_ms(database_url: str) -> list[float]:
    """B's jobs: every job not of the batch."""
    with psycopg.connect(database_url) as db:
        rows = db.execute(
            "SELECT extract(epoch FROM started_at - queued_at) * 1000 FROM jobs WHERE batch_id IS NULL"
        ).fetchall()
    return [float(ms) for (ms,) in rows]


def run(mode: str, args: argparse.Namespace, logs: Path) -> list[float]:
    settings, key_a, key_b, admin_key = fresh_settings(args.model, max_num_seqs=args.seats, **MODES[mode])
    url, database_url = f"http://127.0.0.1:{settings.port}", ADMIN_URL.rsplit("/", 1)[0] + f"/{DATABASE}"
    api = start("api", settings, logs / f"api-{mode}.log")
    worker = start("worker", settings, logs / f"worker-{mode}.log")
    try:
        wait_worker(url, admin_key)
        with httpx.Client(base_url=url, headers=bearer(key_a), timeout=600) as a:
            create_batch(a, batch_file(args.lines, args.max_tokens), 0 if args.same_priority else None)
        wait_published(settings, database_url, args.lines)
        with ThreadPoolExecutor(args.online) as pool:
            sent = [
                pool.submit(online_request, url, settings.served_model_name, key_b, i, args.max_tokens)
                for i in range(args.online)
            ]
            for future in sent:
                future.result()
        return queue_times_ms(database_url)
    finally:
        for process in (worker, api):
            process.terminate()
            process.wait(60)


def p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--lines", type=int, default=2000, help="key A's batch")
    parser.add_argument("--online", type=int, default=20, help="key B's chat completions, sent at once")
    parser.add_argument("--max-tokens", type=int, default=16, help="of every request, batch and online")
    parser.add_argument("--seats", type=int, default=32, help="PAGEDQ_MAX_NUM_SEQS of the worker")
    parser.add_argument("--same-priority", action="store_true", help="the batch at priority 0, as B's")
    parser.add_argument("--logs", help="keep the API's and worker's logs in this folder")
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as temporary:
        logs = Path(args.logs or temporary)
        logs.mkdir(parents=True, exist_ok=True)
        for mode in MODES:
            results[mode] = run(mode, args, logs)
    machine = f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)"
    print(f"{machine}; model {args.model}, {args.seats} seats; max_tokens {args.max_tokens}")
    print(f"key A: a {args.lines}-line batch, then key B: {args.online} online requests at once")
    for mode, times in results.items():
        print(f"fair share {mode:3}: B's queue time p50 {p(times, 50):8.0f} ms  p95 {p(times, 95):8.0f} ms")
    off, on = results["off"], results["on"]
    print(f"ratio off / on: p50 {p(off, 50) / p(on, 50):.1f}x  p95 {p(off, 95) / p(on, 95):.1f}x")


if __name__ == "__main__":
    main()
