"""What a fault costs a run in wall time: the same jobs with no fault, with PostgreSQL down for a while,
and with Redis killed and restarted empty, each against the run without a fault.

    python -m bench.fault_cost [--jobs 200] [--max-tokens 24] [--outage 20] [--fault-at 5] [--seats N]

Each run gets a PostgreSQL cluster and a Redis server of its own (``initdb``/``pg_ctl`` as in the tests,
``redis-server`` on a free port, keeping nothing on disk), a migrated database, the API in this process
and one real ``pagedq worker``, all with the default settings (heartbeat timeout, requeue_after), so the
repair times are the ones a deployment gets. The jobs are submitted together; ``--fault-at`` seconds
after the first submission the fault starts: PostgreSQL stopped (``-m immediate``, as a crash) for
``--outage`` seconds, or Redis killed (SIGKILL: every queued message is lost) and started again at once.
Prints each run's wall time from the first submission until every job has ended, how many succeeded,
and the ratio to the run without a fault. The worker is never restarted.
"""

import argparse
import threading
import time
from collections.abc import Callable

from bench.stack import Stack, service_stack, submit_jobs
from core.settings import Settings
from core.states import JobStatus
from tests.support.private_postgres import PrivatePostgres
from tests.support.private_redis import PrivateRedis
from worker.engine.default_model import resolve_model

PROMPTS = [f"Write one sentence about the number {i}." for i in range(1000)]


def postgres_outage(seconds: float) -> Callable[[PrivatePostgres, PrivateRedis], None]:
    def fault(postgres: PrivatePostgres, _: PrivateRedis) -> None:
        postgres.stop("immediate")
        time.sleep(seconds)
        postgres.start()

    return fault


def redis_restart(_: PrivatePostgres, server: PrivateRedis) -> None:
    server.stop()
    server.start()


def run(args: argparse.Namespace, fault: Callable[[PrivatePostgres, PrivateRedis], None] | None) -> dict:
    with service_stack(model=args.model, device="cpu", max_num_seqs=args.seats) as stack:
        stack.worker()
        postgres, broker = stack.postgres, stack.redis
        assert postgres is not None and broker is not None  # the stack's own servers
        with stack.api_in_process() as url:
            return _timed(args, stack, url, lambda: fault(postgres, broker) if fault else None)


def _timed(args: argparse.Namespace, stack: Stack, url: str, fault: Callable[[], None]) -> dict:
    start = time.monotonic()
    ids = submit_jobs(url, PROMPTS[: args.jobs], args.max_tokens)
    submitted = time.monotonic() - start
    injector = threading.Timer(max(0.0, args.fault_at - submitted), fault)
    injector.start()
    jobs = stack.ended(ids)
    wall = time.monotonic() - start
    injector.join()
    return {
        "wall_s": wall,
        "succeeded": sum(job.status == JobStatus.SUCCEEDED for job in jobs),
        "rerun": sum(job.attempt > 1 for job in jobs),
        "jobs": len(jobs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--outage", type=float, default=20.0, help="seconds PostgreSQL stays down")
    parser.add_argument("--fault-at", type=float, default=5.0, help="seconds after the first submission")
    parser.add_argument("--model", default=Settings().model)
    parser.add_argument(
        "--seats",
        type=int,
        default=Settings().max_num_seqs,
        help="the worker's seats: fewer than --jobs keeps messages waiting in Redis",
    )
    args = parser.parse_args()
    args.model = str(resolve_model(args.model))  # the API is served from this process: a directory
    runs = {
        "no fault": None,
        f"PostgreSQL down {args.outage:g} s": postgres_outage(args.outage),
        "Redis killed and restarted empty": redis_restart,
    }
    baseline = None
    print(
        f"{args.jobs} jobs x {args.max_tokens} tokens, {args.seats} seats, "
        f"fault {args.fault_at:g} s after the first submission"
    )
    for name, fault in runs.items():
        result = run(args, fault)
        baseline = baseline or result["wall_s"]
        print(
            f"{name:34} wall {result['wall_s']:7.1f} s  x{result['wall_s'] / baseline:5.2f}  "
            f"succeeded {result['succeeded']}/{result['jobs']}  rerun {result['rerun']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
