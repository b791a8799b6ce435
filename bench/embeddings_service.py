"""Embeddings through the service's Batch API against the engine offline, in one run: the same texts
(bench/embeddings.py's, 10-250 tokens) embedded by ``LLM(kind="embed")`` in this process, then as one
batch file (``"url": "/v1/embeddings"``, ``--per-line`` inputs a line) through a real ``pagedq api`` and
``pagedq worker --model all-minilm-l6-v2`` on PostgreSQL and Redis, timed from the batch's creation to its
end. Prints both rates and their ratio (issue 28's target: >= 0.8). The offline side runs while the
worker is idle, the service side while this process is.

    python -m bench.embeddings_service [--num 2000] [--per-line 16]
"""

import argparse
import json
import time

import httpx
import torch

from bench.embeddings import make_texts
from bench.stack import BENCH_REDIS_URL, Shared, service_stack
from contract.engine import DEFAULT_EMBED_MODEL, DEFAULT_MODEL
from worker.engine import LLM

TARGET = 0.8


def offline_rate(llm: LLM, texts: list[str]) -> float:
    start_s = time.perf_counter()
    llm.embed(texts)
    return len(texts) / (time.perf_counter() - start_s)


def batch_rate(url: str, texts: list[str], per_line: int) -> float:
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": DEFAULT_EMBED_MODEL, "input": texts[i : i + per_line]},
        }
        for i in range(0, len(texts), per_line)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with httpx.Client(base_url=url, timeout=120) as client:
        file = client.post(
            "/v1/files", files={"file": ("e.jsonl", content)}, data={"purpose": "batch"}
        ).json()
        body = {"input_file_id": file["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
        start_s = time.perf_counter()
        batch = client.post("/v1/batches", json=body).json()
        while batch["status"] not in ("completed", "failed", "cancelled", "expired"):
            time.sleep(0.2)
            batch = client.get(f"/v1/batches/{batch['id']}").json()
        took = time.perf_counter() - start_s
    counts = batch["request_counts"]
    if batch["status"] != "completed" or counts["failed"]:
        raise SystemExit(f"the batch ended {batch['status']}: {counts}, {batch.get('errors')}")
    return len(texts) / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num", type=int, default=2000)
    parser.add_argument("--per-line", type=int, default=16)
    args = parser.parse_args()
    llm = LLM(kind="embed", device="cpu", dtype="float32")
    tokenizer = llm.tokenizer
    texts = make_texts(args.num, lambda text: len(tokenizer(text)["input_ids"]))
    offline_rate(llm, texts[:32])  # warm up
    offline = offline_rate(llm, texts)
    del llm
    shared = Shared("pagedq_bench_embed", BENCH_REDIS_URL)  # a database of its own, made afresh
    fields = {"model": DEFAULT_MODEL, "api_workers": 1, "batch_processes": 0, "max_num_seqs": 32}
    with service_stack(shared, keep=True, **fields) as stack:
        _, url = stack.api()
        stack.worker(model=DEFAULT_EMBED_MODEL)
        wait_worker(url)
        service = batch_rate(url, texts, args.per_line)
        logs = stack.work
    print(f"threads {torch.get_num_threads()}, {args.num} texts, {args.per_line} a line; logs in {logs}")
    print(f"offline engine   {offline:8.1f} texts/s")
    print(f"service batch    {service:8.1f} texts/s")
    print(f"ratio            {service / offline:8.2f}x (target >= {TARGET})")


def wait_worker(url: str, timeout: float = 300) -> None:
    """Until /v1/models says the embedding model has a live worker."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        models = httpx.get(url + "/v1/models").json()["data"]
        if any(m["id"] == DEFAULT_EMBED_MODEL and m.get("live_workers") for m in models):
            return
        time.sleep(0.5)
    raise SystemExit(f"no worker of {DEFAULT_EMBED_MODEL} came up in {timeout}s")


if __name__ == "__main__":
    main()
