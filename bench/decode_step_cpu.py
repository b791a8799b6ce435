"""One decode step of the default model on CPU: pagedq's C++ kernels, pagedq's torch reference, and
transformers, and pagedq with quantized linears (``--quantized``), interleaved in one process so that a
shared machine's noise hits them all alike.

    python -m bench.decode_step_cpu [--batches 1,16,64] [--context 256] [--iters 10] [--dtype float32]
        [--quantized fp16]

A step: B sequences with ``--context`` tokens cached each, one new token each, up to the logits of
all B. pagedq's two backends share one model and KV pool (``PAGEDQ_KERNEL_BACKEND`` is read on every
call); transformers runs its own model on a ``DynamicCache`` cropped back after every step. Prints
min and median ms per step and the ratios of the mins (the robust statistic on a shared machine).
"""

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from kernels import AttentionMetadata, dispatch
from worker.engine.default_model import ensure_default_model
from worker.engine.model.loader import load_model
from worker.engine.model.model_config import ModelConfig

BLOCK = 16


def pagedq_step(
    path, batch: int, context: int, dtype: torch.dtype, quantization: str = "none", gguf_kernel: str = "float"
) -> Callable[[], object]:
    config = ModelConfig.from_pretrained(path)
    cpu = torch.device("cpu")
    model = load_model(config, context + 64, dtype, cpu, "safetensors", quantization, gguf_kernel=gguf_kernel)
    per_seq = -(-(context + 1) // BLOCK)
    shape = (batch * per_seq + 1, BLOCK, config.num_kv_heads, config.head_dim)
    caches = [(torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)) for _ in range(config.num_layers)]
    tables = (torch.randperm(batch * per_seq) + 1).view(batch, per_seq).int()
    slots = (tables[:, context // BLOCK].long() * BLOCK + context % BLOCK).tolist()
    meta_args = {
        "slot_mapping": torch.tensor(slots),
        "block_tables": tables,
        "query_start_loc": torch.arange(batch + 1, dtype=torch.int32),
        "seq_lens": torch.full((batch,), context + 1, dtype=torch.int32),
        "query_lens_cpu": [1] * batch,
        "seq_lens_cpu": [context + 1] * batch,
        "block_size": BLOCK,
    }
    ids, positions = torch.randint(1000, (batch,)), torch.full((batch,), context)

    @torch.inference_mode()
    def step() -> object:
        meta = AttentionMetadata(**meta_args)  # a fresh step: the reference re-plans, as the engine does
        return model.compute_logits(model(ids, positions, caches, meta)).argmax(-1)

    return step


def hf_step(path, batch: int, context: int, dtype: torch.dtype) -> Callable[[], object]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.randint(1000, (batch, context)), past_key_values=cache, use_cache=True)
    ids = torch.randint(1000, (batch, 1))

    @torch.inference_mode()
    def step() -> object:
        out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.crop(-1)  # back to `context` tokens
        return out.logits[:, -1].argmax(-1)

    return step


def with_backend(name: str, step: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        os.environ[dispatch.BACKEND_ENV] = name
        return step()

    return run


def measure(steps: dict[str, Callable[[], object]], iters: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():  # warm-up: heap growth, first-call plans
        for _ in range(2):
            step()
    for _ in range(iters):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(1e3 * (time.perf_counter() - start))
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--quantized", default="fp16", help="pagedq quantizations to add (cpu kernels)")
    args = p.parse_args()
    path, dtype = ensure_default_model(), getattr(torch, args.dtype)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.dtype}, context {args.context}"
    )
    quantized = [q for q in args.quantized.split(",") if q]
    names = ["cpu", "torch", "hf", *quantized]
    ratios = [("cpu", "hf"), ("cpu", "torch")] + [(q, "hf") for q in quantized]
    title = {"cpu": "pagedq cpu", "torch": "pagedq torch", "hf": "transformers"}
    heads = [title.get(n, f"pagedq {n}") + " ms" for n in names] + [f"{a} / {b}" for a, b in ratios]
    print(f"| batch | {' | '.join(heads)} |")
    print("| ---: " * (len(heads) + 1) + "|")
    for batch in map(int, args.batches.split(",")):
        paged = pagedq_step(path, batch, args.context, dtype)
        steps = {
            "cpu": with_backend("cpu", paged),
            "torch": with_backend("torch", paged),
            "hf": hf_step(path, batch, args.context, dtype),
        }
        for q in quantized:
            steps[q] = with_backend("cpu", pagedq_step(path, batch, args.context, dtype, q))
        t = measure(steps, args.iters)
        best = {name: min(v) for name, v in t.items()}
        cells = [f"{best[n]:.1f} (med {statistics.median(t[n]):.1f})" for n in names]
        cells += [f"{best[a] / best[b]:.2f}" for a, b in ratios]
        print(f"| {batch} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
