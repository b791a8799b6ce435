"""A burst of jobs on two workers: no healthy worker is taken for dead, and no claim waits on a pool.

    python -m bench.burst_liveness [--jobs 1000] [--max-tokens 16] [--heartbeat-timeout 15] [--seats N]

Issue 32 saw 256 Celery threads per worker and the heartbeat share one 30-connection pool: in a 900-job
burst the heartbeat waited for a connection past the heartbeat timeout, the other worker requeued a
healthy worker's running jobs (235 requeues, jobs re-run up to 3 times), and claims logged
``QueuePool limit ... reached``. This runs that burst: a PostgreSQL cluster and a Redis server of its
own, the API in this process, two real ``pagedq worker`` processes with the default seats, every job
submitted at once (``--submitters`` concurrent clients), then waits for every job to end. It prints the
wall time, how many jobs succeeded and ran more than once, and what the workers' logs say of pool
timeouts, requeues of a silent worker and runs found lost; it exits 1 if any of those happened.
"""

import argparse
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.fault_cost import PROMPTS
from core.settings import Settings
from core.states import TERMINAL, JobStatus
from tests.support.jobs_client import Database, api_over_http, start_worker
from tests.support.private_postgres import private_postgres
from tests.support.private_redis import private_redis
from tests.support.services import Process, wait_for
from worker.engine.default_model import resolve_model

# What the workers' logs must never say in a burst without a fault.
ALARMS = {
    "pool timeouts": "QueuePool limit",
    "requeues of a silent worker": "requeued the job of a silent worker",
    "runs found lost": "job no longer ours",
}


def burst(args: argparse.Namespace, url: str) -> list[str]:
    body = {"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.jobs)]
    with httpx.Client(base_url=url, timeout=120) as client, ThreadPoolExecutor(args.submitters) as pool:

        def submit(prompt: str) -> str:
            return client.post("/v1/jobs", json={"prompt": prompt, **body}).raise_for_status().json()["id"]

        return list(pool.map(submit, prompts))


def run(args: argparse.Namespace, work: Path) -> dict[str, int | float]:
    with private_postgres() as postgres, private_redis(work) as broker:
        settings = Settings(
            database_url=postgres.create_migrated_database(),
            broker_url=broker.url(),
            model=args.model,
            data_dir=work / "data",
            device="cpu",
            max_num_seqs=args.seats,
            heartbeat_timeout=args.heartbeat_timeout,
        )
        db = Database(settings)
        workers: list[Process] = []
        try:
            workers += [start_worker(settings, db, work / f"worker{i}.log", timeout=600) for i in range(2)]
            with api_over_http(settings) as url:
                start = time.monotonic()
                ids = burst(args, url)

                def ended() -> list | None:
                    jobs = db.jobs(ids)
                    return jobs if all(job.status in TERMINAL for job in jobs) else None

                jobs = wait_for(ended, 7200, f"{len(ids)} jobs to end", interval=1.0)
                wall = time.monotonic() - start
        finally:
            for worker in workers:
                worker.stop()
            db.close()
        logs = "".join(worker.log() for worker in workers)
    return {
        "wall_s": wall,
        "succeeded": sum(job.status == JobStatus.SUCCEEDED for job in jobs),
        "ran more than once": sum(job.attempt > 1 for job in jobs),
    } | {name: logs.count(needle) for name, needle in ALARMS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--heartbeat-timeout", type=float, default=15.0, help="the issue's run used 15 s")
    parser.add_argument("--seats", type=int, default=Settings().max_num_seqs, help="per worker")
    parser.add_argument("--submitters", type=int, default=32, help="concurrent POSTs")
    parser.add_argument("--model", default=Settings().model)
    args = parser.parse_args()
    args.model = str(resolve_model(args.model))  # the API is served from this process: a directory
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH")
    work = Path(tempfile.mkdtemp(prefix="pagedq-burst-"))
    try:
        result = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.jobs} jobs x {args.max_tokens} tokens, two workers of {args.seats} seats")
    print(
        "  ".join(
            f"{name} {value:.1f}" if name == "wall_s" else f"{name} {value}" for name, value in result.items()
        )
    )
    alarms = result["ran more than once"] + sum(result[name] for name in ALARMS)
    raise SystemExit(1 if alarms or result["succeeded"] != args.jobs else 0)


if __name__ == "__main__":
    main()
