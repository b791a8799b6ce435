"""Where the service spends CPU outside the engine's step, per output token and per job (issue 34).

    python bench/service_cpu.py [--sizes 16,64,256] [--tokens 64] [--kinds batch,jobs,stream]
        [--model DIR] [--api-workers 1]

For each size N, a ``pagedq worker`` with N seats (``PAGEDQ_MAX_NUM_SEQS``) runs N jobs of ``--tokens``
tokens at once (greedy, ``ignore_eos``), submitted together, of each kind:
``batch``: the N lines of one Batch API batch; ``jobs``: N single jobs that clients poll;
``stream``: N single jobs, each followed by a client on ``GET /v1/jobs/{id}/events``.
From just before the submission until a heartbeat after the last job ended, it takes the CPU time
(user + system) of every thread of the worker, grouped by the OS name the worker gives them
(worker/os_threads.py), of the API's processes, of redis-server and of PostgreSQL (the bench
database's backends apart from the server's own processes), and prints each per output token (µs) and
per job (ms). The engine thread's own CPU outside ``step()`` comes from the worker's heartbeat
(``loop_cpu_ms``); the engine step's CPU is the engine threads' (its OpenMP team's included) minus it.
"outside the engine" sums every row but the step. Targets (issue 34): <= 500 µs per output token for
batch lines; streaming adds <= 1 ms per token.

Run it on a quiet machine: the redis-server and PostgreSQL rows count everything those servers do
meanwhile, for anyone. A checkout without named threads (before issue 34) shows its worker's threads as
one ``(unnamed)`` row and no loop/step split.
"""

import argparse
import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stack import BENCH_REDIS_URL, Shared, service_stack  # noqa: E402
from contract.engine import DEFAULT_MODEL  # noqa: E402

ADMIN_URL = os.environ.get("PAGEDQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "pagedq_bench_cpu"
TARGET_BATCH_US_PER_TOKEN, TARGET_STREAM_ADDED_US = 500.0, 1000.0
HEARTBEAT_TIMEOUT = 6.0  # a heartbeat a second: the loop's CPU is read from it
WORKER_THREADS = (
    "pagedq-engine",
    "pagedq-flusher",
    "pagedq-streamer",
    "pagedq-heartbeat",
    "pagedq-reconcile",
)
SEATS = "pagedq-seat"
STEP, LOOP = "worker: engine step (engine threads - loop)", "worker: engine loop outside step"
Cpu = dict[str, float]  # row -> CPU seconds


def database() -> psycopg.Connection:
    return psycopg.connect(ADMIN_URL.rsplit("/", 1)[0] + f"/{DATABASE}", autocommit=True)


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)  # its own query counts among the bench backends: rarely


def loop_cpu_s(db: psycopg.Connection) -> float:
    row = db.execute("SELECT stats FROM workers").fetchone()
    return (row[0].get("loop_cpu_ms", 0.0) / 1000) if row else 0.0


def heartbeat_at(db: psycopg.Connection) -> object:
    return db.execute("SELECT max(heartbeat_at) FROM workers").fetchone()[0]


def thread_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def cpu_of(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
        return times.user + times.system
    except psutil.Error:
        return 0.0


def snapshot(worker: psutil.Process, api: psutil.Process, db: psycopg.Connection) -> Cpu:
    """CPU seconds so far of each row. Threads and processes that end between two snapshots lose their
    time (the worker's threads live as long as it; PostgreSQL's backends are pooled)."""
    cpu: Cpu = defaultdict(float)
    for thread in worker.threads():
        name = thread_name(worker.pid, thread.id)
        row = name if name in WORKER_THREADS or name == SEATS else "(unnamed)"
        cpu[f"worker: {row}"] += thread.user_time + thread.system_time
    cpu[LOOP] = loop_cpu_s(db)
    cpu["api processes"] = cpu_of(api) + sum(cpu_of(p) for p in api.children(recursive=True))
    ours = {
        pid
        for (pid,) in db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (DATABASE,)
        )
    }
    for process in psutil.process_iter(["name", "cmdline"]):
        name = process.info["name"] or ""
        if name.startswith("redis-server"):
            cpu["redis-server"] += cpu_of(process)
        elif name.startswith("postgres"):
            backend = process.pid in ours
            if backend or "(" not in " ".join(process.info["cmdline"] or []):  # not another database's
                cpu["postgres: bench backends" if backend else "postgres: server processes"] += cpu_of(
                    process
                )
    return cpu


