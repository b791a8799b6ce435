"""Step 5: the KV pool the engine sizes by profiling, on the Llama-3.1-8B-shaped dummy model in bfloat16.

With ``kv_cache_bytes`` unset the runner profiles a full-budget prefill and gives the KV pool what is left
of ``gpu_memory_utilization`` (0.9) of the GPU. Reported: the blocks chosen and the memory left free. Then
every seat (256) runs a 1,024-token prompt and samples 16 tokens with top-p (the sampler's temporaries
are not profiled, nor are the CUDA graphs): no OOM, and the peak (torch's peak reservation plus what is
not torch's) stays within ``PEAK_SHARE`` of the GPU.
"""

import random
import time

from bench import gpu_throughput
from bench.gpu_check.outcome import FAIL, MISS, NEEDS_CUDA, PASS, Context, Outcome

PEAK_SHARE = 0.95
FULL = {"seats": 256, "prompt": 1024, "new": 16, "max_model_len": 4096}
DRY = {"seats": 8, "prompt": 32, "new": 4, "max_model_len": 256}


def run(ctx: Context) -> Outcome:
    import torch

    from contract.sampling import SamplingParams
    from worker.engine import LLM

    size = DRY if ctx.dry_run else FULL
    path = gpu_throughput.write_model(ctx.workdir / "model", tiny=ctx.dry_run)
    start = time.perf_counter()
    llm = LLM(
        str(path),
        load_format="dummy",
        device=ctx.device,
        dtype="float32" if ctx.dry_run else "bfloat16",
        max_model_len=size["max_model_len"],
        max_num_seqs=size["seats"],
    )
    started = time.perf_counter() - start
    runner = llm.engine.runner
    pool = (
        f"{runner.num_blocks} blocks of {runner.block_size} tokens, {runner.kv_cache_bytes / 2**30:.2f} GiB"
    )
    lines = [f"Engine built in {started:.1f} s: KV pool {pool} (max_model_len {size['max_model_len']})."]
    if not torch.cuda.is_available():
        return Outcome(NEEDS_CUDA, f"CPU sizing: {pool}", "\n".join(lines))
    total = torch.cuda.mem_get_info()[1]
    lines.append(f"Free after the engine was built: {_free_gib()} of {total / 2**30:.1f} GiB.")
    torch.cuda.reset_peak_memory_stats()
    rng, vocab = random.Random(5), llm.engine.model_config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(size["prompt"])] for _ in range(size["seats"])]
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=size["new"], ignore_eos=True, seed=1)
    start = time.perf_counter()
    outs = llm.generate(prompts, sampled)
    ran = time.perf_counter() - start
    free, total = torch.cuda.mem_get_info()
    peak = torch.cuda.max_memory_reserved() + (total - free - torch.cuda.memory_reserved())
    produced = sum(len(out.outputs[0].token_ids) for out in outs)
    lines += [
        f"{size['seats']} seats x {size['prompt']}-token prompts, {produced} tokens sampled in {ran:.1f} s; "
        f"{llm.engine.scheduler.num_preemptions} preemptions.",
        f"Peak: {peak / 2**30:.1f} GiB ({peak / total:.1%} of the GPU); free afterwards {_free_gib()}.",
    ]
    figure = f"{pool}; peak {peak / total:.1%} of {total / 2**30:.0f} GiB"
    if produced != size["seats"] * size["new"]:
        return Outcome(FAIL, figure, "\n".join(lines))
    return Outcome(PASS if peak <= PEAK_SHARE * total else MISS, figure, "\n".join(lines))


def _free_gib() -> str:
    import torch

    return f"{torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB"
