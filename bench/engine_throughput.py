"""End-to-end throughput of pagedq against transformers baselines, on fixed, seeded workloads.

    python bench/engine_throughput.py [--workloads A,B,C] [--baselines hf-sequential,hf-static-16,...]
        [--num-prompts N] [--scale 0.1] [--model DIR] [--append-results]

Workloads (greedy, EOS ignored, seed 0; chat prompts over user messages of random vocabulary words):
  A  64 prompts of 20-200 tokens, max_tokens drawn from 16-256 per request (the pipeline case)
  B  the same prompts, exactly 128 new tokens each (static batching's best case)
  C  200 documents of 20-60 tokens behind one shared ~500-token instruction, 32 new tokens each;
     pagedq with prefix caching on vs off
Throughput counts useful tokens only: what each request asked for, never padding rows or tokens a
static batch generates past a request's own max_tokens. Every (system, workload) pair runs in its own
subprocess (this script with --only SYSTEM), so peak RSS and warm-up are per system; model loading and
one short warm-up request are not timed.
"""

import argparse
import hashlib
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "RESULTS.md"
RESULTS_HEADER = (
    "# Benchmark results\n\nAppended by `python bench/engine_throughput.py --append-results`; "
    "see that script's docstring for the workloads. Newest last.\n"
)
MARK = "@@RESULT "
SEED = 0
HF_BASELINES = ("hf-sequential", "hf-static-16", "hf-static-64", "hf-continuous")
# Not run by default: pagedq with the torch reference kernels, transformers in bfloat16, and llama.cpp
# on the default model's own Q4_1 GGUF (after bench/setup_llama_cpp.sh).
OTHER_BASELINES = (
    "pagedq-torch",
    "pagedq-fp16",
    "pagedq-gguf",
    "pagedq-gguf-int8",
    "hf-static-16-bf16",
    "hf-static-64-bf16",
    "llama-server",
)
LLAMA_DIR = (
    REPO / "bench" / ".llama.cpp"
)  # bench/setup_llama_cpp.sh builds llama-server and fetches the GGUF here
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGETS = {"A": 3.0, "B": 1.5, "C": 3.0}
SHORT_SYSTEM = "Be brief."
C_SYSTEM = "You are a meticulous analyst who writes careful, faithful summaries. Style guide keywords:"
C_PREAMBLE = "Follow the instructions above. Summarise the document below in one sentence.\n\nDocument:"
C_PREFIX_TOKENS = 500


# --- workloads (built identically in every subprocess from the seed) ---


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    max_tokens: list[int]
    shared_prefix: int = 0

    def summary(self) -> dict[str, Any]:
        lengths = [len(p) for p in self.prompts]
        digest = hashlib.sha1(json.dumps([self.prompts, self.max_tokens]).encode()).hexdigest()[:12]
        return {
            "num_prompts": len(self.prompts),
            "prompt_tokens": [min(lengths), max(lengths), round(sum(lengths) / len(lengths))],
            "max_tokens": [min(self.max_tokens), max(self.max_tokens)],
            "useful_tokens": sum(self.max_tokens),
            "shared_prefix": self.shared_prefix,
            "fingerprint": digest,
        }


def scaled(value: int, scale: float, floor: int = 2) -> int:
    return max(floor, round(value * scale))


def vocab_words(tokenizer: Any) -> list[str]:
    """Lower-case alphabetic single-token words of the vocabulary, in a fixed order."""
    words = {t[1:] for t in tokenizer.get_vocab() if t.startswith("Ġ") and t[1:].isalpha()}
    return sorted(w for w in words if w.islower() and 3 <= len(w) <= 10)


def chat_ids(tokenizer: Any, system: str, user: str) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def fit(render: Callable[[list[str]], list[int]], pool: list[str], target: int) -> int:
    """How many of ``pool``'s first words ``render`` takes within ``target`` tokens (binary search)."""
    lo, hi = 0, len(pool)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(render(pool[:mid])) <= target else (lo, mid - 1)
    return lo


