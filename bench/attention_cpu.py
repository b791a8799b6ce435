"""Micro-benchmark of the torch reference paged_attention on CPU, per layer call.

python -m bench.attention_cpu [--dtype bfloat16] [--decodes 64] [--context 300] [--prefill 512]
                              [--cached 4000]
"""

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

import kernels.metadata
from kernels import AttentionMetadata, paged_attention


def build(args: argparse.Namespace, query_lens: list[int], seq_lens: list[int]):
    """Metadata, caches and query for sequences scattered over a shuffled block pool."""
    bs = args.block_size
    counts = [-(-s // bs) for s in seq_lens]
    pool = torch.randperm(sum(counts) + 1)[: sum(counts)]
    tables = torch.zeros(len(seq_lens), max(counts), dtype=torch.int32)
    slots, used = [], 0
    for b, (q, s, c) in enumerate(zip(query_lens, seq_lens, counts, strict=True)):
        tables[b, :c] = pool[used : used + c]
        used += c
        slots += [int(tables[b, p // bs]) * bs + p % bs for p in range(s - q, s)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=tables,
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()]),
        seq_lens=torch.tensor(seq_lens),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
        block_size=bs,
        batch_invariant=args.batch_invariant,
    )
    dtype = getattr(torch, args.dtype)
    k_cache, v_cache = (
        torch.randn(sum(counts) + 1, bs, args.kv_heads, args.head_dim, dtype=dtype) for _ in range(2)
    )
    query = torch.randn(sum(query_lens), args.heads, args.head_dim, dtype=dtype)
    return meta, k_cache, v_cache, query


def time_ms(fn: Callable[[], object], iters: int) -> tuple[float, float]:
    """(min, median) ms per call; the min is the robust one on a shared machine."""
    warm_until = time.perf_counter() + 1.0  # a fresh process runs slow for a while (heap growth)
    while time.perf_counter() < warm_until:
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return min(times), statistics.median(times)


def run(args: argparse.Namespace, name: str, query_lens: list[int], seq_lens: list[int]) -> None:
    meta, k_cache, v_cache, query = build(args, query_lens, seq_lens)
    scale = args.head_dim**-0.5
    layer = time_ms(lambda: paged_attention(query, k_cache, v_cache, meta, scale), args.iters)

    def first_layer() -> None:  # a fresh step: plans and scratch buffers are rebuilt
        paged_attention(query, k_cache, v_cache, dataclasses.replace(meta), scale)

    first = time_ms(first_layer, args.iters)
    print(f"{name:<34} {layer[0]:8.3f} ({layer[1]:8.3f})   first layer {first[0]:8.3f} ({first[1]:8.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--decodes", type=int, default=64)
    parser.add_argument("--context", type=int, default=300, help="mean decode context; spread +-20%%")
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--cached", type=int, default=4000, help="a long prompt's context before its chunk")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--chunk-tokens", type=int, help="override kernels.metadata.DECODE_CHUNK_TOKENS")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument(
        "--batch-invariant", action="store_true", help="every row in place (the engine's CPU default)"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.chunk_tokens:
        kernels.metadata.DECODE_CHUNK_TOKENS = args.chunk_tokens
    lo, hi = int(0.8 * args.context), int(1.2 * args.context)
    contexts = torch.randint(lo, hi + 1, (args.decodes,)).tolist()
    print(
        "ms per paged_attention call, min (median); the first layer of a step also builds its plans\n"
        f"{args.dtype}, {torch.get_num_threads()} threads, {args.heads} heads / {args.kv_heads} kv heads "
        f"x {args.head_dim}, block {args.block_size}, "
        f"decode chunk {kernels.metadata.DECODE_CHUNK_TOKENS} tokens, batch invariant {args.batch_invariant}"
    )
    run(args, f"{args.decodes} decodes, context {lo}-{hi}", [1] * args.decodes, contexts)
    run(args, f"prefill {args.prefill}", [args.prefill], [args.prefill])
    run(args, f"prefill {args.prefill} after {args.prefill} cached", [args.prefill], [2 * args.prefill])
    deep = args.cached + args.prefill
    run(args, f"prefill {args.prefill} after {args.cached} cached", [args.prefill], [deep])
    run(args, "decodes + prefill, one batch", [1] * args.decodes + [args.prefill], [*contexts, args.prefill])


if __name__ == "__main__":
    main()
