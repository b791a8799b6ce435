"""What the job service adds on top of the engine, through real processes, Postgres and Redis.

    python bench/service_overhead.py [--model DIR] [--seconds 10] [--concurrency 64] [--api-workers 2]
        [--batch-processes 2] [--latency-jobs 200] [--batch-lines 50000] [--batch-e2e [--batch-docs 1000]]
        [--stream-requests 60] [--rounds 2] [--stream-only] [--waited-only] [--healthz-during-batch]
        [--batch-accept-only] [--batch-e2e-only]

Needs wrk (Debian: apt-get install wrk), PostgreSQL and Redis as the tests use them.
1. Accepted jobs/s: ``pagedq api`` (``--api-workers`` uvicorn processes, default 2: one per core)
   takes concurrent single POSTs from wrk (``--concurrency`` connections, ``--seconds`` long) while
   no worker runs, so the number is the API's alone. Baseline in the same run: wrk against
   ``GET /healthz``, the HTTP floor of this stack.
2. Queue-to-engine latency: a ``pagedq worker`` on an idle engine; ``--latency-jobs`` jobs with
   ``max_tokens=1`` submitted one at a time (``Prefer: wait``); latency = started_at − queued_at
   (row committed → claimed by a worker), p50 and p99. Baseline: the same request through
   ``LLMEngine`` directly (add_request → first scheduled).
3. Batch accept: a ``--batch-lines`` chat batch file (50,000 lines) through ``POST /v1/files`` and
   ``POST /v1/batches`` while no worker runs: lines/s until the batch is ``in_progress`` (every line
   checked, tokenized, and committed as a job; ``--batch-processes`` processes check the lines, default
   2), then how fast its messages are published in the background. With ``--batch-accept-only`` (alone):
   that batch accepted ``--rounds`` times, each with the CPU per line of the API's processes (with their
   checking processes) and of PostgreSQL's.
4. With ``--batch-e2e``: a ``--batch-docs`` document batch (chat, greedy, ``--batch-max-tokens`` each)
   run by one worker, from upload to ``completed``, against ``LLM.chat`` on the same prompts with the
   worker's engine settings: output tokens/s of each. ``--batch-e2e-only`` runs it alone.
   With ``--healthz-during-batch`` (alone): GET /healthz latency from a second client, every 10 ms,
   while a ``--batch-lines`` batch is accepted and then cancelled (and how long the cancel takes to
   end every line), against the same API idle (target: p99 < 50 ms in both).
5. Streamed chat completions (``--stream-requests`` of ``--stream-tokens`` tokens, one at a time):
   time to first token and mean inter-token latency as the client sees them, against the same requests
   through ``LLMEngine`` directly; each job's row splits where its first token's time went (before the
   row, queue, prefill, relay to the client).
6. Waited chat completions (the same requests, not streamed: the API answers once the job has ended):
   the time to the answer and the mean inter-token latency of the job's own token times, against the
   same requests through ``LLMEngine`` directly. ``--waited-only`` runs parts 5 and 6 alone.
The engine baselines run in the bench process, with the worker's engine settings, while the service is
idle. This machine's speed drifts over minutes, so part 4 alternates service and engine over ``--rounds``
rounds, and part 5 request by request: its added latencies are medians of each pair's difference.
Targets (2-core machine, issue 34): >= 1,500 accepted jobs/s, p50 queue-to-engine latency < 50 ms,
>= 10,000 batch lines accepted/s, batch end to end >= 90% of LLM.chat, streaming adds <= 10 ms to TTFT
and <= 1 ms per token. Each round's batch has documents of its own, so neither side's prefix cache holds
a round's requests from the round before.
"""

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil
import psycopg
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.engine_throughput import wait_quiet  # noqa: E402
from bench.service_cpu import cpu_of  # noqa: E402
from bench.stack import Shared, service_stack  # noqa: E402
from contract.engine import DEFAULT_MODEL  # noqa: E402
from core.queue import queue_name  # noqa: E402
from core.settings import Settings  # noqa: E402
from core.states import BATCH_TERMINAL  # noqa: E402
from worker.engine import LLM, SamplingParams  # noqa: E402

