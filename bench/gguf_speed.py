"""The default model served from its Q4_1 GGUF file (``quantization="gguf"``) against the float32 path,
in one process, interleaved so that a shared machine's noise hits them all alike: the GGUF kernels'
float path (``gguf_kernel="float"``: weights de-quantized in registers, float32 FMAs) and their int8
path (activations quantized per 32 values, integer dot products), each beside float32.

    python -m bench.gguf_speed [--batches 1,16,64] [--context 256] [--iters 10] [--rows 1,16,128,512]

Two tables: one decode step of the whole model (``bench/decode_step_cpu.py``'s step: B sequences with
``--context`` tokens cached, one new token each, to the logits), and each of the model's linear shapes
alone (both quantized kernels vs float32 oneDNN on the same weights de-quantized) at ``--rows``
activation rows, the decode and prefill sizes. Both print min and median ms and the ratios of the mins
(float32 / float, float32 / int8: above 1 is the GGUF kernel faster), and the weights' bytes in memory.
llama.cpp is not run here: its setup (``bench/setup_llama_cpp.sh``) builds llama-server for
``bench/engine_throughput.py``.
"""

import argparse
import functools
import statistics

import torch
from torch import nn

from bench.decode_step_cpu import measure, pagedq_step
from worker.engine.default_model import ensure_default_gguf
from worker.engine.model.cpu_linears import OneDNNLinear
from worker.engine.model.gguf_layers import GGUFLinear, float_rows
from worker.engine.model.gguf_loader import load_gguf_model
from worker.engine.model.model_config import ModelConfig
from worker.engine.model.weights import describe

PATHS = ("float32", "float", "int8")
HEADER = "| float32 | gguf float | gguf int8 | float32 / float | float32 / int8 |"


def row(name: object, times: dict[str, list[float]]) -> str:
    best = {k: min(v) for k, v in times.items()}
    cells = [f"{best[k]:.2f} (med {statistics.median(v):.2f})" for k, v in times.items()]
    ratios = [f"{best['float32'] / best[k]:.2f}" for k in PATHS[1:]]
    return f"| {name} | {' | '.join(cells + ratios)} |"


def decode_steps(path, batches: list[int], context: int, iters: int) -> None:
    print("\nDecode step of the whole model, ms:\n")
    print(f"| batch {HEADER}\n| ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in batches:
        steps = {
            "float32": pagedq_step(path, batch, context, torch.float32),
            "float": pagedq_step(path, batch, context, torch.float32, "gguf", "float"),
            "int8": pagedq_step(path, batch, context, torch.float32, "gguf", "int8"),
        }
        print(row(batch, measure(steps, iters)), flush=True)


def linears(model: nn.Module) -> dict[str, GGUFLinear]:
    """One linear of each shape and type mix: the first layer's, and the vocabulary projection."""
    layer = model.layers[0]
    return {
        "qkv": layer.self_attn.qkv_proj,
        "o": layer.self_attn.o_proj,
        "gate_up": layer.mlp.gate_up_proj,
        "down": layer.mlp.down_proj,
        "lm_head": model.lm_head,
    }


def dense(linear: GGUFLinear) -> OneDNNLinear:
    weight = torch.cat([float_rows(part) for part in linear.parts])
    plain = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    plain.weight.data = weight
    return OneDNNLinear(plain)


@torch.inference_mode()
def linear_shapes(model: nn.Module, rows: list[int], iters: int) -> None:
    print("\nEach linear alone, ms:\n")
    print(f"| linear [N x K] types, rows {HEADER}\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, linear in linears(model).items():
        ref, k = dense(linear), linear.parts[0].shape[1]
        int8 = GGUFLinear(linear.parts, linear.bias, int8=True)
        n = sum(part.shape[0] for part in linear.parts)
        for m in rows:
            x = torch.randn(m, k)
            steps = {"float32": functools.partial(ref, x), "float": functools.partial(linear, x)}
            steps["int8"] = functools.partial(int8, x)
            times = measure(steps, iters)
            print(row(f"{name} [{n} x {k}] {'+'.join(linear.type_names)}, {m}", times), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--rows", default="1,16,128,512")
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    gguf = ensure_default_gguf()
    model = load_gguf_model(ModelConfig.from_pretrained(gguf.parent), args.context + 64, gguf)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, context {args.context}")
    weights = describe(model, "cpu")
    print(f"gguf: {weights.types} tensors, {weights.bytes / 2**20:.0f} MiB in all, {weights.kernels}")
    decode_steps(gguf.parent, [int(b) for b in args.batches.split(",")], args.context, args.iters)
    linear_shapes(model, [int(m) for m in args.rows.split(",")], args.iters)


if __name__ == "__main__":
    main()
