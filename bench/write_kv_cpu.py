"""Storing a step's new K and V in the paged cache on the CPU, per layer call: the C++ kernel
(``kernels/cpu_kernels.cpp`` ``write_kv``, a row copy per token) against the torch reference
(``index_copy_`` twice), in the same run, on the default model's shapes (3 KV heads of 64).

    python -m bench.write_kv_cpu [--tokens 1,16,256] [--layers 30]
"""

import argparse
import time
from collections.abc import Callable

import torch

from kernels import cpu, reference

BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, HEADS = 4096, 16, 3, 64, 9


def per_call_us(write: Callable[..., None], args: tuple[torch.Tensor, ...], iters: int = 3000) -> float:
    for _ in range(200):
        write(*args)
    start = time.perf_counter()
    for _ in range(iters):
        write(*args)
    return (time.perf_counter() - start) / iters * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="1,16,256")
    p.add_argument("--layers", type=int, default=30)
    args = p.parse_args()
    if not cpu.available():
        raise SystemExit("the CPU kernels did not build")
    print(f"{'tokens':>6} {'reference us':>12} {'c++ us':>7} {'ratio':>6} {'saved ms/step':>13}")
    for tokens in map(int, args.tokens.split(",")):
        caches = [torch.zeros(BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM) for _ in range(2)]
        qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM)  # key and value: views, as the model's
        key, value = (qkv[:, (HEADS + i * KV_HEADS) * HEAD_DIM :][:, : KV_HEADS * HEAD_DIM] for i in (0, 1))
        views = [part.view(tokens, KV_HEADS, HEAD_DIM) for part in (key, value)]
        slots = torch.randperm(BLOCKS * BLOCK_SIZE)[:tokens]
        call = (*views, *caches, slots)
        ours, theirs = per_call_us(cpu.write_kv, call), per_call_us(reference.write_kv, call)
        saved = (theirs - ours) * args.layers / 1000
        print(f"{tokens:>6} {theirs:>12.1f} {ours:>7.1f} {theirs / ours:>5.1f}x {saved:>13.2f}")


if __name__ == "__main__":
    main()