ADMIN_URL = os.environ.get("PAGEDQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "pagedq_bench"
TARGET_ACCEPTED_PER_S, TARGET_P50_MS, TARGET_BATCH_LINES_PER_S = 1500.0, 50.0, 10_000.0
TARGET_BATCH_VS_GENERATE = 0.9
TARGET_ADDED_TTFT_MS, TARGET_ADDED_ITL_MS = 10.0, 1.0
TARGET_HEALTHZ_P99_MS = 50.0
BATCH_POLL_S = 0.25
DOCUMENT = "The committee met on Tuesday to review the budget, the hiring plan and the new office lease."


WRK_POST = """wrk.method = "POST"
wrk.body = '{"prompt": "Summarise: the quick brown fox jumps over the lazy dog.", "max_tokens": 1}'
wrk.headers["Content-Type"] = "application/json"
"""


def hammer(url: str, seconds: int, connections: int, post_jobs: bool, logs: Path) -> float:
    """Requests/s from wrk (a C load generator: a Python client would be the bottleneck); all must be 2xx."""
    script = logs / "post.lua"
    script.write_text(WRK_POST)
    path = "/v1/jobs" if post_jobs else "/healthz"
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", url + path]
    if post_jobs:
        command[1:1] = ["-s", str(script)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk saw failed requests:\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


def queue_latencies(url: str, n: int) -> list[float]:
    latencies = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(n + 5):
            body = {"prompt": f"Say {i}.", "max_tokens": 1}
            job = client.post("/v1/jobs", json=body, headers={"Prefer": "wait=30"}).json()
            assert job["status"] == "succeeded", job
            if i >= 5:  # the first few warm the worker's caches
                latencies.append(job["timings"]["queue_time_ms"])
    return latencies


def engine_latencies(llm: LLM, n: int) -> list[float]:
    engine = llm.engine
    latencies = []
    for i in range(n + 5):
        start = time.monotonic()
        engine.add_request(f"latency-{i}", f"Say {i}.", SamplingParams(max_tokens=1))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished and i >= 5:
                    latencies.append((out.metrics.first_scheduled_time - start) * 1000)
    return latencies


def story_messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Tell me a story about the number {i}."}]


def story_request(model: str, i: int, max_tokens: int) -> dict[str, object]:
    """The chat completion parts 5 and 6 time: greedy, ``max_tokens`` tokens whatever the text."""
    return {
        "model": model,
        "messages": story_messages(i),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


@dataclass(frozen=True)
class Streamed:
    """One streamed chat completion as its client saw it (ms), and where its first token's time went, by
    its job's row: ``before_row`` (sent → ``queued_at``: HTTP, checks, tokenizing), ``queue`` (→
    ``started_at``: the row's commit, its message, the claim), ``prefill`` (→ ``first_token_at``: the
    engine in the service), ``relay`` (→ the client: the worker's streamer, Redis, the API)."""

    ttft: float
    itl: float
    before_row: float
    queue: float
    prefill: float
    relay: float


@dataclass(frozen=True)
class StreamPair:
    service: Streamed
    engine_ttft: float
    engine_itl: float


def streamed_once(
    client: httpx.Client, db: psycopg.Connection, model: str, i: int, max_tokens: int
) -> Streamed:
    """One streamed chat completion, timed as a client sees it through the whole path (API → queue →
    worker → Redis channel → API → client); its job's row, read afterwards, splits its first token's time."""
    body = story_request(model, i, max_tokens) | {"stream": True, "stream_options": {"include_usage": True}}
    sent, start, arrivals = time.time(), time.perf_counter(), []
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():  # parsed after the stream: the client's own work would slow the server
            arrivals.append((time.perf_counter(), line))
    times, tokens, chunk = [], 0, {}
    for at, line in arrivals:
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line.removeprefix("data: "))
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            times.append(at)
    if not times or tokens < 2:
        raise SystemExit(f"streamed request {i} produced {tokens} tokens")
    ttft = (times[0] - start) * 1000
    job_id = "job_" + chunk["id"].removeprefix("chatcmpl-")
    epochs = ", ".join(
        f"extract(epoch FROM {at}) * 1000" for at in ("queued_at", "started_at", "first_token_at")
    )
    row = db.execute(f"SELECT {epochs} FROM jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, job_id
    queued, started, first = (float(at) for at in row)
    before_row, queue, prefill = queued - sent * 1000, started - queued, first - started
    itl = (times[-1] - times[0]) * 1000 / (tokens - 1)
    return Streamed(ttft, itl, before_row, queue, prefill, ttft - before_row - queue - prefill)


def engine_once(llm: LLM, i: int, max_tokens: int) -> tuple[float, float]:
    """The same request through ``LLMEngine`` directly, timed as the client times it: from
    add_request to the first step that hands out text, and the mean gap per token after it."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    start, first, last = time.perf_counter(), None, None
    llm.engine.add_request(f"{time.time()}-{i}", llm.chat_prompt(story_messages(i)), params)
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            if out.outputs[0].text:
                last = time.perf_counter()
                first = first or last
    assert first is not None and last is not None
    return (first - start) * 1000, (last - first) * 1000 / (max_tokens - 1)


def waited_once(client: httpx.Client, model: str, i: int, max_tokens: int) -> tuple[float, float]:
    """Time to the answer of one chat completion that is not streamed, and the mean inter-token latency
    of its job's token times (ms): what the engine ran at inside the service."""
    start = time.perf_counter()
    answer = (
        client.post("/v1/chat/completions", json=story_request(model, i, max_tokens))
        .raise_for_status()
        .json()
    )
    elapsed = (time.perf_counter() - start) * 1000
    job = client.get("/v1/jobs/job_" + answer["id"].removeprefix("chatcmpl-")).raise_for_status().json()
    times = job["timings"]["token_times_ms"]
    return elapsed, (times[-1] - times[0]) / (len(times) - 1)


def engine_total(llm: LLM, i: int, max_tokens: int) -> tuple[float, float]:
    """``engine_once``'s request, timed to its last token: (total ms, ITL ms)."""
    start = time.perf_counter()
    _, itl = engine_once(llm, i, max_tokens)
    return (time.perf_counter() - start) * 1000, itl


def waited_pairs(url: str, model: str, llm: LLM, n: int, max_tokens: int) -> list[tuple[float, ...]]:
    """``n`` pairs (path total, job ITL, engine total, engine ITL), as ``stream_pairs`` pairs them."""
    with httpx.Client(base_url=url, timeout=120) as client:
        pairs = [
            waited_once(client, model, i, max_tokens) + engine_total(llm, i, max_tokens) for i in range(n + 2)
        ]
    return pairs[2:]


def stream_pairs(url: str, model: str, llm: LLM, n: int, max_tokens: int) -> list[StreamPair]:
    """``n`` pairs, the same request each way, one right after the other: this machine's speed drifts
    by more than the targets within minutes, and a pair sees the same drift on both sides. Two pairs
    first, untimed, to warm both."""
    with httpx.Client(base_url=url, timeout=120) as client, database() as db:
        pairs = [
            StreamPair(streamed_once(client, db, model, i, max_tokens), *engine_once(llm, i, max_tokens))
            for i in range(n + 2)
        ]
    return pairs[2:]


def batch_file(lines: int, max_tokens: int, round_: int = 0) -> bytes:
    """Chat requests: one instruction, then a distinct short document each, distinct in each ``round_``
    too (a round's requests are new to the prefix cache, as the first round's were)."""
    instruction = {"role": "system", "content": "Summarise the document in one sentence."}
    return b"".join(
        json.dumps(
            {
                "custom_id": f"doc-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "messages": [
                        instruction,
                        {"role": "user", "content": f"Document {i} of round {round_}. {DOCUMENT}"},
                    ],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            }
        ).encode()
        + b"\n"
        for i in range(lines)
    )


def create_batch(client: httpx.Client, data: bytes) -> dict:
    file = client.post("/v1/files", files={"file": ("bench.jsonl", data)}, data={"purpose": "batch"})
    body = {
        "input_file_id": file.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    batch = client.post("/v1/batches", json=body).json()
    if batch.get("status") != "in_progress":
        raise SystemExit(f"the batch was not accepted: {batch}")
    return batch


class HealthProbe:
    """GET /healthz from a client of its own, every ``interval`` s while it runs: the API's latency to
    anyone else while it is busy (issue 16: p99 < 50 ms while a 50,000-line batch is accepted)."""

    def __init__(self, url: str, interval: float = 0.01) -> None:
        self.url, self.interval, self.latencies_ms = url, interval, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "HealthProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                start = time.perf_counter()
                client.get("/healthz").raise_for_status()
                self.latencies_ms.append((time.perf_counter() - start) * 1000)
                time.sleep(self.interval)


@dataclass
class LoopLag:
    """GET /healthz latencies (ms) idle, while a batch is accepted and while it is cancelled."""

    lines: int
    accept_s: float
    cancel_s: float
    idle: list[float]
    accepting: list[float]
    cancelling: list[float]


def healthz_during_batch(url: str, lines: int) -> LoopLag:
    """One batch accepted, then cancelled (its reply: every queued line ended cancelled) while a second
    client probes /healthz; the same probe idle first."""
    data = batch_file(lines, max_tokens=32)
    with HealthProbe(url) as idle:
        time.sleep(5)
    with httpx.Client(base_url=url, timeout=600) as client:
        with HealthProbe(url) as accepting:
            start = time.monotonic()
            batch = create_batch(client, data)
            accepted = time.monotonic() - start
        with HealthProbe(url) as cancelling:
            start = time.monotonic()
            # no worker runs: the reply already counts every queued line cancelled; a worker's round
            # would then finalize the batch as ``cancelled`` (its output files), not measured here
            reply = client.post(f"/v1/batches/{batch['id']}/cancel").json()
            cancelled = time.monotonic() - start
            if reply["request_counts"]["failed"] != lines:
                raise SystemExit(f"the cancel did not end every line: {reply['request_counts']}")
    probes = (idle.latencies_ms, accepting.latencies_ms, cancelling.latencies_ms)
    return LoopLag(lines, accepted, cancelled, *probes)


def batch_accept(url: str, lines: int, broker: redis.Redis, queue: str) -> tuple[float, float]:
    """Lines/s accepted (upload + create), and messages/s published in the background after it."""
    data = batch_file(lines, max_tokens=32)
    with httpx.Client(base_url=url, timeout=600) as client:
        start = time.monotonic()
        create_batch(client, data)
        accepted = time.monotonic() - start
    while sum(broker.llen(key) for key in broker.keys(queue + "*")) < lines:
        time.sleep(0.05)
    published = time.monotonic() - start
    return lines / accepted, lines / published


def service_cpu(api: psutil.Process) -> dict[str, float]:
    """CPU seconds so far of the API's processes (its workers and their batch-checking processes) and of
    PostgreSQL's (every process of the server: run alone on the machine)."""
    postgres = (p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("postgres"))
    return {
        "API and checking processes": cpu_of(api) + sum(cpu_of(p) for p in api.children(recursive=True)),
        "PostgreSQL": sum(map(cpu_of, postgres)),
    }


def batch_accept_cpu(
    url: str, lines: int, api: psutil.Process, settings: Settings
) -> tuple[float, dict[str, float]]:
    """Lines/s accepted (upload + create), and the CPU seconds per line each side spent on it."""
    data = batch_file(lines, max_tokens=32)
    with httpx.Client(base_url=url, timeout=600) as client:
        before, start = service_cpu(api), time.monotonic()
        create_batch(client, data)
        accepted, after = time.monotonic() - start, service_cpu(api)
    drop_queued(settings)
    wait_quiet(60)  # its messages are published in the background
    return lines / accepted, {side: (after[side] - before[side]) / lines for side in after}


def database() -> psycopg.Connection:
    """The bench database, in autocommit."""
    return psycopg.connect(ADMIN_URL.rsplit("/", 1)[0] + f"/{DATABASE}", autocommit=True)


def drop_queued(settings: Settings) -> None:
    """Nobody will run the jobs queued so far: remove their messages and cancel them, then vacuum, as
    autovacuum soon would where it is on (migrations/versions/0018_vacuum_jobs_autovacuum.py), so the
    later parts' claims do not walk the cancelled jobs' index entries."""
    broker = redis.Redis.from_url(settings.resolved_broker_url)
    if keys := broker.keys(queue_name(settings.served_model_name) + "*"):
        broker.delete(*keys)
    with database() as db:
        db.execute("UPDATE jobs SET status = 'cancelled' WHERE status = 'queued'")
        db.execute("VACUUM jobs")


def batch_end_to_end(url: str, docs: int, max_tokens: int, round_: int) -> float:
    """Output tokens/s of a whole batch: upload to ``completed``. It waits by reading the batch's status
    from the database, one cheap statement every ``BATCH_POLL_S``: a ``GET /v1/batches/{id}`` twice a
    second woke the API's processes ~60 times a second (its thread hand-offs and queries), each wakeup
    taking a core from the engine it measures, which ``LLM.chat`` on the other side does not pay."""
    with httpx.Client(base_url=url, timeout=600) as client, database() as db:
        start = time.monotonic()
        batch = create_batch(client, batch_file(docs, max_tokens, round_))
        query = "SELECT status FROM batches WHERE id = %s"
        while db.execute(query, (batch["id"],)).fetchone()[0] not in BATCH_TERMINAL:
            time.sleep(BATCH_POLL_S)
        elapsed = time.monotonic() - start
        batch = client.get(f"/v1/batches/{batch['id']}").json()
    if batch["status"] != "completed" or batch["request_counts"]["completed"] != docs:
        raise SystemExit(f"the batch did not complete: {batch}")
    return batch["usage"]["output_tokens"] / elapsed


def direct_llm(settings: Settings) -> LLM:
    """The engine as a library, with the worker's engine settings: the baseline of parts 2, 4 and 5."""
    return LLM(**asdict(settings.engine_config()))


def generate_directly(llm: LLM, docs: int, max_tokens: int, round_: int) -> float:
    """Output tokens/s of ``LLM.chat`` on the same requests."""
    requests = [json.loads(line)["body"] for line in batch_file(docs, max_tokens, round_).splitlines()]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.chat([requests[0]["messages"]], params)  # warm, as the worker is by then
    start = time.monotonic()
    outputs = llm.chat([request["messages"] for request in requests], params)
    elapsed = time.monotonic() - start
    return sum(len(out.outputs[0].token_ids) for out in outputs) / elapsed


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def median_interval(values: list[float], resamples: int = 2000) -> tuple[float, float, float]:
    """The median and its 95% bootstrap interval: on this machine one pair's added ITL spreads over
    ±10 ms, so 30 pairs pin the median down only to about ±1.5 ms, as wide as the target itself."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return statistics.median(values), medians[int(0.025 * resamples)], medians[int(0.975 * resamples)]


def verdict(interval: tuple[float, float, float], target: float) -> str:
    """PASS only when the whole interval is within the target, MISS when none of it is."""
    _, low, high = interval
    if high <= target:
        return "PASS"
    return "MISS" if low > target else "UNDECIDED (the 95% interval straddles the target)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--seconds", type=int, default=10, help="length of each wrk run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--api-workers", type=int, default=2, help="API processes (PAGEDQ_API_WORKERS)")
    parser.add_argument(
        "--batch-processes", type=int, default=2, help="batch-checking processes (PAGEDQ_BATCH_PROCESSES)"
    )
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--batch-lines", type=int, default=50_000, help="lines of the batch-accept file")
    parser.add_argument("--batch-e2e", action="store_true", help="also run a batch end to end vs LLM.chat")
    parser.add_argument("--batch-e2e-only", action="store_true", help="run part 4 alone")
    parser.add_argument("--batch-docs", type=int, default=1000)
    parser.add_argument("--batch-max-tokens", type=int, default=32)
    parser.add_argument(
        "--stream-requests",
        type=int,
        default=60,
        help="streamed chat completions timed, each paired with the engine",
    )
    parser.add_argument("--stream-tokens", type=int, default=64)
    parser.add_argument(
        "--stream-only", action="store_true", help="run part 5 alone (nothing before it leaves work behind)"
    )
    parser.add_argument(
        "--waited-only", action="store_true", help="run parts 5 and 6 alone (streamed, then waited)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="alternations of batch and LLM.chat runs (--batch-e2e)"
    )
    parser.add_argument(
        "--healthz-during-batch",
        action="store_true",
        help="only: GET /healthz latency from a second client while a --batch-lines batch is accepted, "
        "then cancelled",
    )
    parser.add_argument(
        "--batch-accept-only",
        action="store_true",
        help="only: a --batch-lines batch accepted --rounds times, with the CPU each side spent per line",
    )
    args = parser.parse_args()

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    busy = wait_quiet(60)
    print(f"cores busy before the run (other processes; ~0 is clean): {busy:.2f}")
    if busy >= 0.3:
        print("  WARNING: the machine is not quiet (a leftover pagedq process?); numbers will be noisy")

    processes = {"api_workers": args.api_workers, "batch_processes": args.batch_processes}
    shared = Shared(DATABASE, "redis://127.0.0.1:6379/14")
    with service_stack(shared, keep=True, model=args.model, log_level="WARNING", **processes) as stack:
        settings = stack.settings
        api_process, url = stack.api()
        wait_quiet(60)  # the API's batch-checking processes load their tokenizers after it is ready
        if args.batch_accept_only:
            api = psutil.Process(api_process.popen.pid)
            report_batch_accept(
                args, [batch_accept_cpu(url, args.batch_lines, api, settings) for _ in range(args.rounds)]
            )
            return
        if args.healthz_during_batch:
            report_healthz(args, healthz_during_batch(url, args.batch_lines))
            return
        only_latency = args.stream_only or args.waited_only
        only_batch = args.batch_e2e_only
        if not (only_latency or only_batch):
            health = hammer(url, args.seconds, args.concurrency, post_jobs=False, logs=stack.work)
            accepted = hammer(url, args.seconds, args.concurrency, post_jobs=True, logs=stack.work)
            drop_queued(settings)
            broker = redis.Redis.from_url(settings.resolved_broker_url)
            queue = queue_name(settings.served_model_name)
            batch_rate, publish_rate = batch_accept(url, args.batch_lines, broker, queue)
            drop_queued(settings)

        stack.worker()
        llm = direct_llm(settings)  # idle while the service runs, and the service idle while it runs
        if not (only_latency or only_batch):
            latencies = queue_latencies(url, args.latency_jobs)
            direct = engine_latencies(llm, args.latency_jobs)
        model = settings.served_model_name
        # Earlier parts may leave work behind (the worker finalizes the 50,000-job batch).
        stream_busy = wait_quiet(180)
        pairs, waited = [], []
        if not only_batch:
            pairs = stream_pairs(url, model, llm, args.stream_requests, args.stream_tokens)
        if not (only_batch or args.stream_only):
            waited = waited_pairs(url, model, llm, args.stream_requests, args.stream_tokens)
        # Service and engine alternate round by round: this machine's speed drifts by minutes.
        batch_tps, generate_tps = [], []
        for round_ in range(args.rounds if (args.batch_e2e or only_batch) and not only_latency else 0):
            batch_tps.append(batch_end_to_end(url, args.batch_docs, args.batch_max_tokens, round_))
            generate_tps.append(generate_directly(llm, args.batch_docs, args.batch_max_tokens, round_))

    if only_batch:
        report_batch_e2e(args, batch_tps, generate_tps)
        return
    if not only_latency:
        report_requests(args, health, accepted, latencies, direct, batch_rate, publish_rate)
        if args.batch_e2e:
            report_batch_e2e(args, batch_tps, generate_tps)
    report_stream(args, pairs, stream_busy)
    if waited:
        report_waited(args, waited)


def report_requests(
    args: argparse.Namespace,
    health: float,
    accepted: float,
    latencies: list[float],
    direct: list[float],
    batch_rate: float,
    publish_rate: float,
) -> None:
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    print(
        f"accepted jobs/s, {args.api_workers} API process(es): {accepted:.0f} "
        f"(GET /healthz: {health:.0f}/s; jobs / healthz = {accepted / health:.2f}x)"
    )
    print(
        f"  target >= {TARGET_ACCEPTED_PER_S:.0f}/s: {accepted / TARGET_ACCEPTED_PER_S:.2f}x of target, "
        f"{'PASS' if accepted >= TARGET_ACCEPTED_PER_S else 'MISS'}"
    )
    print(
        f"queue-to-engine latency over {len(latencies)} jobs: p50 {p50:.1f} ms, p99 {p99:.1f} ms "
        f"(engine alone: p50 {percentile(direct, 50):.2f} ms)"
    )
    print(
        f"  target p50 < {TARGET_P50_MS:.0f} ms: p50 / target = {p50 / TARGET_P50_MS:.2f}, "
        f"{'PASS' if p50 < TARGET_P50_MS else 'MISS'}"
    )
    print(
        f"batch accept, {args.batch_lines} lines (POST /v1/files + /v1/batches): {batch_rate:.0f} lines/s; "
        f"published in the background at {publish_rate:.0f} messages/s"
    )
    print(
        f"  target >= {TARGET_BATCH_LINES_PER_S:.0f} lines/s: "
        f"{batch_rate / TARGET_BATCH_LINES_PER_S:.2f}x of target, "
        f"{'PASS' if batch_rate >= TARGET_BATCH_LINES_PER_S else 'MISS'}"
    )


def report_batch_accept(args: argparse.Namespace, rounds: list[tuple[float, dict[str, float]]]) -> None:
    for rate, cpu in rounds:
        per_line = ", ".join(f"{side} {seconds * 1e6:.0f}" for side, seconds in cpu.items())
        print(f"batch accept, {args.batch_lines} lines: {rate:.0f} lines/s; CPU µs a line: {per_line}")
    best, worst = (f(rate for rate, _ in rounds) / TARGET_BATCH_LINES_PER_S for f in (max, min))
    print(
        f"  target >= {TARGET_BATCH_LINES_PER_S:.0f} lines/s: best {best:.2f}x, worst {worst:.2f}x of target"
    )


def report_healthz(args: argparse.Namespace, lag: LoopLag) -> None:
    def line(latencies: list[float]) -> str:
        return (
            f"{len(latencies)} probes, p50 {percentile(latencies, 50):.1f} ms, "
            f"p99 {percentile(latencies, 99):.1f} ms, max {max(latencies):.1f} ms"
        )

    print(
        f"GET /healthz ({args.api_workers} API process(es), {args.batch_processes} batch process(es)): "
        f"idle: {line(lag.idle)}"
    )
    rate = lag.lines / lag.accept_s
    print(f"  while {lag.lines} lines were accepted ({rate:.0f} lines/s): {line(lag.accepting)}")
    print(f"  while they were cancelled ({lag.cancel_s:.1f} s to the cancel's reply): {line(lag.cancelling)}")
    p99 = max(percentile(lag.accepting, 99), percentile(lag.cancelling, 99))
    verdict = "PASS" if p99 < TARGET_HEALTHZ_P99_MS else "MISS"
    print(f"  target p99 < {TARGET_HEALTHZ_P99_MS:.0f} ms in both: {verdict}")


def report_batch_e2e(args: argparse.Namespace, batch_tps: list[float], generate_tps: list[float]) -> None:
    rounds = ", ".join(
        f"{b:.1f} vs {g:.1f} ({b / g:.2f}x)" for b, g in zip(batch_tps, generate_tps, strict=True)
    )
    ratio = statistics.mean(batch_tps) / statistics.mean(generate_tps)
    print(
        f"batch end to end, {args.batch_docs} documents x {args.batch_max_tokens} tokens, output tok/s "
        f"batch vs LLM.chat on the same requests, by round: {rounds}; means: batch / LLM.chat = "
        f"{ratio:.2f}x"
    )
    ok = ratio >= TARGET_BATCH_VS_GENERATE
    print(f"  target >= {TARGET_BATCH_VS_GENERATE:.0%} of LLM.chat: {'PASS' if ok else 'MISS'}")


def report_stream(args: argparse.Namespace, pairs: list[StreamPair], stream_busy: float) -> None:
    def median(of: Callable[[StreamPair], float]) -> float:
        return statistics.median(of(pair) for pair in pairs)

    path_ttft, path_itl = median(lambda p: p.service.ttft), median(lambda p: p.service.itl)
    engine_ttft, engine_itl = median(lambda p: p.engine_ttft), median(lambda p: p.engine_itl)
    added_ttft = median_interval([p.service.ttft - p.engine_ttft for p in pairs])
    added_itl = median_interval([p.service.itl - p.engine_itl for p in pairs])
    print(f"cores busy before the streamed part (other processes; ~0 is clean): {stream_busy:.2f}")
    print(
        f"streamed chat completion, {args.stream_requests} pairs x {args.stream_tokens} tokens, medians: "
        f"TTFT {path_ttft:.1f} ms vs engine {engine_ttft:.1f} ms; ITL {path_itl:.2f} ms vs engine "
        f"{engine_itl:.2f} ms; added (median of the pairs' differences, 95% interval): "
        f"TTFT {added_ttft[0]:+.1f} ms ({added_ttft[1]:+.1f}..{added_ttft[2]:+.1f}), "
        f"ITL {added_itl[0]:+.2f} ms ({added_itl[1]:+.2f}..{added_itl[2]:+.2f})"
    )
    print(
        f"  targets: added TTFT <= {TARGET_ADDED_TTFT_MS:.0f} ms: "
        f"{verdict(added_ttft, TARGET_ADDED_TTFT_MS)}; added ITL <= {TARGET_ADDED_ITL_MS:.0f} ms: "
        f"{verdict(added_itl, TARGET_ADDED_ITL_MS)}"
    )
    print(
        "  the first token's time by its job's row (medians): before the row (HTTP, checks, tokenizing) "
        f"{median(lambda p: p.service.before_row):.1f} ms, queue (commit, message, claim) "
        f"{median(lambda p: p.service.queue):.1f} ms, prefill in the service "
        f"{median(lambda p: p.service.prefill):.1f} ms (the engine alone: {engine_ttft:.1f}, its tokenizing "
        f"included), to the client (streamer, Redis, API) {median(lambda p: p.service.relay):.1f} ms"
    )


def report_waited(args: argparse.Namespace, pairs: list[tuple[float, ...]]) -> None:
    path_total, job_itl, engine_total_ms, engine_itl = (
        statistics.median(c) for c in zip(*pairs, strict=True)
    )
    added_total = median_interval([p[0] - p[2] for p in pairs])
    added_itl = median_interval([p[1] - p[3] for p in pairs])
    print(
        f"waited chat completion (not streamed), {args.stream_requests} pairs x {args.stream_tokens} "
        f"tokens, medians: answer {path_total:.1f} ms vs engine {engine_total_ms:.1f} ms; the job's ITL "
        f"{job_itl:.2f} ms vs engine {engine_itl:.2f} ms; added (median of the pairs' differences, 95% "
        f"interval): answer {added_total[0]:+.1f} ms ({added_total[1]:+.1f}..{added_total[2]:+.1f}), "
        f"ITL {added_itl[0]:+.2f} ms ({added_itl[1]:+.2f}..{added_itl[2]:+.2f})"
    )


if __name__ == "__main__":
    main()