def submit(client: httpx.Client, kind: str, n: int, tokens: int, run: int) -> list[str]:
    messages = lambda i: [{"role": "user", "content": f"Tell me a story about {run}-{i}."}]  # noqa: E731
    body = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if kind == "batch":
        lines = [
            {
                "custom_id": f"doc-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body | {"messages": messages(i)},
            }
            for i in range(n)
        ]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        file = client.post("/v1/files", files={"file": ("cpu.jsonl", data)}, data={"purpose": "batch"}).json()
        batch = client.post(
            "/v1/batches",
            json={
                "input_file_id": file["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        ).json()
        return [batch["id"]]
    ids = []
    for i in range(n):
        reply = client.post("/v1/jobs", json=body | {"messages": messages(i)})
        reply.raise_for_status()
        ids.append(reply.json()["id"])
    return ids


def follow(url: str, job_id: str, chars: list[int]) -> None:
    with (
        httpx.Client(base_url=url, timeout=600) as client,
        client.stream("GET", f"/v1/jobs/{job_id}/events") as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: "):
                chars.append(len(line))


def measure(
    url: str, kind: str, n: int, tokens: int, run: int, worker: psutil.Process, api: psutil.Process
) -> tuple[Cpu, int]:
    with database() as db, httpx.Client(base_url=url, timeout=600) as client:
        since = db.execute("SELECT now()").fetchone()[0]
        before = snapshot(worker, api, db)
        ids = submit(client, kind, n, tokens, run)
        readers = []
        if kind == "stream":
            chars: list[int] = []
            readers = [threading.Thread(target=follow, args=(url, i, chars), daemon=True) for i in ids]
            for reader in readers:
                reader.start()
        ended = "SELECT count(*) FROM jobs WHERE queued_at >= %s AND finished_at IS NOT NULL"
        wait_until(lambda: db.execute(ended, (since,)).fetchone()[0] >= n, 1800, f"{n} {kind} jobs")
        for reader in readers:
            reader.join(60)
        beat = heartbeat_at(db)
        wait_until(lambda: heartbeat_at(db) != beat, 30, "a heartbeat")  # the loop's CPU up to now
        after = snapshot(worker, api, db)
        failed, output = db.execute(
            "SELECT count(*) FILTER (WHERE status <> 'succeeded'), sum(completion_tokens) FROM jobs "
            "WHERE queued_at >= %s",
            (since,),
        ).fetchone()
    if failed:
        raise SystemExit(f"{failed} of the {kind} jobs did not succeed")
    return {row: after[row] - before.get(row, 0.0) for row in after}, output


def split_engine(cpu: Cpu) -> Cpu:
    engine = cpu.pop("worker: pagedq-engine", 0.0)
    cpu[STEP] = engine - cpu.get(LOOP, 0.0)
    return cpu


def report(kind: str, n: int, cpu: Cpu, tokens: int) -> float:
    outside = sum(v for row, v in cpu.items() if row != STEP)
    print(f"\n{kind}, {n} running jobs, {tokens} output tokens: CPU per output token (µs) and per job (ms)")
    for row in sorted(cpu, key=lambda r: (r == STEP, -cpu[r])):
        print(f"  {row:46s} {cpu[row] * 1e6 / tokens:9.1f} µs/token {cpu[row] * 1e3 / n:9.2f} ms/job")
    per_token = outside * 1e6 / tokens
    print(
        f"  {'outside the engine (all but the step)':46s} {per_token:9.1f} µs/token "
        f"{outside * 1e3 / n:9.2f} ms/job"
    )
    return per_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--sizes", default="16,64,256")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--kinds", default="batch,jobs,stream")
    parser.add_argument("--api-workers", type=int, default=1)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    summary: dict[tuple[str, int], float] = {}
    shared = Shared(DATABASE, BENCH_REDIS_URL)
    fields = {"api_workers": args.api_workers, "heartbeat_timeout": HEARTBEAT_TIMEOUT, "log_level": "WARNING"}
    with service_stack(shared, keep=True, model=args.model, **fields) as stack:
        api, url = stack.api()
        for n in (int(size) for size in args.sizes.split(",")):
            worker = stack.worker(f"worker-{n}", max_num_seqs=n)
            processes = psutil.Process(worker.popen.pid), psutil.Process(api.popen.pid)
            measure(url, "jobs", 2, 4, -n, *processes)  # warm
            for run, kind in enumerate(args.kinds.split(",")):
                cpu, output = measure(url, kind, n, args.tokens, run, *processes)
                summary[kind, n] = report(kind, n, split_engine(cpu), output)
            worker.stop()
    _verdicts(summary)


def _verdicts(summary: dict[tuple[str, int], float]) -> None:
    print("\noutside the engine, µs per output token:")
    for (kind, n), per_token in sorted(summary.items()):
        line = f"  {kind:6s} {n:4d} jobs: {per_token:8.1f}"
        if kind == "batch":
            verdict = "PASS" if per_token <= TARGET_BATCH_US_PER_TOKEN else "MISS"
            line += f" (target <= {TARGET_BATCH_US_PER_TOKEN:.0f}: {verdict})"
        if kind == "stream" and ("jobs", n) in summary:
            added = per_token - summary["jobs", n]
            verdict = "PASS" if added <= TARGET_STREAM_ADDED_US else "MISS"
            line += f" (streaming adds {added:+.1f} over polled jobs; "
            line += f"target <= {TARGET_STREAM_ADDED_US:.0f}: {verdict})"
        print(line)


if __name__ == "__main__":
    main()