def build_workload(name: str, tokenizer: Any, num_prompts: int | None, scale: float) -> Workload:
    rng, words = random.Random(SEED), vocab_words(tokenizer)
    if name == "C":
        return build_prefix_workload(tokenizer, rng, words, scaled(num_prompts or 200, scale), scale)

    def render(ws: list[str]) -> list[int]:
        return chat_ids(tokenizer, SHORT_SYSTEM, " ".join(ws))

    n, prompts = scaled(num_prompts or 64, scale), []
    for _ in range(n):
        target = rng.randint(20, 200)
        pool = [rng.choice(words) for _ in range(target)]
        prompts.append(render(pool[: fit(render, pool, target)]))
    if name == "A":
        return Workload(name, prompts, [scaled(rng.randint(16, 256), scale) for _ in range(n)])
    if name == "B":
        return Workload(name, prompts, [scaled(128, scale)] * n)
    raise ValueError(f"unknown workload {name!r}")


def build_prefix_workload(tok: Any, rng: random.Random, words: list[str], n: int, scale: float) -> Workload:
    """One shared ~500-token system + user preamble, then a short document per prompt."""
    pool = [rng.choice(words) for _ in range(C_PREFIX_TOKENS)]

    def instruction(ws: list[str]) -> str:
        return f"{C_SYSTEM} {' '.join(ws)}."

    system = instruction(
        pool[: fit(lambda ws: chat_ids(tok, instruction(ws), C_PREAMBLE), pool, C_PREFIX_TOKENS)]
    )

    def render(ws: list[str]) -> list[int]:
        return chat_ids(tok, system, f"{C_PREAMBLE} {' '.join(ws)}")

    base, prompts = len(render([])), []
    for _ in range(n):
        doc = [rng.choice(words) for _ in range(rng.randint(20, 60))]
        prompts.append(render(doc[: fit(render, doc, base + len(doc))]))
    shared = next((i for i, col in enumerate(zip(*prompts, strict=False)) if len(set(col)) > 1), 0)
    return Workload("C", prompts, [scaled(32, scale)] * n, shared_prefix=shared)


# --- timing, and how busy the rest of the machine was meanwhile ---


def busy_cpu_s() -> float:
    """CPU seconds spent by the whole machine (all processes, all cores) since boot, idle excluded."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class Timer:
    """Wall time of a block, and ``foreign``: the cores that other processes kept busy during it."""

    def __enter__(self) -> "Timer":
        self.start, self.busy, self.own = time.perf_counter(), busy_cpu_s(), own_cpu_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.start
        foreign = (busy_cpu_s() - self.busy) - (own_cpu_s() - self.own)
        self.foreign = max(0.0, foreign) / self.wall


def wait_quiet(max_s: float, threshold: float = 0.3) -> float:
    """Wait (at most ``max_s``) until the machine's busy cores over 3 s fall below ``threshold``."""
    deadline, busy = time.monotonic() + max_s, 0.0
    while True:
        before = busy_cpu_s()
        time.sleep(3)
        busy = (busy_cpu_s() - before) / 3
        if busy < threshold or time.monotonic() > deadline:
            return busy


# --- systems (each runs in its own subprocess) ---


@dataclass
class Run:
    tokens: list[list[int]]  # per request, the useful tokens (at most its max_tokens)
    generated: int  # tokens the system computed, padding rows and overshoot included
    wall_s: float
    foreign_cores: float  # other processes' CPU use during the timed part, in cores
    notes: dict[str, Any] = field(default_factory=dict)


def run_pagedq(
    path: str,
    w: Workload,
    args: argparse.Namespace,
    prefix_caching: bool,
    backend: str | None = None,
    quantization: str = "none",
    gguf_kernel: str = "float",
) -> Run:
    from kernels import dispatch
    from worker.engine import LLM, SamplingParams

    os.environ[dispatch.BACKEND_ENV] = backend or args.backend

    llm = LLM(
        path,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=prefix_caching,
        kv_cache_bytes=int(args.kv_cache_gib * 2**30) if args.kv_cache_gib else None,
        quantization=quantization,
        gguf_kernel=gguf_kernel,
    )
    greedy = lambda m: SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)  # noqa: E731
    llm.generate([llm.chat_prompt([{"role": "user", "content": "Warm up."}])], greedy(4))
    before = llm.engine.stats().num_preemptions
    with Timer() as timer:
        outs = llm.generate(w.prompts, [greedy(m) for m in w.max_tokens], use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outs]
    notes = {
        "kernels": llm.engine.runner.kernel_backend,
        "preemptions": llm.engine.stats().num_preemptions - before,
        "cached_prompt_tokens": sum(o.num_cached_tokens for o in outs),
    }
    useful = [t[:m] for t, m in zip(tokens, w.max_tokens, strict=True)]
    return Run(useful, sum(map(len, tokens)), timer.wall, timer.foreign, notes)


