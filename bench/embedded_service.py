"""The embedded mode (``pagedq up``: SQLite and the file broker) through its API on the CPU, with the GPU
runbook's step 7 (bench/gpu_check/steps/service.py) at its full size but the dry run's tiny random model,
so that the service's own costs (claims, the broker, SQLite) show rather than the model's:

    python -m bench.embedded_service [--jobs 500] [--lines 2000]

``--jobs`` single jobs of 64 tokens submitted at once, then a ``--lines`` chat batch of 32 tokens a line;
prints jobs/s, lines/s, tokens/s of each and the batch / jobs ratio of tokens/s (a line costs its claim
and its finish like a job, for half the tokens: about 0.5 means a line costs what a job does).
"""

import argparse
import tempfile
import time
from pathlib import Path

import httpx

from bench.gpu_check import models
from bench.gpu_check.outcome import Context
from bench.gpu_check.steps import service


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--lines", type=int, default=2000)
    args = p.parse_args()
    size = {"jobs": args.jobs, "job_tokens": 64, "lines": args.lines, "line_tokens": 32}
    with tempfile.TemporaryDirectory(prefix="pagedq-embedded-") as tmp:
        work = Path(tmp)
        ctx = Context(True, work, work / "outcome.json", time.time() + 3600)
        up, url = service.start_up(models.served_llama(work / "model", True), ctx, work / "up.log")
        checks: list = []
        try:
            with httpx.Client(base_url=url, timeout=120) as client:
                jobs_s, job_tok_s = service.run_jobs(client, size, ctx, checks)
                lines_s, line_tok_s = service.run_batch(client, size, ctx, checks)
        finally:
            service.stop(up)
    failed = [what for ok, what in checks if not ok]
    print(f"jobs:  {jobs_s:7.1f} jobs/s  {job_tok_s:7.0f} tok/s ({args.jobs} x 64 tokens)")
    print(f"batch: {lines_s:7.1f} lines/s {line_tok_s:7.0f} tok/s ({args.lines} x 32 tokens)")
    print(f"batch / jobs tok/s: {line_tok_s / job_tok_s:.2f}" + (f"; FAILED: {failed}" if failed else ""))


if __name__ == "__main__":
    main()
