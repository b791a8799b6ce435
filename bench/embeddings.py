"""Embedding throughput: pagedq's engine offline (``LLM(kind="embed").embed``) against sentence-transformers
(``SentenceTransformer.encode``: its own length-sorted, padded batches of 32) and ONNX Runtime (what
fastembed runs) on an ONNX export of the same weights, on the same texts, with the same threads, in one
process, rounds interleaved so that a shared machine's noise hits every side alike.

    python -m bench.embeddings [--num 2000] [--threads 2] [--rounds 2] [--budgets 2048,8192]
                               [--peak-gflops GFLOPS]

The ONNX side exports the model's transformer once into a temporary directory (float32, no quantization,
dynamic batch and sequence axes; onnxruntime and onnx come with ``pip install -e .[bench]``), runs it in
an ``InferenceSession`` with ``--threads`` intra-op threads on length-sorted, padded batches of 32, and
pools as the model's ``modules.json`` says, with the engine's own pooling.

The texts are seeded, of 10-250 tokens each (uniform), mixed prose, code and non-English words. Every
side tokenizes inside the timed region. Prints texts/s, tokens/s (the tokens embedded) and GFLOP/s of
each (the encoder's matmuls, attention included) with its share of the float32 FMA peak of ``--threads``
cores (at the CPU's top clock, 32 flop/cycle/core with AVX2+FMA: 2 FMA units x 8 lanes x 2 flops;
``--peak-gflops`` overrides it), the best round of each, the ratios to sentence-transformers and to ONNX
Runtime, and the smallest cosine similarity of each reference against pagedq, which must be ~1.
"""

import argparse
import os
import random
import re
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from contract.pooling import Pooling
from contract.pooling_files import model_pooling
from worker.engine.pooling import finish, pool

VOCABULARY = """
the of and to in is that for it as was with be by on not he this are or his from at which but have an they you
were her all she there would their we him been has when who will more no if out so said what up its about into
than them can only other new some could time these two may then do first any my now such like river valley
mountain engine request batch token memory kernel cache block queue worker model vector embedding search
document chunk summary answer question pipeline throughput latency database server def return import class
self None True False lambda yield async await print len range dict list int Straße über Grüße naïve café
résumé año niño façade 東京 日本語 北京 Привет мир 🙂 🚀 ✅
"""
WORDS = VOCABULARY.split()


def make_texts(count: int, tokens_of: Callable[[str], int], seed: int = 0) -> list[str]:
    """``count`` texts whose token counts are spread uniformly over 10-250."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        target = rng.randint(10, 250)
        words = rng.choices(WORDS, k=max(1, int(target / 1.6)))
        text = " ".join(words)
        while tokens_of(text) < target:
            text += " " + " ".join(rng.choices(WORDS, k=8))
        texts.append(text)
    return texts


def flops_per_token(config: dict, mean_len: float) -> float:
    """Matmul FLOPs of one token through the encoder: the linears, and attention over ``mean_len`` keys."""
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    linears = 2 * (4 * hidden * hidden + 2 * hidden * inter)
    attention = 2 * 2 * mean_len * hidden
    return layers * (linears + attention)


def cpuinfo() -> str:
    path = Path("/proc/cpuinfo")
    return path.read_text() if path.exists() else ""


def clock_mhz() -> float | None:
    """The CPU's top clock: lscpu's ``CPU max MHz``, else the fastest core /proc/cpuinfo reports."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        lscpu = ""
    if found := re.search(r"^CPU max MHz:\s*([\d.]+)", lscpu, re.MULTILINE):
        return float(found[1])
    speeds = re.findall(r"^cpu MHz\s*:\s*([\d.]+)", cpuinfo(), re.MULTILINE)
    return max(map(float, speeds), default=None)


def fma_peak_gflops(cores: int) -> float | None:
    """float32 FMA peak of ``cores`` cores at the top clock: 2 FMA units x 8 lanes x 2 flops per cycle
    (AVX2+FMA); None without AVX2+FMA or a readable clock. AVX-512 is counted the same, as Zen 4 runs a
    512-bit FMA as two 256-bit halves; a core with two full 512-bit FMA units peaks at twice that: pass
    ``--peak-gflops`` there."""
    found = re.search(r"^flags\s*:(.*)$", cpuinfo(), re.MULTILINE)
    mhz = clock_mhz()
    if not found or not {"avx2", "fma"} <= set(found[1].split()) or mhz is None:
        return None
    return cores * mhz * 32 / 1e3


class OnnxEncoder:
    """ONNX Runtime on an ONNX export of a sentence-transformers model's transformer, batched as fastembed
    and sentence-transformers batch: texts sorted by length, padded batches, pooled as the model says."""

    def __init__(self, st, path: Path, threads: int, batch_size: int) -> None:
        import onnxruntime

        self.tokenizer, self.batch_size = st.tokenizer, batch_size
        self.pooling: Pooling = model_pooling(path)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        with tempfile.TemporaryDirectory() as directory:
            exported = export_onnx(st[0].auto_model, self.tokenizer, Path(directory) / "model.onnx")
            self.session = onnxruntime.InferenceSession(
                str(exported), options, providers=["CPUExecutionProvider"]
            )
        self.input_names = [i.name for i in self.session.get_inputs()]

    def encode(self, texts: list[str]) -> torch.Tensor:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # as sentence-transformers sorts
        vectors = torch.empty(len(texts), self.pooling.hidden_size)
        for start in range(0, len(texts), self.batch_size):
            rows = order[start : start + self.batch_size]
            vectors[rows] = self._batch([texts[i] for i in rows])
        return vectors

    def _batch(self, texts: list[str]) -> torch.Tensor:
        limit = self.pooling.max_seq_length
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=limit, return_tensors="np")
        (hidden,) = self.session.run(None, {name: batch[name] for name in self.input_names})
        mask = batch["attention_mask"].astype(bool)
        packed = torch.from_numpy(hidden[mask])  # the real tokens' states, input after input
        return finish(pool(packed, mask.sum(1).tolist(), self.pooling.mode), self.pooling.normalize, None)


