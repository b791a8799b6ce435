"""Fair share: does a large batch of one key starve another key's online requests?

    python -m bench.fair_share [--model DIR] [--lines 2000] [--online 20] [--max-tokens 16]
        [--same-priority] [--keep]

Starts its own ``pagedq api`` and ``pagedq worker`` (bench/stack.py) on a fresh database of the machine's
PostgreSQL and Redis, twice:
- off: ``PAGEDQ_FAIR_SHARE=false PAGEDQ_BATCH_PRIORITY=0``, the service before fair share (a message
  claims its own job, in broker order; a batch has the online requests' priority);
- on: the defaults (a message claims the fairest queued job; batches default to priority 10).
Each time, key A uploads a ``--lines`` chat batch and creates it; once it is ``in_progress``, key B sends
``--online`` chat completions at once. B's queue time (started_at − queued_at, from its job rows) is
printed as p50 and p95 for both runs, with the ratio off / on. ``--same-priority`` creates the batch at
priority 0 in both runs, so only the rule between keys can help B.

The API runs with ``PAGEDQ_AUTH=required``; the bench makes two user keys and an admin key (for
``/readyz``) in the fresh database, and each side sends its own (``Authorization: Bearer``), so the API
records each job's owner.
"""

import argparse
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import text

from bench.service_overhead import batch_file
from bench.stack import BENCH_REDIS_URL, Shared, Stack, service_stack
from contract.engine import DEFAULT_MODEL
from core import keys
from core.queue import make_celery, queue_depth, queue_name

SHARED = Shared("pagedq_bench_fair", BENCH_REDIS_URL)  # a database of its own, made afresh
MODES = {"off": {"fair_share": False, "batch_priority": 0}, "on": {}}
KEYS = (("bench-a", False), ("bench-b", False), ("bench-admin", True))


def make_keys(stack: Stack) -> list[str]:
    """A's, B's and an admin's key."""
    with stack.db.sessions.begin() as session:
        return [keys.create(session, name, admin)[1] for name, admin in KEYS]


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


def wait_published(stack: Stack, lines: int, timeout: float = 300) -> None:
    """Until every line's message is in the broker (or already taken): a batch's messages are published
    after its response, and B must come after all of them, as when a batch has been queued for a while."""
    celery, queue = make_celery(stack.settings), queue_name(stack.settings.served_model_name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with stack.db.engine.connect() as db:
            taken = db.scalar(text("SELECT count(*) FROM jobs WHERE status != 'queued'"))
        if queue_depth(celery, queue) + taken >= lines:
            return
        time.sleep(0.2)
    raise SystemExit(f"the batch's {lines} messages were not published in {timeout}s")


def queue_times_ms(stack: Stack) -> list[float]:
    """B's jobs: every job not of the batch."""
    query = "SELECT extract(epoch FROM started_at - queued_at) * 1000 FROM jobs WHERE batch_id IS NULL"
    with stack.db.engine.connect() as db:
        return [float(ms) for ms in db.scalars(text(query))]


def run(mode: str, args: argparse.Namespace) -> list[float]:
    fields = {"model": args.model, "max_num_seqs": args.seats, "auth": "required", **MODES[mode]}
    with service_stack(SHARED, keep=args.keep, **fields) as stack:
        key_a, key_b, admin_key = make_keys(stack)
        _, url = stack.api(admin_key)
        stack.worker(f"worker-{mode}")
        with httpx.Client(base_url=url, headers=bearer(key_a), timeout=600) as a:
            create_batch(a, batch_file(args.lines, args.max_tokens), 0 if args.same_priority else None)
        wait_published(stack, args.lines)
        model = stack.settings.served_model_name
        with ThreadPoolExecutor(args.online) as pool:
            sent = [
                pool.submit(online_request, url, model, key_b, i, args.max_tokens) for i in range(args.online)
            ]
            for future in sent:
                future.result()
        return queue_times_ms(stack)


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
    parser.add_argument("--keep", action="store_true", help="keep the API's and worker's logs")
    args = parser.parse_args()
    results = {mode: run(mode, args) for mode in MODES}
    machine = f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)"
    print(f"{machine}; model {args.model}, {args.seats} seats; max_tokens {args.max_tokens}")
    print(f"key A: a {args.lines}-line batch, then key B: {args.online} online requests at once")
    for mode, times in results.items():
        print(f"fair share {mode:3}: B's queue time p50 {p(times, 50):8.0f} ms  p95 {p(times, 95):8.0f} ms")
    off, on = results["off"], results["on"]
    print(f"ratio off / on: p50 {p(off, 50) / p(on, 50):.1f}x  p95 {p(off, 95) / p(on, 95):.1f}x")


if __name__ == "__main__":
    main()
