"""The batch-invariant float32 linear (``kernels/cpu_kernels.cpp`` ``invariant_linear``, what the CPU
engine runs by default: on packed weights where AVX2 is the CPU's widest) against torch's ``F.linear``
(oneDNN/MKL, not batch-invariant), in the same run, on the default model's layer shapes at the row
counts of a decode step and a prefill chunk.

    python -m bench.invariant_linear_cpu [--rows 1,32,512] [--seconds 0.5] [--generate 1,16]

Prints GFLOP/s of each and ours / torch's per shape, then a layer's four linears together (the time a
decoder layer spends in them, summed) per row count. Where the weights are packed, the unpacked kernel
too, and with ``--generate`` the whole default model: ``LLM.generate`` of 64 greedy tokens at each batch
size with packed and with unpacked weights, interleaved, best of three (the same tokens from both).
"""

import argparse
import time
from collections.abc import Callable

import torch

from core.settings import Settings
from kernels import cpu
from worker.engine import LLM, SamplingParams
from worker.engine.default_model import resolve_model
from worker.engine.model.cpu_linears import InvariantLinear

# (name, in, out) of SmolLM2-135M's linears: hidden 576, 9 query and 3 KV heads of 64, intermediate 1536
LAYER = [("qkv_proj", 576, 960), ("o_proj", 576, 576), ("gate_up_proj", 576, 3072), ("down_proj", 1536, 576)]


def seconds_per_call(linear: Callable[[], torch.Tensor], budget: float) -> float:
    linear()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < budget or calls < 3:
        linear()
        calls += 1
    return elapsed / calls


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,32,512")
    p.add_argument("--seconds", type=float, default=0.5, help="timed per kernel and shape")
    p.add_argument("--generate", default="", help="batch sizes of the whole-model comparison, e.g. 1,16")
    args = p.parse_args()
    if not cpu.available():
        raise SystemExit("the CPU kernels did not build")
    torch.manual_seed(0)
    packs = torch.ops.pagedq_cpu.packs_invariant_linear()
    weights = "packed weights (the AVX2 kernel)" if packs else "weights as they are"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ours on {weights}")
    unpacked = f" {'unpacked GFLOP/s':>16} {'ours/unpacked':>13}" if packs else ""
    print(
        f"{'rows':>5} {'linear':>13} {'torch GFLOP/s':>13} {'ours GFLOP/s':>12} {'ours/torch':>10}{unpacked}"
    )
    for rows in map(int, args.rows.split(",")):
        totals = [0.0, 0.0, 0.0]
        for name, k, n in LAYER:
            x, linear = torch.randn(rows, k), torch.nn.Linear(k, n, bias=False)
            invariant, flop = InvariantLinear(linear), 2 * rows * k * n
            calls = [
                lambda x=x, linear=linear: linear(x),
                lambda x=x, invariant=invariant: invariant(x),
                lambda x=x, w=linear.weight: cpu.invariant_linear(x, w, None),
            ]
            times = [seconds_per_call(call, args.seconds) for call in calls[: 3 if packs else 2]]
            totals = [total + time for total, time in zip(totals, times, strict=False)]
            print(f"{rows:>5} {name:>13} " + columns(times, [flop / t / 1e9 for t in times], "13.1f"))
        print(
            f"{rows:>5} {'a layer':>13} "
            + columns(totals[: 3 if packs else 2], [t * 1e3 for t in totals], "11.3f", "ms")
        )
    if args.generate and packs:
        compare_generate([int(batch) for batch in args.generate.split(",")])
    elif args.generate:
        print("generate: this CPU's kernel reads the weights as they are; nothing packed to compare")


def compare_generate(batches: list[int], tokens: int = 64) -> None:
    """The default model with packed and with unpacked weights (``cpu.pack_invariant_linear`` declined)."""
    path = str(resolve_model(Settings().model))
    packed = LLM(path, device="cpu", dtype="float32")
    pack, cpu.pack_invariant_linear = cpu.pack_invariant_linear, lambda weight: None
    try:
        unpacked = LLM(path, device="cpu", dtype="float32")
    finally:
        cpu.pack_invariant_linear = pack
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for batch in batches:
        prompts = [f"Tell me about the number {i}." for i in range(batch)]
        best, outputs = {"packed": float("inf"), "unpacked": float("inf")}, {}
        for _ in range(3):
            for name, llm in (("packed", packed), ("unpacked", unpacked)):
                start = time.perf_counter()
                outputs[name] = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
                best[name] = min(best[name], time.perf_counter() - start)
        assert outputs["packed"] == outputs["unpacked"], "packed weights changed the tokens"
        rates = {name: batch * tokens / seconds for name, seconds in best.items()}
        print(
            f"generate, batch {batch}: packed {rates['packed']:.1f} tok/s, unpacked {rates['unpacked']:.1f} "
            f"tok/s, packed / unpacked {rates['packed'] / rates['unpacked']:.2f}x"
        )


def columns(times: list[float], values: list[float], spec: str, unit: str = "") -> str:
    """torch's and ours, ours / torch's; and where weights are packed, the unpacked kernel and ours / it."""
    text = f"{values[0]:>{spec}}{unit} {values[1]:>12.{spec[-2]}f}{unit} {times[0] / times[1]:>9.2f}x"
    if len(times) == 3:
        text += f" {values[2]:>16.{spec[-2]}f}{unit} {times[2] / times[1]:>12.2f}x"
    return text


if __name__ == "__main__":
    main()
