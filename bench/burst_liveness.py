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
import time

from bench.fault_cost import PROMPTS
from bench.stack import service_stack, submit_jobs
from core.settings import Settings
from core.states import JobStatus
from worker.engine.default_model import resolve_model

# What the workers' logs must never say in a burst without a fault.
ALARMS = {
    "pool timeouts": "QueuePool limit",
    "requeues of a silent worker": "requeued the job of a silent worker",
    "runs found lost": "job no longer ours",
}


def run(args: argparse.Namespace) -> dict[str, int | float]:
    fields = {"max_num_seqs": args.seats, "heartbeat_timeout": args.heartbeat_timeout}
    with service_stack(model=args.model, device="cpu", **fields) as stack:
        workers = [stack.worker(f"worker{i}") for i in range(2)]
        with stack.api_in_process() as url:
            start = time.monotonic()
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.jobs)]
            jobs = stack.ended(submit_jobs(url, prompts, args.max_tokens, args.submitters), interval=1.0)
            wall = time.monotonic() - start
        for worker in workers:
            worker.stop()
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
    result = run(args)
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
