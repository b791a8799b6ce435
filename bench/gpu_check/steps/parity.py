"""Step 3: the engine on the GPU against transformers on the GPU, same random weights.

A Llama with Llama-3.1-8B's attention shapes (32 query heads over 8 KV heads of 128, llama3 RoPE) in
four thin layers. Float32: every prompt's greedy tokens equal transformers' (one request at a time,
unpadded), each chosen token's logprob within ``LOGPROB_TOLERANCE``; the engine runs all prompts at once
with a small token budget, so prefills are chunked and share steps with decodes. Bfloat16, engine
against transformers in bfloat16: the common prefix of the greedy tokens, reported (rounding may
flip a near-tie).
"""

import gc

from bench.gpu_check import models
from bench.gpu_check.outcome import FAIL, PASS, Context, Outcome

LOGPROB_TOLERANCE = 1e-3
FULL = {"prompts": 16, "max_new": 32, "kv_cache_bytes": 2 << 30, "max_num_batched_tokens": 256}
DRY = {"prompts": 4, "max_new": 8, "kv_cache_bytes": 8 << 20, "max_num_batched_tokens": 32}


def run(ctx: Context) -> Outcome:
    import torch

    from contract.sampling import SamplingParams
    from tests.support.reference import HFReference, chosen_logprobs
    from worker.engine import LLM

    size = DRY if ctx.dry_run else FULL
    path = models.real_heads_llama(ctx.workdir / "model", ctx.dry_run)
    greedy = SamplingParams(temperature=0.0, max_tokens=size["max_new"], ignore_eos=True, logprobs=0)
    texts = models.text_prompts(size["prompts"], seed=3)
    engine_args = {k: size[k] for k in ("kv_cache_bytes", "max_num_batched_tokens")}
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        llm = LLM(str(path), device=ctx.device, dtype=str(dtype).removeprefix("torch."), **engine_args)
        prompts = [llm.tokenizer.encode(text) for text in texts]
        outs = [out.outputs[0] for out in llm.generate(prompts, greedy)]
        del llm
        reference = HFReference(path, dtype, ctx.device)
        wants = [reference.greedy(ids, size["max_new"], stop_at_eos=False) for ids in prompts]
        runs[dtype] = [
            (out.token_ids, chosen_logprobs(out), *want) for out, want in zip(outs, wants, strict=True)
        ]
        del reference
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return outcome(runs[torch.float32], runs[torch.bfloat16], size["max_new"])


def outcome(fp32: list[tuple], bf16: list[tuple], max_new: int) -> Outcome:
    same = sum(got == want for got, _, want, _ in fp32)
    drift = max(abs(a - b) for _, got_lp, _, want_lp in fp32 for a, b in zip(got_lp, want_lp, strict=False))
    prefixes = [common_prefix(got, want) for got, _, want, _ in bf16]
    mean_prefix = sum(prefixes) / len(prefixes)
    figure = (
        f"float32: {same}/{len(fp32)} identical, max |dlogprob| {drift:.1e}; "
        f"bf16: mean common prefix {mean_prefix:.1f}/{max_new}"
    )
    rows = [
        "| prompt | float32 identical | float32 max \\|dlogprob\\| | bf16 common prefix |",
        "| ---: | --- | ---: | ---: |",
    ]
    for i, ((got, got_lp, want, want_lp), prefix) in enumerate(zip(fp32, prefixes, strict=True)):
        lp = max((abs(a - b) for a, b in zip(got_lp, want_lp, strict=False)), default=0.0)
        rows.append(f"| {i} | {got == want} | {lp:.1e} | {prefix}/{max_new} |")
    passed = same == len(fp32) and drift <= LOGPROB_TOLERANCE
    return Outcome(PASS if passed else FAIL, figure, "\n".join(rows))


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
