"""Step 7: the whole service on the GPU, as ``pagedq up`` runs it (SQLite and the file broker: the GPU
machines have no PostgreSQL or Redis), serving a random model of SmolLM2-135M's shape.

Through the API (httpx): ``JOBS`` single jobs submitted at once, then a ``LINES``-line chat batch; every
job and line must succeed with all its tokens. Reported: jobs/s and tokens/s of each, from the first
submission to the last result seen. Then ``/metrics`` must agree with what was run: the jobs by state, one
live worker, an empty queue, a latency histogram sample per job, KV-cache use within [0, 1]; and
``pagedq up`` must stop cleanly on SIGTERM.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.gpu_check import models
from bench.gpu_check.outcome import FAIL, PASS, RAN, Context, Outcome
from pagedq.up import READY

REPO = Path(__file__).resolve().parents[3]
FULL = {"jobs": 500, "job_tokens": 64, "lines": 2000, "line_tokens": 32}
DRY = {"jobs": 12, "job_tokens": 4, "lines": 24, "line_tokens": 4}
ENDED = ("succeeded", "failed", "cancelled")


def run(ctx: Context) -> Outcome:
    size = DRY if ctx.dry_run else FULL
    model = models.served_llama(ctx.workdir / "model", ctx.dry_run)
    log = ctx.workdir / "up.log"
    start = time.monotonic()
    up, url = start_up(model, ctx, log)
    notes = [f"`pagedq up` ready in {time.monotonic() - start:.0f} s, serving on {ctx.device}."]
    figures, checks = [], []
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            jobs_s, tok_s = run_jobs(client, size, ctx, checks)
            figures.append(f"jobs {jobs_s:.1f}/s, {tok_s:.0f} tok/s")
            ctx.report(Outcome(FAIL, figures[0], _details(notes, checks)))
            lines_s, tok_s = run_batch(client, size, ctx, checks)
            figures.append(f"batch {lines_s:.1f} lines/s, {tok_s:.0f} tok/s")
            check_metrics(client.get("/metrics").text, size["jobs"] + size["lines"], checks)
    finally:
        code = stop(up)
        checks.append((code == 0, f"`pagedq up` stopped on SIGTERM with exit code {code}"))
        print(log.read_text(errors="replace")[-20000:], flush=True)
    result = (RAN if ctx.dry_run else PASS) if all(ok for ok, _ in checks) else FAIL
    return Outcome(result, "; ".join(figures), _details(notes, checks))


def start_up(model: Path, ctx: Context, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``pagedq up`` in a data folder of its own, once it has said it is ready."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = up_env(model, ctx, port)
    with log.open("wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "pagedq", "up"], cwd=REPO, env=env, stdout=out, stderr=out
        )
    while not any(line.startswith(f"{READY}:") for line in log.read_text(errors="replace").splitlines()):
        if up.poll() is not None or ctx.seconds_left() < 60:
            stop(up)
            raise RuntimeError(
                f"`pagedq up` did not become ready:\n{log.read_text(errors='replace')[-4000:]}"
            )
        time.sleep(0.2)
    return up, f"http://127.0.0.1:{port}"


def up_env(model: Path, ctx: Context, port: int) -> dict[str, str]:
    """``pagedq up``'s environment: the chat model alone (step 8 checks embeddings, whose model the GPU
    machines lack and cannot download), its own data and cache folders."""
    env = dict(os.environ, PAGEDQ_DATA_DIR=str(ctx.workdir / "data"))
    env["PAGEDQ_CACHE_DIR"] = str(ctx.workdir / "cache")
    env |= {"PAGEDQ_MODEL": str(model), "PAGEDQ_PORT": str(port), "PAGEDQ_HOST": "127.0.0.1"}
    env |= {"PAGEDQ_DEVICE": ctx.device, "PAGEDQ_LOG_LEVEL": "WARNING", "PAGEDQ_EMBED_MODEL": ""}
    env.pop("PAGEDQ_MODELS", None)
    if ctx.dry_run:
        env |= {"PAGEDQ_KV_CACHE_BYTES": str(64 << 20), "PAGEDQ_MAX_NUM_SEQS": "32"}
    return env


def stop(up: subprocess.Popen[bytes]) -> int | None:
    up.send_signal(signal.SIGTERM)
    try:
        return up.wait(60)
    except subprocess.TimeoutExpired:
        up.kill()
        return None


def run_jobs(client: httpx.Client, size: dict, ctx: Context, checks: list) -> tuple[float, float]:
    """Jobs/s and tokens/s of ``size["jobs"]`` jobs submitted together from 16 threads."""
    texts = models.text_prompts(size["jobs"], seed=7, longest=400)
    body = {"max_tokens": size["job_tokens"], "ignore_eos": True, "temperature": 0}
    start = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda text: client.post("/v1/jobs", json=body | {"prompt": text}), texts))
    accepted = [a for a in answers if a.status_code == 202]
    checks.append((len(accepted) == len(texts), f"{len(accepted)}/{len(texts)} jobs accepted"))
    wait_until(lambda: sum(client.get("/v1/overview").json()["jobs"][s] for s in ENDED) >= len(accepted), ctx)
    elapsed = time.monotonic() - start
    jobs = client.get("/v1/jobs", params={"limit": 1000}).json()["data"]
    done = [
        j
        for j in jobs
        if j["status"] == "succeeded" and j["usage"]["completion_tokens"] == size["job_tokens"]
    ]
    checks.append((len(done) == len(texts), f"{len(done)}/{len(texts)} jobs succeeded with all their tokens"))
    tokens = sum(j["usage"]["completion_tokens"] for j in jobs)
    return len(done) / elapsed, tokens / elapsed


def run_batch(client: httpx.Client, size: dict, ctx: Context, checks: list) -> tuple[float, float]:
    """Lines/s and tokens/s of one chat batch, from the upload to ``completed``."""
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "messages": [{"role": "user", "content": text}],
                "max_tokens": size["line_tokens"],
                "temperature": 0,
                "ignore_eos": True,
            },
        }
        for i, text in enumerate(models.text_prompts(size["lines"], seed=8, longest=400))
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    start = time.monotonic()
    file = client.post(
        "/v1/files", files={"file": ("gpu-check.jsonl", data)}, data={"purpose": "batch"}
    ).json()
    body = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    batch = client.post("/v1/batches", json=body).json()
    wait_until(
        lambda: client.get(f"/v1/batches/{batch['id']}").json()["status"] in ("completed", "failed"), ctx
    )
    elapsed = time.monotonic() - start
    batch = client.get(f"/v1/batches/{batch['id']}").json()
    completed, tokens = batch["request_counts"]["completed"], batch["usage"]["output_tokens"]
    checks.append(
        (
            batch["status"] == "completed" and completed == len(lines),
            f"batch {batch['status']}: {completed}/{len(lines)} lines",
        )
    )
    checks.append((tokens == len(lines) * size["line_tokens"], f"batch output tokens {tokens}"))
    return completed / elapsed, tokens / elapsed


def check_metrics(text: str, jobs: int, checks: list) -> None:
    """What /metrics says against what was run: every job ended once, nothing is left, one worker."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]

    def value(name: str, labels: dict[str, str]) -> float | None:
        found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
        return sum(found) if found else None

    wanted = [
        ("pagedq_jobs", {"status": "succeeded"}, jobs),
        ("pagedq_jobs", {"status": "failed"}, 0),
        ("pagedq_workers", {}, 1),
        ("pagedq_queue_depth", {}, 0),
        ("pagedq_e2e_latency_seconds_count", {}, jobs),
        ("pagedq_time_to_first_token_seconds_count", {}, jobs),
    ]
    for name, labels, want in wanted:
        got = value(name, labels)
        shown = "absent" if got is None else f"{got:g}"
        label = ",".join(f'{k}="{v}"' for k, v in labels.items())
        checks.append((got == want, f"/metrics: {name}{{{label}}} {shown} (want {want})"))
    usage = [s.value for s in samples if s.name == "pagedq_engine_kv_cache_usage_ratio"]
    checks.append((bool(usage) and all(0 <= u <= 1 for u in usage), f"/metrics: KV-cache use {usage}"))


def wait_until(condition: Callable[[], bool], ctx: Context) -> None:
    while not condition():
        if ctx.seconds_left() < 30:
            raise TimeoutError("out of time waiting for the service")
        time.sleep(0.25)


def _details(notes: list[str], checks: list) -> str:
    return "\n".join([*notes, "", *(f"- {'ok' if ok else 'FAILED'}: {what}" for ok, what in checks)])
