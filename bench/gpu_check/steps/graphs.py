"""Step 4: decode steps replayed from CUDA graphs against the same steps launched eagerly.

The step-3 model in bfloat16, twice (``enforce_eager`` on, then off): greedy tokens of a batch of prompts
must be the same, and the median decode step at batch 1, 16 and 64 (``bench/gpu_throughput.py``'s
measurement, sampling included) is reported for each, with the engine's start time (graph capture).
"""

import gc
import time
from dataclasses import dataclass

from bench import gpu_throughput
from bench.gpu_check import models
from bench.gpu_check.outcome import FAIL, MISS, NEEDS_CUDA, PASS, Context, Outcome
from bench.gpu_throughput import Sizes

FULL = Sizes(
    0, (0, 0), (0, 0), decode_batches=(1, 16, 64), decode_context=512, decode_steps=32, max_model_len=2048
)
DRY = Sizes(0, (0, 0), (0, 0), decode_batches=(1, 4), decode_context=32, decode_steps=4, max_model_len=512)


@dataclass
class Side:
    """One engine's run: its greedy tokens, decode step times by batch, start time, graphs captured."""

    tokens: list[list[int]]
    steps: dict[str, dict[str, float]]
    start_s: float
    graphs: int


def run(ctx: Context) -> Outcome:
    import torch

    from contract.sampling import SamplingParams
    from worker.engine import LLM

    sizes = DRY if ctx.dry_run else FULL
    path = models.real_heads_llama(ctx.workdir / "model", ctx.dry_run)
    prompts = models.text_prompts(6 if ctx.dry_run else 48, seed=4, longest=600)
    params = SamplingParams(temperature=0.0, max_tokens=8 if ctx.dry_run else 32, ignore_eos=True)
    greedy = lambda m: SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)  # noqa: E731
    bandwidth = gpu_throughput.copy_bandwidth(ctx.device)
    sides = {}
    for eager in (True, False):
        start = time.perf_counter()
        llm = LLM(
            str(path),
            device=ctx.device,
            dtype="float32" if ctx.dry_run else "bfloat16",
            enforce_eager=eager,
            max_model_len=sizes.max_model_len,
            kv_cache_bytes=(16 << 20) if ctx.dry_run else (4 << 30),
        )
        started = time.perf_counter() - start
        graphs = llm.engine.runner.graphs
        tokens = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
        steps, _ = gpu_throughput.decode_steps(llm, sizes, bandwidth, greedy)
        sides[eager] = Side(tokens, steps, started, len(graphs.sizes) if graphs else 0)
        del llm, graphs
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return outcome(sides[True], sides[False], ctx.dry_run)


def outcome(eager: Side, graphs: Side, dry_run: bool) -> Outcome:
    differ = sum(a != b for a, b in zip(eager.tokens, graphs.tokens, strict=True))
    rows = ["| decode batch | eager ms | graphs ms | eager / graphs |", "| ---: | ---: | ---: | ---: |"]
    for batch, e in eager.steps.items():
        g = graphs.steps[batch]["step_ms"]
        rows.append(f"| {batch} | {e['step_ms']:.2f} | {g:.2f} | {e['step_ms'] / g:.2f}x |")
    tokens = (
        f"tokens identical over {len(eager.tokens)} prompts"
        if not differ
        else f"{differ} of {len(eager.tokens)} prompts' tokens differ"
    )
    starts = (
        f"eager {eager.start_s:.1f} s, with graphs {graphs.start_s:.1f} s ({graphs.graphs} graphs captured)"
    )
    details = "\n".join([f"{tokens.capitalize()}. Engine start: {starts}.", "", *rows])
    first = next(iter(eager.steps))
    speedup = eager.steps[first]["step_ms"] / graphs.steps[first]["step_ms"]
    if differ:
        return Outcome(FAIL, tokens, details)
    if dry_run:
        return Outcome(NEEDS_CUDA, "no CUDA graphs on the CPU; eager tokens identical", details)
    if not graphs.graphs:
        return Outcome(FAIL, "no CUDA graphs were captured", details)
    return Outcome(
        PASS if speedup > 1 else MISS, f"{tokens}; decode@{first} {speedup:.2f}x faster with graphs", details
    )