def load_hf(path: str, dtype: str = "float32") -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None  # EOS ignored, like pagedq's ignore_eos
    return model


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def hf_generate(model: Any, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """One left-padded static batch, greedy, run for exactly ``max_new`` tokens per row."""
    import torch

    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    ids, mask = left_pad(prompts, pad_id)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=pad_id
        )
    new = out[:, ids.shape[1] :]
    if new.shape[1] != max_new:
        raise RuntimeError(f"generate stopped after {new.shape[1]} of {max_new} tokens")
    return new.tolist()


def run_hf_static(path: str, w: Workload, batch_size: int, dtype: str = "float32") -> Run:
    model = load_hf(path, dtype)
    hf_generate(model, w.prompts[:2] if batch_size > 1 else w.prompts[:1], 4)  # warm-up
    tokens, generated = [], 0
    with Timer() as timer:
        for i in range(0, len(w.prompts), batch_size):
            wanted = w.max_tokens[i : i + batch_size]
            rows = hf_generate(model, w.prompts[i : i + batch_size], max(wanted))
            tokens += [row[:m] for row, m in zip(rows, wanted, strict=True)]
            generated += len(rows) * max(wanted)
    return Run(tokens, generated, timer.wall, timer.foreign)


def run_hf_continuous(path: str, w: Workload, args: argparse.Namespace) -> Run:
    """transformers' continuous batching manager, with each request's own max_new_tokens.

    Its KV cache is sized to hold the whole workload at once (left alone it sizes itself to 90% of RAM,
    and its attention masks grow with the cache); its token budget per step is ``--hf-batch-tokens``.
    """
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    model = load_hf(path)
    page = 256
    pages = sum(-(-(len(p) + m) // page) for p, m in zip(w.prompts, w.max_tokens, strict=True))
    cb = ContinuousBatchingConfig(page_size=page, num_blocks=pages + 2, max_batch_tokens=args.hf_batch_tokens)
    config = GenerationConfig(max_new_tokens=max(w.max_tokens), do_sample=False, eos_token_id=-1)
    hints = WorkloadHints(max(map(len, w.prompts)), max(w.max_tokens), len(w.prompts))
    with model.continuous_batching_context_manager(
        generation_config=config, continuous_batching_config=cb, workload_hints=hints
    ) as manager:
        collect(manager, [manager.add_request(w.prompts[0], "warm-up", max_new_tokens=4, eos_token_id=-1)])
        with Timer() as timer:
            ids = [
                manager.add_request(p, f"r{i}", max_new_tokens=m, eos_token_id=-1)
                for i, (p, m) in enumerate(zip(w.prompts, w.max_tokens, strict=True))
            ]
            results = collect(manager, ids)
    tokens = [results[i] for i in ids]
    useful = [t[:m] for t, m in zip(tokens, w.max_tokens, strict=True)]
    notes = {"per-request max_tokens": "yes", "max_batch_tokens": args.hf_batch_tokens}
    return Run(useful, sum(map(len, tokens)), timer.wall, timer.foreign, notes)


def run_llama_server(w: Workload, args: argparse.Namespace) -> Run:
    """llama.cpp's server with continuous batching over ``--llama-slots`` slots, on the Q4_1 GGUF that the
    default model is built from (``bench/setup_llama_cpp.sh`` puts both in ``LLAMA_DIR``), a thread per
    core; every prompt sent at once as token ids,
    greedy, EOS ignored. Its tokenizer is the GGUF's own (the same vocabulary)."""
    ctx = args.llama_slots * (max(map(len, w.prompts)) + max(w.max_tokens) + 16)
    port = 18080 + os.getpid() % 1000
    cmd = [
        str(LLAMA_DIR / "build" / "bin" / "llama-server"),
        "-m",
        str(LLAMA_DIR / GGUF),
        "-np",
        str(args.llama_slots),
        "-c",
        str(ctx),
    ]
    cmd += ["-t", str(os.cpu_count()), "--port", str(port), "--cont-batching"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", timeout=120)
        complete = lambda p, m: llama_complete(url, p, m)  # noqa: E731
        complete(w.prompts[0], 4)  # warm-up
        with Timer() as timer, ThreadPoolExecutor(len(w.prompts)) as pool:
            tokens = list(pool.map(complete, w.prompts, w.max_tokens))
    finally:
        server.terminate()
        server.wait(30)
    return Run(tokens, sum(map(len, tokens)), timer.wall, timer.foreign, {"slots": args.llama_slots})


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def llama_complete(url: str, prompt: list[int], max_tokens: int) -> list[int]:
    body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "ignore_eos": True}
    body |= {"cache_prompt": False, "return_tokens": True}
    request = urllib.request.Request(
        url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=3600) as response:
        return json.load(response)["tokens"]


def collect(manager: Any, request_ids: list[str]) -> dict[str, list[int]]:
    """Wait for every request of ``request_ids``; their generated tokens by id."""
    results: dict[str, list[int]] = {}
    while len(results) < len(request_ids):
        out = manager.get_result(timeout=1)
        if out is None and not manager.is_running():
            raise RuntimeError("transformers' continuous batching thread died")
        if out is not None and out.is_finished():
            if out.error is not None:
                raise RuntimeError(f"request {out.request_id}: {out.error}")
            results[out.request_id] = list(out.generated_tokens)
    return results


def run_system(system: str, path: str, w: Workload, args: argparse.Namespace) -> Run:
    runners: dict[str, Callable[[], Run]] = {
        "pagedq": lambda: run_pagedq(path, w, args, prefix_caching=True),
        "pagedq-noprefix": lambda: run_pagedq(path, w, args, prefix_caching=False),
        "hf-sequential": lambda: run_hf_static(path, w, 1),
        "hf-static-16": lambda: run_hf_static(path, w, 16),
        "hf-static-64": lambda: run_hf_static(path, w, 64),
        "hf-static-16-bf16": lambda: run_hf_static(path, w, 16, "bfloat16"),
        "hf-static-64-bf16": lambda: run_hf_static(path, w, 64, "bfloat16"),
        "hf-continuous": lambda: run_hf_continuous(path, w, args),
        "pagedq-torch": lambda: run_pagedq(path, w, args, prefix_caching=True, backend="torch"),
        "pagedq-fp16": lambda: run_pagedq(path, w, args, prefix_caching=True, quantization="fp16"),
        "pagedq-gguf": lambda: run_pagedq(path, w, args, prefix_caching=True, quantization="gguf"),
        "pagedq-gguf-int8": lambda: run_pagedq(path, w, args, True, quantization="gguf", gguf_kernel="int8"),
        "llama-server": lambda: run_llama_server(w, args),
    }
    return runners[system]()


def child_main(args: argparse.Namespace) -> None:
    """``--only SYSTEM``: run one system on one workload, print one JSON line."""
    from transformers import AutoTokenizer

    from worker.engine.default_model import resolve_model

    path = str(resolve_model(args.model))
    tokenizer = AutoTokenizer.from_pretrained(path)
    workload = build_workload(args.workloads, tokenizer, args.num_prompts, args.scale)
    result: dict[str, Any] = {"system": args.only, "workload": workload.summary()}
    try:
        run = run_system(args.only, path, workload, args)
        result |= asdict(run)
    except Exception as exc:  # recorded, the other systems still run
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(MARK + json.dumps(result), flush=True)


# --- the orchestrating parent ---


def measure(system: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run ``system`` on ``workload``; rerun (up to ``--retries``) while other processes disturbed it,
    unless the disturbed run took over ``--retry-max-s`` (the noise column then flags it)."""
    result: dict[str, Any] = {}
    for attempt in range(args.retries + 1):
        busy = wait_quiet(args.wait_quiet) if args.wait_quiet else 0.0
        print(f"  {workload} {system}: attempt {attempt + 1}, machine busy {busy:.2f} cores", file=sys.stderr)
        result = spawn(system, workload, args)
        if result.get("foreign_cores", 0.0) <= args.max_noise or result["wall_s"] > args.retry_max_s:
            break
        print(f"  noisy ({result['foreign_cores']:.2f} other cores busy)", file=sys.stderr)
    if "foreign_cores" in result:
        result["tok_per_s"] = round(tok_per_s(result), 1)
        print(f"  -> {result['tok_per_s']} useful tok/s in {result['wall_s']:.1f} s", file=sys.stderr)
    return result


def spawn(system: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--only", system, "--workloads", workload]
    cmd += child_flags(args)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"system": system, "error": f"timed out after {args.timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    return {"system": system, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-500:]}"}


def child_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--scale", str(args.scale), "--model", args.model, "--max-num-seqs", str(args.max_num_seqs)]
    flags += [
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--hf-batch-tokens",
        str(args.hf_batch_tokens),
    ]
    flags += ["--backend", args.backend, "--llama-slots", str(args.llama_slots)]
    if args.num_prompts:
        flags += ["--num-prompts", str(args.num_prompts)]
    if args.kv_cache_gib:
        flags += ["--kv-cache-gib", str(args.kv_cache_gib)]
    return flags


def systems_for(workload: str, baselines: list[str]) -> list[str]:
    return ["pagedq", "pagedq-noprefix"] if workload == "C" else ["pagedq", *baselines]


def tok_per_s(result: dict[str, Any]) -> float:
    return sum(map(len, result["tokens"])) / result["wall_s"]


def same_as(result: dict[str, Any], ref: dict[str, Any]) -> str:
    """Identical outputs, and the mean number of leading tokens each output shares with pagedq's."""
    pairs = list(zip(result["tokens"], ref["tokens"], strict=True))
    common = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        for a, b in pairs
    ]
    return f"{sum(a == b for a, b in pairs)}/{len(pairs)}, prefix {sum(common) / len(common):.1f}"


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| system | useful tok/s | wall s | useful tok | generated tok | pagedq / system | peak RSS MiB "
        "| same tokens as pagedq (mean common prefix) | other procs (cores) | notes |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    return lines + [row(r, results[0]) for r in results]


def row(r: dict[str, Any], ref: dict[str, Any]) -> str:
    rss = f"{r['peak_rss_mib']:.0f}" if "peak_rss_mib" in r else "-"
    if "error" in r:
        return f"| {r['system']} | - | - | - | - | - | {rss} | - | - | {r['error']} |"
    ok = "error" not in ref
    ratio = f"{tok_per_s(ref) / tok_per_s(r):.2f}x" if ok else "-"
    same = same_as(r, ref) if ok else "-"
    notes = ", ".join(f"{k} {v}" for k, v in r["notes"].items())
    return (
        f"| {r['system']} | {tok_per_s(r):.1f} | {r['wall_s']:.1f} | {sum(map(len, r['tokens']))} "
        f"| {r['generated']} | {ratio} | {rss} | {same} | {r['foreign_cores']:.2f} | {notes} |"
    )


def describe(name: str, results: list[dict[str, Any]]) -> str:
    s = next((r["workload"] for r in results if "workload" in r), None)
    if s is None:
        return f"### Workload {name}"
    lo, hi, mean = s["prompt_tokens"]
    text = (
        f"### Workload {name}: {s['num_prompts']} prompts of {lo}-{hi} tokens (mean {mean}), "
        f"max_tokens {s['max_tokens'][0]}-{s['max_tokens'][1]}, {s['useful_tokens']} useful tokens"
    )
    if s["shared_prefix"]:
        text += f", {s['shared_prefix']}-token shared prefix"
    prints = {r["workload"]["fingerprint"] for r in results if "workload" in r}
    return text + ("" if len(prints) == 1 else " (WARNING: systems saw different workloads)")


def target_line(name: str, results: list[dict[str, Any]]) -> str:
    ok = [r for r in results if "error" not in r]
    ref = next((r for r in ok if r["system"] == "pagedq"), None)
    others = [r for r in ok if not r["system"].startswith("pagedq")]
    what = "prefix caching on / off" if name == "C" else "pagedq / best transformers mode"
    if ref is None or not others:
        return f"- target {name}: {what} >= {TARGETS[name]}x: n/a (nothing to compare)"
    best = max(others, key=tok_per_s)
    ratio = tok_per_s(ref) / tok_per_s(best)
    verdict = "PASS" if ratio >= TARGETS[name] else "MISS"
    return f"- target {name}: {what} ({best['system']}) = {ratio:.2f}x, target >= {TARGETS[name]}x: {verdict}"


def machine() -> str:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return (
        f"nproc {nproc}, {cpu}, python {platform.python_version()}, torch {version('torch')}, "
        f"transformers {version('transformers')}"
    )


def report(args: argparse.Namespace, sections: dict[str, list[dict[str, Any]]], total_s: float) -> str:
    kv = f"{args.kv_cache_gib} GiB" if args.kv_cache_gib else "engine default"
    head = [
        f"## {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "",
        f"- command: `python bench/engine_throughput.py {' '.join(sys.argv[1:])}`",
        f"- machine: {machine()}",
        f"- pagedq: max_num_seqs {args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}, "
        f"KV cache {kv}; hf-continuous: max_batch_tokens {args.hf_batch_tokens}, KV cache sized to the "
        f"workload; float32 everywhere; whole run {total_s / 60:.1f} min",
        "- other procs: cores kept busy by other processes during the timed part (noise; ~0 is clean)",
    ]
    body = []
    for name, results in sections.items():
        body += ["", describe(name, results), "", *table(results)]
    targets = ["", "Targets:", "", *(target_line(name, results) for name, results in sections.items())]
    return "\n".join(head + body + targets) + "\n"


def append_results(text: str) -> None:
    if not RESULTS.exists():
        RESULTS.write_text(RESULTS_HEADER)
    with RESULTS.open("a") as f:
        f.write("\n" + text)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="A,B,C", help="comma-separated subset of A,B,C")
    p.add_argument("--baselines", default=",".join(HF_BASELINES), help="comma-separated, or 'none'")
    p.add_argument("--num-prompts", type=int, help="prompts per workload (default: A and B 64, C 200)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies prompt counts and new tokens")
    p.add_argument("--model", default="smollm2-135m-instruct", help="alias or Hugging Face directory")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096)
    p.add_argument("--kv-cache-gib", type=float, help="pagedq's KV pool (default: the engine's own)")
    p.add_argument("--hf-batch-tokens", type=int, default=4096, help="hf-continuous's max_batch_tokens")
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "torch", "cpu"],
        help="pagedq's kernels (pagedq-torch: torch)",
    )
    p.add_argument("--llama-slots", type=int, default=16, help="llama-server's parallel slots (-np)")
    p.add_argument(
        "--wait-quiet", type=float, default=60, help="wait up to S seconds for an idle machine per system"
    )
    p.add_argument("--max-noise", type=float, default=0.25, help="rerun above this many busy foreign cores")
    p.add_argument("--retries", type=int, default=1, help="reruns of a system disturbed by other processes")
    p.add_argument("--retry-max-s", type=float, default=150, help="never rerun a system that took longer")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per system and workload")
    p.add_argument("--append-results", action="store_true", help=f"append a section to {RESULTS.name}")
    p.add_argument("--only", help=argparse.SUPPRESS)  # internal: one system in this process
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.only:
        sys.path.insert(0, str(REPO))
        child_main(args)
        return
    baselines = [] if args.baselines == "none" else [b for b in args.baselines.split(",") if b]
    known = HF_BASELINES + OTHER_BASELINES
    unknown = set(baselines) - set(known)
    if unknown:
        raise SystemExit(f"unknown baselines {sorted(unknown)}; choose from {', '.join(known)}")
    start, sections = time.perf_counter(), {}
    for name in args.workloads.split(","):
        if name not in TARGETS:
            raise SystemExit(f"unknown workload {name!r}; choose from A, B, C")
        sections[name] = [measure(system, name, args) for system in systems_for(name, baselines)]
    text = report(args, sections, time.perf_counter() - start)
    print(text)
    if args.append_results:
        append_results(text)
        print(f"appended to {RESULTS}", file=sys.stderr)


if __name__ == "__main__":
    main()
