"""A synthetic Llama of about 1.1B parameters (TinyLlama's shapes, random weights) written as a GGUF file,
decoded at batch 1 by pagedq (``quantization="gguf"``, each kernel path) and by llama.cpp's ``llama-bench``
on the same file, with each one's tokens/s and peak RSS: issue 29's comparison on a model whose weights,
not a step's fixed costs, set the pace.

    python -m bench.gguf_synthetic [--mix Q4_K_M,Q8_0] [--tokens 64] [--rounds 2] [--paths float,int8]

Mixes: ``Q4_K_M`` as llama.cpp's quantizer lays it out (Q4_K matrices, Q6_K for attn_v, ffn_down and
the tied embedding / output), ``Q8_0`` everywhere. The ``gguf`` package quantizes Q8_0 itself; the
K-quants are random blocks with sane scales (tests/support/gguf_files.py), valid weights of their
types. The file carries the default model's tokenizer and chat template, so both serve it alone; it is
written once into ``--dir`` (default ``~/.cache/pagedq/bench``, about 0.7 and 1.2 GB). Each system runs
in a process of its own (its RSS its own): llama-bench ``-p 0 -n TOKENS -r 1`` under ``/usr/bin/time``,
pagedq ``LLM.generate`` of TOKENS greedy tokens past EOS, its decode rate from the engine's token times.
The systems take turns, ``--rounds`` times, and each one's best round is compared.
"""

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.gguf_vs_llama_cpp import LLAMA_BENCH
from tests.support.gguf_files import encode, write_gguf
from worker.engine.default_model import ensure_default_model

SHAPES = {  # TinyLlama-1.1B's, with the default model's vocabulary (tied embedding)
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 64,
}
MIXES = {
    "Q4_K_M": {"default": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "token_embd": "Q6_K"},
    "Q8_0": {},
}


def matrices(config: dict) -> dict[str, tuple[int, int]]:
    """Every weight matrix of the model by its GGUF name, [rows, cols] as stored."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q, kv = (
        config["num_attention_heads"] * config["head_dim"],
        config["num_key_value_heads"] * config["head_dim"],
    )
    shapes = {"token_embd.weight": (config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        for name, shape in {
            "attn_q": (q, hidden),
            "attn_k": (kv, hidden),
            "attn_v": (kv, hidden),
            "attn_output": (hidden, q),
            "ffn_gate": (inter, hidden),
            "ffn_up": (inter, hidden),
            "ffn_down": (hidden, inter),
        }.items():
            shapes[f"blk.{i}.{name}.weight"] = shape
    return shapes


def write_model(path: Path, mix: str) -> Path:
    """The synthetic model as ``path`` (written once; a later run reuses it)."""
    if path.is_file():
        return path
    source = ensure_default_model()
    config = {**json.loads((source / "config.json").read_text()), **SHAPES, "tie_word_embeddings": True}
    rng = np.random.default_rng(0)
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    for name, (rows, cols) in matrices(config).items():
        role = name.split(".")[-2]
        type_name = MIXES[mix].get(role, MIXES[mix].get("default", mix))
        values = rng.standard_normal((rows, cols), dtype=np.float32) * 0.02 if type_name == "Q8_0" else None
        tensors[name] = (
            type_name,
            encode(values if values is not None else np.empty((rows, cols)), type_name, rng),
        )
    norms = ["output_norm.weight"] + [
        f"blk.{i}.{n}.weight" for i in range(config["num_hidden_layers"]) for n in ("attn_norm", "ffn_norm")
    ]
    tensors |= {name: ("F32", np.ones(config["hidden_size"], dtype=np.float32)) for name in norms}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp)
        for name in ("tokenizer.json", "chat_template.jinja"):
            shutil.copy(source / name, model / name)
        (model / "config.json").write_text(json.dumps(config))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(path.with_suffix(".partial"), tensors, model=model).rename(path)
    return path


def llama_cpp(path: Path, tokens: int, threads: int) -> tuple[float, float]:
    """(tokens/s, peak RSS MiB) of one llama-bench run."""
    args = [str(LLAMA_BENCH), "-m", str(path), "-t", str(threads), "-p", "0", "-n", str(tokens), "-r", "1"]
    out = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *args, "-o", "json"], capture_output=True, text=True, check=True
    )
    return float(json.loads(out.stdout)[0]["avg_ts"]), int(out.stderr.strip().splitlines()[-1]) / 1024


def pagedq(path: Path, kernel: str, tokens: int) -> tuple[float, float]:
    """(tokens/s, peak RSS MiB) of one pagedq process decoding ``tokens`` greedy tokens at batch 1."""
    cmd = [
        sys.executable,
        "-m",
        "bench.gguf_synthetic",
        "--only",
        kernel,
        "--file",
        str(path),
        "--tokens",
        str(tokens),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rate, rss = json.loads(out.stdout.strip().splitlines()[-1])
    return rate, rss


def only(path: Path, kernel: str, tokens: int) -> None:
    from worker.engine import LLM, SamplingParams

    llm = LLM(str(path), quantization="gguf", gguf_kernel=kernel, kv_cache_bytes=256 << 20)
    prompt = llm.chat_prompt([{"role": "user", "content": "Tell me about lighthouses."}])
    llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    out = llm.generate([prompt], SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))[0]
    stamps = out.metrics.token_times
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps([(tokens - 1) / (stamps[-1] - stamps[0]), rss]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mix", default="Q4_K_M,Q8_0")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--paths", default="float,int8", help="pagedq's gguf kernel paths")
    p.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "pagedq" / "bench")
    p.add_argument("--only", help=argparse.SUPPRESS)  # internal: one pagedq run in this process
    p.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.only:
        return only(args.file, args.only, args.tokens)
    for mix in args.mix.split(","):
        path = write_model(args.dir / f"synthetic-1b.{mix}.gguf", mix)
        systems = {
            f"llama.cpp (llama-bench, {args.threads} threads)": lambda p=path: llama_cpp(
                p, args.tokens, args.threads
            )
        }
        for kernel in args.paths.split(","):
            systems[f"pagedq gguf ({kernel} kernels)"] = lambda p=path, k=kernel: pagedq(p, k, args.tokens)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in systems}
        for _ in range(args.rounds):
            for name, run in systems.items():
                runs[name].append(run())
        size = path.stat().st_size / 2**20
        print(
            f"\n{path.name} ({size:.0f} MiB), batch-1 decode of {args.tokens} tokens, best of {args.rounds}:"
        )
        print(
            "\n| system | tokens/s (each round) | / llama.cpp | peak RSS MiB |\n| --- | ---: | ---: | ---: |"
        )
        reference = max(rate for rate, _ in next(iter(runs.values())))
        for name, results in runs.items():
            best = max(rate for rate, _ in results)
            each = ", ".join(f"{rate:.1f}" for rate, _ in results)
            rss = max(r for _, r in results)
            print(f"| {name} | {best:.1f} ({each}) | {best / reference:.2f} | {rss:.0f} |", flush=True)


if __name__ == "__main__":
    main()
