"""Prefix-aware order: a batch of many questions about a few documents, shuffled, on a small KV cache.

    python -m bench.prefix_batch [--model DIR] [--docs 20] [--questions 100] [--doc-words 340]
        [--max-tokens 16] [--seats 16] [--kv-cache-mib 192] [--workers 1,2] [--keep]

Needs PostgreSQL and Redis as the tests use them. For each worker count and each mode it starts its own
``pagedq api`` and that many ``pagedq worker`` processes (bench/stack.py) on a fresh database, and
sends one batch of ``--docs`` x ``--questions`` completions lines (a document of ``--doc-words`` words,
about 1,000 tokens at the default, then a question), shuffled, ``max_tokens`` 16, with a KV cache of
``--kv-cache-mib`` per worker, too small to hold every document at once:
- off: ``PAGEDQ_PREFIX_AWARE_ORDER=false`` (no prefix keys: the lines run in input order);
- on: the default (lines of one document run together, each worker on the documents its cache holds).
Prints, per run, the batch's wall time (first line started to last line finished), lines/s and the cached
share of prompt tokens (``cached_tokens / prompt_tokens`` over its jobs), then on / off throughput ratios.
"""

import argparse
import json
import os
import platform
import random
import time

import httpx
from sqlalchemy import text

from bench.stack import BENCH_REDIS_URL, Shared, service_stack
from contract.engine import DEFAULT_MODEL

MODES = {"off": {"prefix_aware_order": False}, "on": {"prefix_aware_order": True}}
WORDS = ("river", "stone", "market", "winter", "lantern", "harbor", "copper", "meadow", "signal", "orchard")


def batch_file(args: argparse.Namespace) -> bytes:
    rng = random.Random(31)
    words = [f"{word}{n}" for word in WORDS for n in range(100)]
    documents = [" ".join(rng.choices(words, k=args.doc_words)) for _ in range(args.docs)]
    lines = [
        {
            "custom_id": f"d{d}-q{q}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {
                "prompt": f"Document {d}: {document}\nQuestion {q}: which word comes up most?",
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            },
        }
        for d, document in enumerate(documents)
        for q in range(args.questions)
    ]
    rng.shuffle(lines)
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def run(mode: str, workers: int, args: argparse.Namespace, data: bytes) -> tuple[float, float]:
    """(seconds, cached share) of one batch."""
    fields = {"model": args.model, "kv_cache_bytes": args.kv_cache_mib << 20, "max_num_seqs": args.seats}
    shared = Shared("pagedq_bench_prefix", BENCH_REDIS_URL)  # a database of its own, made afresh
    with service_stack(shared, keep=args.keep, **fields, **MODES[mode]) as stack:
        _, url = stack.api()
        for i in range(workers):
            stack.worker(f"worker-{mode}-{workers}-{i}")
        with httpx.Client(base_url=url, timeout=600) as client:
            file = client.post("/v1/files", files={"file": ("q.jsonl", data)}, data={"purpose": "batch"})
            body = {
                "input_file_id": file.json()["id"],
                "endpoint": "/v1/completions",
                "completion_window": "24h",
            }
            batch_id = client.post("/v1/batches", json=body).json()["id"]
            while (status := client.get(f"/v1/batches/{batch_id}").json()["status"]) not in ENDED:
                time.sleep(1)
        if status != "completed":
            raise SystemExit(f"the batch ended {status}")
        with stack.db.engine.connect() as db:
            seconds, cached, prompt = db.execute(
                text(
                    "SELECT extract(epoch FROM max(finished_at) - min(started_at)), sum(cached_tokens),"
                    " sum(prompt_tokens) FROM jobs WHERE batch_id = :batch"
                ),
                {"batch": batch_id},
            ).one()
        return float(seconds), float(cached) / float(prompt)


ENDED = {"completed", "failed", "expired", "cancelled"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--docs", type=int, default=20)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--doc-words", type=int, default=340, help="about 1,000 tokens at 340")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seats", type=int, default=16, help="PAGEDQ_MAX_NUM_SEQS of each worker")
    parser.add_argument("--kv-cache-mib", type=int, default=192, help="PAGEDQ_KV_CACHE_BYTES of each worker")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--keep", action="store_true", help="keep the API's and workers' logs")
    args = parser.parse_args()
    data = batch_file(args)
    results: dict[tuple[int, str], tuple[float, float]] = {}
    for workers in (int(n) for n in args.workers.split(",")):
        for mode in MODES:
            results[workers, mode] = run(mode, workers, args, data)
    machine = f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)"
    lines = args.docs * args.questions
    print(f"{machine}; model {args.model}; {args.docs} documents x {args.questions} questions, shuffled;")
    print(f"max_tokens {args.max_tokens}, {args.seats} seats and a {args.kv_cache_mib} MiB KV cache a worker")
    for (workers, mode), (seconds, share) in results.items():
        print(
            f"{workers} worker(s), prefix-aware {mode:3}: {seconds:8.1f} s {lines / seconds:8.1f} lines/s"
            f"  cached share {share:.3f}"
        )
    for workers in sorted({w for w, _ in results}):
        ratio = results[workers, "off"][0] / results[workers, "on"][0]
        print(f"{workers} worker(s): throughput on / off {ratio:.2f}x")


if __name__ == "__main__":
    main()
