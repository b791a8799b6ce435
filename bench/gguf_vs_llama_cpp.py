"""Batch-1 decode of the default model's own Q4_1 file: pagedq (``quantization="gguf"``, each kernel path,
and float32 for scale) against llama.cpp's ``llama-bench`` on the same file, in one run, with ratios.

    python -m bench.gguf_vs_llama_cpp [--tokens 128] [--rounds 3] [--threads 2] [--paths float,int8,none]

llama.cpp: ``llama-bench -p 0 -n TOKENS -t THREADS -r 1`` (tg: tokens generated from an empty context,
its tokens/s); ``bench/setup_llama_cpp.sh`` builds it. pagedq: ``LLM.chat``
on one chat prompt, TOKENS greedy tokens past EOS; its decode rate is (TOKENS - 1) over the time from
the first token to the last (the engine's own per-token times), so the prompt's prefill is not counted,
as llama-bench's tg counts none. The systems run in turn, ``--rounds`` times (so that a noisy machine's
slow spells hit them alike), and each one's best round is compared. Without llama.cpp built, the pagedq
rows print alone.
"""

import argparse
import functools
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from worker.engine import LLM, SamplingParams
from worker.engine.default_model import ensure_default_gguf

LLAMA_BENCH = Path(__file__).resolve().parent / ".llama.cpp" / "build" / "bin" / "llama-bench"
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a map."}]


def llama_cpp_tokens_per_s(gguf: Path, tokens: int, threads: int) -> float | None:
    binary = LLAMA_BENCH if LLAMA_BENCH.exists() else shutil.which("llama-bench")
    if binary is None:
        return None
    args = [str(binary), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", str(tokens), "-r", "1"]
    out = subprocess.run([*args, "-o", "json"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def pagedq_run(path: str, tokens: int) -> Callable[[], float]:
    """One round of pagedq on ``path`` (a gguf kernel path, or "none" for float32): its decode tokens/s."""
    quantization, kernel = ("none", "float") if path == "none" else ("gguf", path)
    llm = LLM(quantization=quantization, gguf_kernel=kernel, kv_cache_bytes=64 << 20)
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    llm.chat(PROMPT, SamplingParams(max_tokens=8, temperature=0))  # warm-up: first-call allocations

    def run() -> float:
        times = llm.chat(PROMPT, params)[0].metrics.token_times
        assert len(times) == tokens, f"{len(times)} token times for {tokens} tokens"
        return (tokens - 1) / (times[-1] - times[0])

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="llama.cpp's threads (pagedq uses torch's)")
    p.add_argument("--paths", default="float,int8,none", help="gguf kernel paths, and 'none' for float32")
    args = p.parse_args()
    gguf = ensure_default_gguf()
    systems: dict[str, Callable[[], float | None]] = {
        f"llama.cpp (llama-bench tg{args.tokens}, {args.threads} threads)": functools.partial(
            llama_cpp_tokens_per_s, gguf, args.tokens, args.threads
        )
    }
    for path in args.paths.split(","):
        name = "pagedq float32" if path == "none" else f"pagedq gguf ({path} kernels)"
        systems[name] = pagedq_run(path, args.tokens)
    rates: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.rounds):  # interleaved, so that the machine's noise hits every system alike
        for name, run in systems.items():
            rate = run()
            if rate is not None:
                rates[name].append(rate)
    best = {name: max(r) for name, r in rates.items() if r}
    reference = next(iter(best.values())) if len(best) == len(systems) else None
    print(f"\nBatch-1 decode, {args.tokens} greedy tokens, {gguf.name}, best of {args.rounds} rounds:\n")
    print("| system | tokens/s (each round) | ms / token | / llama.cpp |\n| --- | ---: | ---: | ---: |")
    for name, rate in best.items():
        ratio = f"{rate / reference:.2f}" if reference else "-"
        each = ", ".join(f"{r:.1f}" for r in rates[name])
        print(f"| {name} | {rate:.1f} ({each}) | {1e3 / rate:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
