"""The batch-invariant float32 linear (``kernels/cpu_kernels.cpp`` ``invariant_linear``, what the CPU
engine runs by default) against torch's ``F.linear`` (oneDNN/MKL, not batch-invariant), in the same run,
on the default model's layer shapes at the row counts of a decode step and a prefill chunk.

    python -m bench.invariant_linear_cpu [--rows 1,32,512] [--seconds 0.5]

Prints GFLOP/s of each and ours / torch's per shape, then a layer's four linears together (the time a
decoder layer spends in them, summed) per row count.
"""

import argparse
import time
from collections.abc import Callable

import torch

from kernels import cpu

# (name, in, out) of SmolLM2-135M's linears: hidden 576, 9 query and 3 KV heads of 64, intermediate 1536
LAYER = [("qkv_proj", 576, 960), ("o_proj", 576, 576), ("gate_up_proj", 576, 3072), ("down_proj", 1536, 576)]


def seconds_per_call(linear: Callable[[], torch.Tensor], budget: float) -> float:
    linear()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget or calls < 3:
        linear()
        calls += 1
    return elapsed / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,32,512")
    p.add_argument("--seconds", type=float, default=0.5, help="timed per kernel and shape")
    args = p.parse_args()
    if not cpu.available():
        raise SystemExit("the CPU kernels did not build")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'rows':>5} {'linear':>13} {'torch GFLOP/s':>13} {'ours GFLOP/s':>12} {'ours/torch':>10}")
    for rows in map(int, args.rows.split(",")):
        totals = [0.0, 0.0]
        for name, k, n in LAYER:
            x, w = torch.randn(rows, k), torch.randn(n, k)
            flop = 2 * rows * k * n
            theirs = seconds_per_call(lambda x=x, w=w: torch.nn.functional.linear(x, w), args.seconds)
            ours = seconds_per_call(lambda x=x, w=w: cpu.invariant_linear(x, w, None), args.seconds)
            totals[0] += theirs
            totals[1] += ours
            rates = f"{flop / theirs / 1e9:>13.1f} {flop / ours / 1e9:>12.1f}"
            print(f"{rows:>5} {name:>13} {rates} {theirs / ours:>9.2f}x")
        print(
            f"{rows:>5} {'a layer':>13} {totals[0] * 1e3:>11.3f}ms {totals[1] * 1e3:>10.3f}ms "
            f"{totals[0] / totals[1]:>9.2f}x"
        )


if __name__ == "__main__":
    main()
