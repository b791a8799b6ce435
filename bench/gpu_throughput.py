"""GPU throughput of pagedq on a Llama-3.1-8B-shaped model with random weights, against transformers.

    python bench/gpu_throughput.py [--systems pagedq,hf-static-32,hf-static-64,hf-static-128,hf-continuous]
        [--model DIR] [--num-requests 1000] [--hf-requests N] [--tiny]

(a) offline: 1,000 requests, prompts of 512-1,536 random token ids, 64-192 new tokens each (seed 0,
    greedy, EOS ignored); useful output tokens per second.
(b) decode step time at batch 1, 64 and 256 with 1,024-token contexts (median engine step, sampling
    included), next to the bandwidth bound: (weight bytes + KV bytes read per step) / the device's
    copy bandwidth, measured with a large torch copy (bytes read + written per second).
(c) the same workload through transformers: static batches of 32, 64 and 128 left-padded requests,
    each run for its longest request's tokens, and its continuous batching manager where it runs.
    ``--hf-requests N`` gives them the workload's first N requests only (the requests' lengths are drawn
    independently, so N of them are a fair sample; the GPU runbook uses 256 to fit its time limit).
Targets: decode@256 <= 1.3x bound, decode@1 <= 1.5x bound, offline >= 5x the best static batch.

Weights are random (``load_format="dummy"`` for pagedq, transformers' own init for it), so only
speed is compared. Without ``--model`` the model directory is written to a temporary folder: the
Llama-3.1-8B config with a small byte-level tokenizer (token ids it does not know detokenize to
nothing). Each system runs in its own process. ``--tiny``: a tiny random Llama on the CPU, a dozen
requests; it checks that the script runs, its numbers mean nothing.
"""

import argparse
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MARK = "@@RESULT "
SEED = 0
HF_SYSTEMS = ("hf-static-32", "hf-static-64", "hf-static-128", "hf-continuous")
TARGETS = {"decode@256": 1.3, "decode@1": 1.5, "offline": 5.0}
PROFILED, PROFILE_ROWS = 2, 12  # decode steps profiled at the largest batch, and the ops reported
WARM_TOKENS = 3  # every request's first tokens, before decode steps are timed
LLAMA_31_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)


@dataclass(frozen=True)
class Sizes:
    """The workload's shape: full, or tiny for the CPU smoke run."""

    num_requests: int
    prompt: tuple[int, int]
    output: tuple[int, int]
    decode_batches: tuple[int, ...]
    decode_context: int
    decode_steps: int
    max_model_len: int


FULL = Sizes(1000, (512, 1536), (64, 192), (1, 64, 256), 1024, 16, 2048)
SMALL = Sizes(12, (16, 48), (4, 12), (1, 4, 8), 64, 4, 256)


def workload(sizes: Sizes, vocab: int) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(SEED)
    prompts = [
        [rng.randrange(vocab) for _ in range(rng.randint(*sizes.prompt))] for _ in range(sizes.num_requests)
    ]
    return prompts, [rng.randint(*sizes.output) for _ in prompts]


def write_model(path: Path, tiny: bool) -> Path:
    from transformers import LlamaConfig

    sys.path.insert(0, str(REPO))
    from tests.support.tiny_models import build_tokenizer

    tokenizer = build_tokenizer()
    shape = TINY | {"vocab_size": len(tokenizer)} if tiny else LLAMA_31_8B
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    LlamaConfig(**shape, **ids).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def device_and_dtype(tiny: bool) -> tuple[str, Any]:
    import torch

    if tiny and not torch.cuda.is_available():
        return "cpu", torch.float32
    return "cuda", torch.bfloat16


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --- pagedq: offline throughput and decode steps, in one process ---


def copy_bandwidth(device: str) -> float:
    """Bytes read + written per second by a large device-to-device copy."""
    import torch

    size = (2 << 30) if device == "cuda" else (64 << 20)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync()
    start, iters = time.perf_counter(), 10
    for _ in range(iters):
        dst.copy_(src)
    sync()
    return 2 * size * iters / (time.perf_counter() - start)


def run_pagedq(path: str, sizes: Sizes, args: argparse.Namespace) -> dict[str, Any]:
    from worker.engine import LLM, SamplingParams

    device, dtype = device_and_dtype(args.tiny)
    bandwidth = copy_bandwidth(device)
    llm = LLM(
        path,
        load_format="dummy",
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        max_model_len=sizes.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_bytes=(64 << 20) if device == "cpu" else None,
    )
    vocab = llm.engine.model_config.vocab_size
    prompts, max_tokens = workload(sizes, vocab)
    greedy = lambda m: SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)  # noqa: E731
    llm.generate(prompts[:2], greedy(4))  # warm-up
    sync()
    start = time.perf_counter()
    outs = llm.generate(prompts, [greedy(m) for m in max_tokens])
    wall = time.perf_counter() - start
    useful = sum(len(o.outputs[0].token_ids) for o in outs)
    result = {"offline_tok_s": useful / wall, "offline_wall_s": wall, "output_tokens": useful}
    result["requests"] = len(prompts)
    decode, profile = decode_steps(llm, sizes, bandwidth, greedy)
    result |= {"bandwidth_gb_s": bandwidth / 1e9, "decode": decode, "decode_profile": profile}
    return result


