"""What killing a worker costs when its jobs resume from their flushed tokens, against restarting them from
zero, each against the same jobs without a kill.

    python -m bench.resume_cost [--jobs 32] [--max-tokens 1024] [--kill-at 0.75] [--seats 32] [--keep]

Each run gets a PostgreSQL cluster and a Redis server of its own, a migrated database, the API in this
process and a real ``pagedq worker``. The jobs (greedy, ``ignore_eos``) are submitted together; once
``--kill-at`` of all their tokens are flushed the worker is killed (SIGKILL) and a new one started. In the
restart run the flushed token ids are cleared right after the kill, so the new worker starts every job
over, as pagedq did before it resumed. Prints each run's wall time from the first submission until every
job has ended, the extra time over the run without a kill, and the resume's extra time as a share of the
restart's (the target is at most 0.5). Run at size on a quiet machine; ``--jobs 2 --max-tokens 64`` proves
it runs.
"""

import argparse
import time

from sqlalchemy import update

from bench.stack import Stack, service_stack, submit_jobs
from core.models import TokenTimes
from core.settings import Settings
from core.states import JobStatus
from tests.support.services import wait_for
from worker.engine.default_model import resolve_model

PROMPTS = [f"Write a long story about the number {i}." for i in range(1000)]


def run(args: argparse.Namespace, kill: str | None) -> dict:
    """``kill``: None, "resume" or "restart"."""
    fields = {"max_num_seqs": args.seats, "heartbeat_timeout": args.heartbeat_timeout}
    with service_stack(keep=args.keep, model=args.model, device="cpu", **fields) as stack:
        stack.worker("worker0")
        with stack.api_in_process() as url:
            return _timed(args, stack, url, kill)


def _timed(args: argparse.Namespace, stack: Stack, url: str, kill: str | None) -> dict:
    db = stack.db
    start = time.monotonic()
    ids = submit_jobs(url, PROMPTS[: args.jobs], args.max_tokens)
    total = args.jobs * args.max_tokens
    flushed_at_kill = 0
    if kill is not None:
        wait_for(
            lambda: (stack.completion_tokens(ids) or 0) >= args.kill_at * total,
            3600,
            f"{args.kill_at:.0%} of the tokens to be flushed",
            interval=0.2,
        )
        stack.processes[0].kill()
        flushed_at_kill = stack.completion_tokens(ids) or 0
        if kill == "restart":  # without its flushed tokens a job cannot resume: it starts over
            with db.sessions.begin() as session:
                session.execute(update(TokenTimes).where(TokenTimes.job_id.in_(ids)).values(token_ids=None))
        stack.worker("worker1")
    jobs = stack.ended(ids)
    for job in jobs if kill == "resume" else []:
        if not (job.runs and job.runs[-1]["resumed_from_token"]):
            print(f"  started over: {job.id} (attempt {job.attempt}, runs {job.runs})", flush=True)
    return {
        "wall_s": time.monotonic() - start,
        "succeeded": sum(job.status == JobStatus.SUCCEEDED for job in jobs),
        "resumed": sum(bool(job.runs and job.runs[-1]["resumed_from_token"]) for job in jobs),
        "flushed_at_kill": flushed_at_kill,
        "jobs": len(jobs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--kill-at", type=float, default=0.75, help="share of all tokens flushed at the kill")
    parser.add_argument("--seats", type=int, default=32)
    parser.add_argument("--heartbeat-timeout", type=float, default=10.0, help="how soon orphans are requeued")
    parser.add_argument("--model", default=Settings().model)
    parser.add_argument("--keep", action="store_true", help="keep each run's logs")
    args = parser.parse_args()
    args.model = str(resolve_model(args.model))  # the API is served from this process: a directory
    print(f"{args.jobs} jobs x {args.max_tokens} tokens, {args.seats} seats, kill at {args.kill_at:.0%}")
    results = {}
    for name, kill in (("no kill", None), ("kill, resume", "resume"), ("kill, restart from zero", "restart")):
        result = results[name] = run(args, kill)
        extra = result["wall_s"] - results["no kill"]["wall_s"]
        print(
            f"{name:24} wall {result['wall_s']:7.1f} s  extra {extra:6.1f} s  "
            f"succeeded {result['succeeded']}/{result['jobs']}  resumed {result['resumed']}  "
            f"tokens flushed at the kill {result['flushed_at_kill']}",
            flush=True,
        )
    base = results["no kill"]["wall_s"]
    resume, restart = (results[n]["wall_s"] - base for n in ("kill, resume", "kill, restart from zero"))
    ratio = resume / restart if restart > 0 else float("nan")
    print(f"resume's extra time / restart's: {ratio:.2f} (target <= 0.5)")


if __name__ == "__main__":
    main()
