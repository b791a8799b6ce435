"""Running jobs' inter-token latency while long prompts arrive, per step token budget (issue 32 item 7).

    python bench/prefill_itl.py [--budgets 2048,1024,512,256] [--running 16] [--long-prompt 7000]
                                [--long-count 2] [--max-tokens 160] [--model DIR] [--context-keys engine,0]

``--running`` requests decode ``--max-tokens`` tokens each; once they are all decoding, ``--long-count``
prompts of ``--long-prompt`` tokens arrive, one every few steps. Every budget runs the same requests on the
same engine settings otherwise. Printed per budget: the running requests' inter-token gaps (p50, p99,
max), the long prompts' time to first token, and the whole load's generated tokens per second, with each
budget's p99 and throughput as a ratio of the first budget's (the baseline). ``--context-keys``: the
scheduler's Scheduler.context_keys per run (``engine``: the device's; 0: chunks count their tokens only),
each budget run with each. The machine must be quiet.
"""

import argparse
import itertools
import random
import statistics
import time

from contract.sampling import SamplingParams
from worker.engine import LLM


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(llm: LLM, args: argparse.Namespace) -> dict[str, float]:
    engine, rng = llm.engine, random.Random(0)
    decode = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0.0)
    for i in range(args.running):
        engine.add_request(f"run-{i}", [rng.randrange(100, 5000) for _ in range(64)], decode)
    long_ids = [[rng.randrange(100, 5000) for _ in range(args.long_prompt)] for _ in range(args.long_count)]
    times: dict[str, list[float]] = {}
    arrived: dict[str, float] = {}
    steps, since, decoding, start = 0, 0, False, time.monotonic()
    while engine.has_unfinished_requests():
        since = since if decoding else steps
        decoding = decoding or all(f"run-{i}" in times for i in range(args.running))
        due = decoding and len(arrived) < args.long_count and (steps - since) % args.long_every == 0
        if due:
            request_id = f"long-{len(arrived)}"
            arrived[request_id] = time.monotonic()
            engine.add_request(request_id, long_ids[len(arrived) - 1], SamplingParams(max_tokens=8))
        for output in engine.step():
            times.setdefault(output.request_id, []).extend(output.metrics.token_times)
        steps += 1
    seconds = time.monotonic() - start
    running = [ts for rid, ts in times.items() if rid.startswith("run-")]
    gaps = [b - a for ts in running for a, b in itertools.pairwise(ts)]
    ttft = [times[rid][0] - at for rid, at in arrived.items()]
    return {
        "p50": percentile(gaps, 0.5) * 1e3,
        "p99": percentile(gaps, 0.99) * 1e3,
        "max": max(gaps) * 1e3,
        "ttft": statistics.mean(ttft),
        "tok/s": sum(len(ts) for ts in times.values()) / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="2048,1024,512,256")
    parser.add_argument("--running", type=int, default=16)
    parser.add_argument("--long-prompt", type=int, default=7000)
    parser.add_argument("--long-count", type=int, default=2)
    parser.add_argument("--long-every", type=int, default=8, help="steps between long prompts' arrivals")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--model", default=None, help="a model directory (default: the built-in model)")
    parser.add_argument("--context-keys", default="engine", help="comma list of engine or N (0: tokens only)")
    args = parser.parse_args()
    model = {"model": args.model} if args.model else {}
    rows = []
    for budget in (int(b) for b in args.budgets.split(",")):
        for keys in args.context_keys.split(","):
            llm = LLM(**model, device="cpu", max_num_batched_tokens=budget, enable_prefix_caching=False)
            if keys != "engine":
                llm.engine.scheduler.context_keys = int(keys) or None
            llm.engine.step()  # an empty step: the kernels' first call out of the timings
            rows.append((f"{budget} / {keys}", run(llm, args)))
            del llm
    base = rows[0][1]
    print(f"{args.running} running x {args.max_tokens} tokens; {args.long_count} x {args.long_prompt} arrive")
    print(
        "| budget / context keys | ITL p50 ms | p99 ms | max ms | long TTFT s | tok/s | p99 / 1st |", end=""
    )
    print(" tok/s / 1st |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for budget, r in rows:
        itl = f"{r['p50']:.0f} | {r['p99']:.0f} | {r['max']:.0f}"
        ratios = f"{r['p99'] / base['p99']:.2f}x | {r['tok/s'] / base['tok/s']:.2f}x"
        print(f"| {budget} | {itl} | {r['ttft']:.2f} | {r['tok/s']:.1f} | {ratios} |")


if __name__ == "__main__":
    main()
