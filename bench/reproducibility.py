"""Batch invariance, measured: seeded and greedy jobs run alone and again inside a busy mixed load, and
the throughput of the batch-invariant kernels against oneDNN's (``batch_invariant=False``), in one run.

    python bench/reproducibility.py [--jobs 200] [--max-tokens 64] [--model DIR] [--kv-blocks 64]

Each job (half greedy, half seeded sampling at temperature 0.8, top_p 0.95) runs alone on its own engine
steps, then all of them together with filler jobs of other lengths, on an engine whose KV cache holds
``--kv-blocks`` blocks (so sequences are preempted and recomputed), whose prefills are chunked (256
tokens a step) and where half the prompts share a prefix (prefix-cache hits). 200/200 identical token
ids are required. Then the same busy load runs with ``batch_invariant`` on and off: tokens/s of each
and their ratio (the cost of invariance). The machine must be otherwise quiet for the timings.
"""

import argparse
import random
import time

from contract.sampling import SamplingParams
from worker.engine import LLM

PREFIX = [random.Random(1).randrange(100, 5000) for _ in range(48)]


def jobs(count: int, max_tokens: int) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(0)
    out = []
    for i in range(count):
        own = [rng.randrange(100, 5000) for _ in range(rng.randrange(8, 160))]
        prompt = PREFIX + own if i % 2 else own
        tokens = rng.randrange(max_tokens // 4, max_tokens + 1)
        sampling = {"temperature": 0.8, "top_p": 0.95, "seed": i} if i % 4 < 2 else {"temperature": 0.0}
        out.append((prompt, SamplingParams(max_tokens=tokens, ignore_eos=True, **sampling)))
    return out


def busy(llm: LLM, work: list[tuple[list[int], SamplingParams]]) -> tuple[list[list[int]], float, int]:
    """Token ids of every job run together with fillers (shuffled in); seconds and tokens generated."""
    fillers = [(p[: len(p) // 2 + 1], SamplingParams(temperature=1.0, max_tokens=8)) for p, _ in work[::3]]
    order = list(range(len(work) + len(fillers)))  # indices past len(work) are fillers
    random.Random(2).shuffle(order)
    everything = [(work + fillers)[i] for i in order]
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in everything], [s for _, s in everything])
    seconds = time.perf_counter() - start
    tokens = {i: out.outputs[0].token_ids for i, out in zip(order, outputs, strict=True)}
    return [tokens[i] for i in range(len(work))], seconds, sum(len(t) for t in tokens.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default=None, help="a model directory (default: the built-in model)")
    parser.add_argument("--kv-blocks", type=int, default=64, help="KV cache blocks of the busy engine")
    args = parser.parse_args()
    work = jobs(args.jobs, args.max_tokens)
    model = {"model": args.model} if args.model else {}
    alone_llm = LLM(**model, max_num_seqs=1)
    alone = [alone_llm.generate(p, s)[0].outputs[0].token_ids for p, s in work]
    per_block = alone_llm.engine.runner.kv_cache_bytes // alone_llm.engine.runner.num_blocks
    del alone_llm
    results = {}
    for invariant in (True, False):
        llm = LLM(
            **model,
            batch_invariant=invariant,
            kv_cache_bytes=args.kv_blocks * per_block,
            max_num_batched_tokens=256,
        )
        tokens, seconds, generated = busy(llm, work)
        same = sum(a == b for a, b in zip(alone, tokens, strict=True))
        results[invariant] = generated / seconds
        print(
            f"batch_invariant={invariant}: {same}/{len(work)} identical to alone, "
            f"{generated / seconds:.1f} tok/s ({generated} tokens in {seconds:.1f} s), "
            f"{llm.engine.stats().num_preemptions} preemptions"
        )
    print(f"throughput invariant / oneDNN: {results[True] / results[False]:.3f}")


if __name__ == "__main__":
    main()