class _LastHiddenState(torch.nn.Module):
    """The model's token states from positional inputs, named as the tokenizer names them."""

    def __init__(self, model: torch.nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs, strict=True))).last_hidden_state


def export_onnx(model: torch.nn.Module, tokenizer, where: Path) -> Path:
    """``model`` as float32 ONNX at ``where``, with dynamic batch and sequence axes."""
    # Padded, so that the trace keeps the attention mask (transformers drops an all-ones mask).
    example = tokenizer(["a padded example of a few words", "short"], padding=True, return_tensors="pt")
    names = list(example.keys())
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]}
    with warnings.catch_warnings():  # the legacy exporter's deprecation and tracer notes, expected here
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _LastHiddenState(model, names),
            tuple(example[name] for name in names),
            str(where),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,  # the TorchScript exporter: no onnxscript needed
        )
    return where


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--num", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budgets", default="2048,8192", help="pagedq's max_num_batched_tokens to try")
    parser.add_argument("--st-batch-size", type=int, default=32, help="sentence-transformers' and ORT's")
    parser.add_argument("--peak-gflops", type=float, help="the float32 FMA peak (default: from lscpu)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from sentence_transformers import SentenceTransformer

    from worker.engine import LLM
    from worker.engine.default_model import resolve_model

    path = resolve_model(args.model)
    st = SentenceTransformer(str(path), device="cpu")
    onnx = OnnxEncoder(st, path, args.threads, args.st_batch_size)
    engines = {
        f"pagedq (budget {budget})": LLM(str(path), kind="embed", device="cpu", max_num_batched_tokens=budget)
        for budget in map(int, args.budgets.split(","))
    }
    tokenizer = next(iter(engines.values())).tokenizer
    texts = make_texts(args.num, lambda text: len(tokenizer(text)["input_ids"]))
    next(iter(engines.values())).embed(texts[:50])  # warm-up
    st.encode(texts[:50], batch_size=args.st_batch_size)
    onnx.encode(texts[:50])
    outputs = next(iter(engines.values())).embed(texts)
    tokens = sum(o.num_tokens for o in outputs)
    ours = torch.tensor([o.embedding for o in outputs])
    references = {
        "sentence-transformers": st.encode(texts, batch_size=args.st_batch_size, convert_to_tensor=True),
        "ONNX Runtime": onnx.encode(texts),
    }
    cosines = {name: F.cosine_similarity(ours, v.float()).min().item() for name, v in references.items()}

    runs: dict[str, Callable[[], object]] = {
        "sentence-transformers": lambda: st.encode(texts, batch_size=args.st_batch_size),
        "ONNX Runtime": lambda: onnx.encode(texts),
    }
    runs |= {name: (lambda llm=llm: llm.embed(texts)) for name, llm in engines.items()}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.rounds):
        for name, run in runs.items():
            best[name] = min(best[name], timed(run))

    gflop = flops_per_token(st[0].auto_model.config.to_dict(), tokens / len(texts)) * tokens / 1e9
    cores = min(args.threads, len(os.sched_getaffinity(0)))
    peak = args.peak_gflops or fma_peak_gflops(cores)
    print(f"{len(texts)} texts, {tokens} tokens ({tokens / len(texts):.0f} per text), {args.threads} threads")
    source = "--peak-gflops" if args.peak_gflops else f"{cores} cores at {clock_mhz()} MHz"
    print(f"float32 FMA peak: {peak:.1f} GFLOP/s ({source})" if peak else "float32 FMA peak: unknown")
    report(best, len(texts), tokens, gflop, peak)
    for name, cosine in cosines.items():
        print(f"smallest cosine similarity pagedq vs {name}: {cosine:.7f}")


def report(best: dict[str, float], texts: int, tokens: int, gflop: float, peak: float | None) -> None:
    """One line per side: its rates, share of the FMA peak and ratios to the two references."""
    print(f"{'':28} {'texts/s':>9} {'tokens/s':>9} {'GFLOP/s':>8} {'% peak':>7} {'vs s-t':>7} {'vs ORT':>7}")
    for name, seconds in best.items():
        rates = f"{texts / seconds:9.1f} {tokens / seconds:9.0f} {gflop / seconds:8.1f}"
        share = f"{100 * gflop / seconds / peak:6.1f}%" if peak else f"{'-':>7}"
        ratios = f"{best['sentence-transformers'] / seconds:6.2f}x {best['ONNX Runtime'] / seconds:6.2f}x"
        print(f"{name:28} {rates} {share} {ratios}")


if __name__ == "__main__":
    main()
