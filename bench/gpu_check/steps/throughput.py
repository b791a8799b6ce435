"""Step 6: ``bench/gpu_throughput.py`` on the Llama-3.1-8B-shaped dummy model (its docstring says what
it measures): pagedq's offline throughput on 1,000 requests and its decode steps at batch 1, 64 and 256
against the bandwidth bound, then transformers' static batches (and its continuous batching manager,
time permitting) on the first ``HF_REQUESTS`` of the same requests. Each system runs in its own process
under a time cap, the largest static batch first; the table is reported after each.

Dry run: the script's ``--tiny`` model on the CPU, one system of each kind.
"""

import subprocess
import time

from bench import gpu_throughput as bench
from bench.gpu_check.outcome import FAIL, MISS, PASS, RAN, Context, Outcome

# The most telling first: a step cut short by --within drops the smaller static batches (rarely the best).
SYSTEMS = ("pagedq", "hf-static-128", "hf-continuous", "hf-static-64", "hf-static-32")
DRY_SYSTEMS = ("pagedq", "hf-static-32", "hf-continuous")
CAP_S = {"pagedq": 270}  # the others: HF_CAP_S each
HF_CAP_S = 150
HF_REQUESTS = 256
MIN_START_S = 60  # a system is not started with less time than this left


def run(ctx: Context) -> Outcome:
    model = bench.write_model(ctx.workdir / "model", tiny=ctx.dry_run)
    args = bench.parse_args(["--tiny"] * ctx.dry_run + ["--hf-requests", str(HF_REQUESTS)])
    results: list[dict] = []
    for system in DRY_SYSTEMS if ctx.dry_run else SYSTEMS:
        left = ctx.seconds_left() - 10
        if left < MIN_START_S:
            results.append({"system": system, "error": f"not run: {left:.0f} s left"})
            continue
        args.timeout = min(CAP_S.get(system, HF_CAP_S), left)
        print(f"running {system} (at most {args.timeout:.0f} s) ...", flush=True)
        start = time.monotonic()
        try:
            results.append(bench.spawn(system, str(model), args))
        except subprocess.TimeoutExpired:
            results.append({"system": system, "error": f"cut off after {time.monotonic() - start:.0f} s"})
        ctx.report(outcome(results, ctx.dry_run))
    return outcome(results, ctx.dry_run)


def outcome(results: list[dict], dry_run: bool) -> Outcome:
    """Dry run: every system must run. On the GPU: pagedq and a static batch must; the targets decide."""
    details = bench.report(results)
    ours = next((r for r in results if r["system"] == "pagedq" and "error" not in r), None)
    static = [r for r in results if r["system"].startswith("hf-static") and "error" not in r]
    if ours is None:
        return Outcome(FAIL, "pagedq did not run", details)
    figure = f"{ours['offline_tok_s']:.0f} tok/s offline"
    if static:
        best = max(static, key=lambda r: r["offline_tok_s"])
        figure += f", {ours['offline_tok_s'] / best['offline_tok_s']:.2f}x {best['system']}"
    figure += "".join(
        f"; decode@{b} {d['ratio']:.2f}x bound" for b, d in ours["decode"].items() if b in ("1", "256")
    )
    if dry_run:
        return Outcome(FAIL if any("error" in r for r in results) else RAN, figure, details)
    if not static:
        return Outcome(FAIL, f"{figure}; no static batch of transformers ran", details)
    missed = any(line.endswith("MISS") for line in bench.targets(ours, results))
    return Outcome(MISS if missed else PASS, figure, details)