def decode_steps(
    llm: Any, sizes: Sizes, bandwidth: float, greedy: Any
) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """Median step time of ``decode_steps`` decode-only steps at each batch size, and the step's bandwidth
    bound; the profile of the largest batch's steps."""
    engine, rng = llm.engine, random.Random(SEED + 1)
    model = engine.runner.model
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if not model.config.tie_word_embeddings:  # a step reads only its tokens' embedding rows
        weights -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()
    kv_per_token = engine.model_config.kv_bytes_per_token(engine.runner.dtype)
    results: dict[str, dict[str, float]] = {}
    profile: dict[str, Any] = {}
    for batch in sizes.decode_batches:
        requests = [f"decode-{batch}-{i}" for i in range(batch)]
        # The prompts' prefill takes about this many steps (twice it: the decoding rows share each step's
        # budget), while the first prefilled already decode: each request gets tokens enough to be still
        # decoding when the last one starts.
        prefill_steps = 2 * -(-batch * sizes.decode_context // engine.config.max_num_batched_tokens)
        max_tokens = WARM_TOKENS + prefill_steps + sizes.decode_steps + 2 * PROFILED + 1
        for request in requests:
            ids = [rng.randrange(engine.model_config.vocab_size) for _ in range(sizes.decode_context)]
            engine.add_request(request, ids, greedy(max_tokens))
        produced: Counter[str] = Counter()
        while len(produced) < batch or min(produced.values()) < WARM_TOKENS:
            produced.update({d.request_id: len(d.outputs[0].token_ids) for d in engine.step()})
        times = [timed_decode_step(engine, batch) for _ in range(sizes.decode_steps)]
        if batch == max(sizes.decode_batches):
            profile = profile_steps(engine)
        for request in requests:
            engine.abort(request)
        while engine.has_unfinished_requests():
            engine.step()
        context = sizes.decode_context + WARM_TOKENS + sizes.decode_steps / 2
        bound = (weights + batch * context * kv_per_token) / bandwidth
        step = statistics.median(times)
        results[str(batch)] = {"step_ms": 1e3 * step, "bound_ms": 1e3 * bound, "ratio": step / bound}
    return results, profile


def timed_decode_step(engine: Any, batch: int) -> float:
    """One step's seconds; it must be a decode of every one of the ``batch`` requests (a prefill in the
    step, or a preemption, would time something else)."""
    start = time.perf_counter()
    outputs = engine.step()  # returns sampled ids to the host: the GPU is done when it returns
    seconds = time.perf_counter() - start
    decoded = sum(1 for d in outputs if len(d.outputs[0].token_ids) == 1)
    if decoded != batch:
        raise RuntimeError(f"a timed step at batch {batch} decoded {decoded} requests, not every one")
    return seconds


def profile_steps(engine: Any) -> dict[str, Any]:
    """Over PROFILED decode steps: each step's wall time and its ops' device time in all (the rest is
    the device waiting for the host), and the ops that took most time (device time first, then CPU):
    where a step that misses its bound goes, recorded for the next run to act on."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(PROFILED):
            engine.step()
        wall_ms = 1e3 * (time.perf_counter() - start) / PROFILED
    rows = [
        {
            "op": e.key[:60],
            "calls": e.count,
            "device_ms": getattr(e, "self_device_time_total", 0) / 1e3 / PROFILED,
            "cpu_ms": e.self_cpu_time_total / 1e3 / PROFILED,
        }
        for e in prof.key_averages()
    ]
    top = sorted(rows, key=lambda r: (r["device_ms"], r["cpu_ms"]), reverse=True)[:PROFILE_ROWS]
    device_ms = sum(r["device_ms"] for r in rows)
    return {"wall_ms": wall_ms, "device_ms": device_ms, "ops": top} | host_time(engine)


def host_time(engine: Any) -> dict[str, Any]:
    """Over PROFILED more decode steps under cProfile: the Python functions the host spent most of a step
    in (own time), so that a step the device waits for says which of its host parts to move or fuse."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.runcall(lambda: [engine.step() for _ in range(PROFILED)])
    wall_ms = 1e3 * (time.perf_counter() - start) / PROFILED
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = [
        {
            "function": f"{Path(file).name}:{line} {name}"[:70],
            "calls": calls // PROFILED,
            "own_ms": 1e3 * own / PROFILED,
            "cumulative_ms": 1e3 * cumulative / PROFILED,
        }
        for (file, line, name), (_, calls, own, cumulative, _) in stats.items()
    ]
    top = sorted(rows, key=lambda r: r["own_ms"], reverse=True)[:PROFILE_ROWS]
    return {"host_wall_ms": wall_ms, "host": top}


# --- transformers ---


def load_hf(path: str, tiny: bool) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    device, dtype = device_and_dtype(tiny)
    torch.manual_seed(SEED)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    model.generation_config.eos_token_id = None  # EOS ignored, like pagedq's ignore_eos
    return model.eval()


def hf_workload(sizes: Sizes, vocab: int, args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    prompts, max_tokens = workload(sizes, vocab)
    return prompts[: args.hf_requests], max_tokens[: args.hf_requests]


def run_hf_static(path: str, sizes: Sizes, args: argparse.Namespace, batch_size: int) -> dict[str, Any]:
    model = load_hf(path, args.tiny)
    prompts, max_tokens = hf_workload(sizes, model.config.vocab_size, args)
    hf_batch(model, prompts[:2], 4)  # warm-up
    sync()
    start, useful, generated = time.perf_counter(), 0, 0
    for i in range(0, len(prompts), batch_size):
        wanted = max_tokens[i : i + batch_size]
        hf_batch(model, prompts[i : i + batch_size], max(wanted))
        useful, generated = useful + sum(wanted), generated + len(wanted) * max(wanted)
    wall = time.perf_counter() - start
    result = {"offline_tok_s": useful / wall, "offline_wall_s": wall, "generated_tokens": generated}
    return result | {"requests": len(prompts)}


def hf_batch(model: Any, prompts: list[list[int]], max_new: int) -> None:
    import torch

    width, device = max(map(len, prompts)), model.device
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=0
        )
    if out.shape[1] - width != max_new:
        raise RuntimeError(f"generate stopped after {out.shape[1] - width} of {max_new} tokens")


def run_hf_continuous(path: str, sizes: Sizes, args: argparse.Namespace) -> dict[str, Any]:
    """transformers' continuous batching manager, each request with its own max_new_tokens. On the
    CPU its KV cache is sized to the workload (left alone it takes 90% of RAM); on a GPU it sizes
    itself to the free memory."""
    from transformers import ContinuousBatchingConfig, GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    from bench.engine_throughput import collect

    model = load_hf(path, args.tiny)
    prompts, max_tokens = hf_workload(sizes, model.config.vocab_size, args)
    page = 256
    pages = sum(-(-(len(p) + m) // page) for p, m in zip(prompts, max_tokens, strict=True))
    blocks = {"num_blocks": pages + 2} if model.device.type == "cpu" else {}
    # transformers 5.17 (the GPU image's) names the page size block_size; later versions page_size.
    accepted = inspect.signature(ContinuousBatchingConfig).parameters
    blocks[("page_size" if "page_size" in accepted else "block_size")] = page
    cb = ContinuousBatchingConfig(max_batch_tokens=args.max_num_batched_tokens, **blocks)
    config = GenerationConfig(max_new_tokens=max(max_tokens), do_sample=False, eos_token_id=-1)
    hints = WorkloadHints(max(map(len, prompts)), max(max_tokens), len(prompts))
    with model.continuous_batching_context_manager(
        generation_config=config, continuous_batching_config=cb, workload_hints=hints
    ) as cbm:
        collect(cbm, [cbm.add_request(prompts[0], "warm-up", max_new_tokens=4, eos_token_id=-1)])
        start = time.perf_counter()
        ids = [
            cbm.add_request(p, f"r{i}", max_new_tokens=m, eos_token_id=-1)
            for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))
        ]
        results = collect(cbm, ids)
        wall = time.perf_counter() - start
    useful = sum(min(len(results[i]), m) for i, m in zip(ids, max_tokens, strict=True))
    return {"offline_tok_s": useful / wall, "offline_wall_s": wall, "requests": len(prompts)}


# --- the orchestrating parent ---


def child_main(args: argparse.Namespace) -> None:
    sizes = sizes_for(args)
    result: dict[str, Any] = {"system": args.only}
    try:
        if args.only == "pagedq":
            result |= run_pagedq(args.model, sizes, args)
        elif args.only == "hf-continuous":
            result |= run_hf_continuous(args.model, sizes, args)
        else:
            result |= run_hf_static(args.model, sizes, args, int(args.only.rsplit("-", 1)[1]))
    except Exception as exc:  # recorded; the other systems still run
        result["error"] = f"{type(exc).__name__}: {exc}"[:500]
    print(MARK + json.dumps(result), flush=True)


def sizes_for(args: argparse.Namespace) -> Sizes:
    sizes = SMALL if args.tiny else FULL
    return (
        sizes if args.num_requests is None else Sizes(**{**sizes.__dict__, "num_requests": args.num_requests})
    )


def spawn(system: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--only", system, "--model", model]
    cmd += [
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
    ]
    cmd += ["--tiny"] * args.tiny + (["--num-requests", str(args.num_requests)] if args.num_requests else [])
    cmd += ["--hf-requests", str(args.hf_requests)] if args.hf_requests else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    return {"system": system, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"}


def report(results: list[dict[str, Any]]) -> str:
    lines = ["| system | requests | output tok/s | wall s | error |", "| --- | ---: | ---: | ---: | --- |"]
    for r in results:
        tok_s, wall = (f"{r[k]:.2f}" if k in r else "-" for k in ("offline_tok_s", "offline_wall_s"))
        requests, error = r.get("requests", "-"), r.get("error", "")
        lines.append(f"| {r['system']} | {requests} | {tok_s} | {wall} | {error} |")
    ours = next((r for r in results if r["system"] == "pagedq" and "error" not in r), None)
    if ours is None:
        return "\n".join(lines)
    lines += ["", f"copy bandwidth {ours['bandwidth_gb_s']:.0f} GB/s (read + write)", ""]
    lines += ["| decode batch | step ms | bound ms | step / bound |", "| ---: | ---: | ---: | ---: |"]
    lines += [
        f"| {b} | {d['step_ms']:.2f} | {d['bound_ms']:.2f} | {d['ratio']:.2f}x |"
        for b, d in ours["decode"].items()
    ]
    largest = max(map(int, ours["decode"]))
    if profile := ours.get("decode_profile"):
        lines += [
            "",
            f"Per decode step at batch {largest}, profiled: {profile['wall_ms']:.2f} ms of wall time, "
            f"{profile['device_ms']:.2f} ms of it the device's ops in all; the ops that took most time:",
            "",
            "| op | calls | device ms | CPU ms |",
            "| --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {r['op'].replace('|', '/')} | {r['calls']} | {r['device_ms']:.2f} | {r['cpu_ms']:.2f} |"
            for r in profile["ops"]
        ]
        lines += [
            "",
            f"The same steps under cProfile ({profile['host_wall_ms']:.2f} ms a step with its overhead): "
            "the host's functions by own time:",
            "",
            "| function | calls | own ms | cumulative ms |",
            "| --- | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {r['function'].replace('|', '/')} | {r['calls']} | {r['own_ms']:.2f} "
            f"| {r['cumulative_ms']:.2f} |"
            for r in profile["host"]
        ]
    return "\n".join([*lines, "", "Targets:", *targets(ours, results)])


def targets(ours: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    lines, decode = [], ours["decode"]
    for name, batch in (("decode@256", "256"), ("decode@1", "1")):
        if batch in decode:
            ratio = decode[batch]["ratio"]
            verdict = "PASS" if ratio <= TARGETS[name] else "MISS"
            lines.append(f"- {name}: {ratio:.2f}x the bandwidth bound, target <= {TARGETS[name]}x: {verdict}")
    static = [r for r in results if r["system"].startswith("hf-static") and "error" not in r]
    if static:
        best = max(static, key=lambda r: r["offline_tok_s"])
        ratio = ours["offline_tok_s"] / best["offline_tok_s"]
        verdict = "PASS" if ratio >= TARGETS["offline"] else "MISS"
        lines.append(f"- offline: {ratio:.2f}x {best['system']}, target >= {TARGETS['offline']}x: {verdict}")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=",".join(["pagedq", *HF_SYSTEMS]))
    p.add_argument("--model", help="a Hugging Face directory (config and tokenizer; weights are not read)")
    p.add_argument("--num-requests", type=int, help="default 1000 (12 with --tiny)")
    p.add_argument("--hf-requests", type=int, help="transformers runs the first N requests (default: all)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--tiny", action="store_true", help="a tiny random Llama on the CPU: a smoke run")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per system")
    p.add_argument("--only", help=argparse.SUPPRESS)  # internal: one system in this process
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    if args.only:
        sys.path.insert(0, str(REPO))
        child_main(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(write_model(Path(tmp) / "model", args.tiny))
        results = []
        for system in args.systems.split(","):
            print(f"running {system} ...", file=sys.stderr, flush=True)
            results.append(spawn(system, model, args))
    print(report(results))


if __name__ == "__main__":
    main()
