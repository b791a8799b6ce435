"""The host's share of an engine step: what a decode step of many rows costs besides the model.

    python -m bench.step_host [--batch 256] [--steps 40] [--generate-tokens 128] [--against DIR] [--rounds 2]

On a GPU the model's forward is one CUDA graph and the device waits while the host schedules, builds the
step's inputs, samples and turns sampled ids into outputs, row by row (bench/RESULTS-gpu.md: ~8 ms of a
29 ms step at batch 256). That host work is the same Python on any machine, so it is measured here on
the CPU with a tiny random Llama whose forward is cheap: each decode step's time split into the model's
forward, the sampler, and the rest (scheduling, inputs, outputs), in microseconds per row (medians: a
step the garbage collector stalls is an outlier there); then one ``LLM.generate`` of four times as many
prompts, in output tokens per second, where such stalls count, and the seconds its full collections took.

``--against DIR`` runs the same measurement on another checkout (e.g. ``git worktree add /tmp/base
main``), each side in its own process, alternated ``--rounds`` times, and prints each round's ratios:
host time per row (base / this) and generate's rate (this / base).
"""

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PARTS = ("forward", "sample", "host")


GENERATE_PROMPT = 16  # tokens of each prompt of the generate part


def measure(batch: int, steps: int, context: int, generate_tokens: int) -> dict[str, float]:
    """A tiny Llama's decode steps at ``batch`` rows (``decode_parts``), then its ``generate``."""
    from tests.support.tiny_models import make_tiny_model
    from worker.engine.llm import LLM

    with tempfile.TemporaryDirectory() as folder:
        path = make_tiny_model(Path(folder) / "model", "llama")
        llm = LLM(  # every prompt prefilled in the first step: the rest are all decodes
            str(path),
            max_num_seqs=batch,
            max_num_batched_tokens=batch * context,
            max_model_len=max(context + steps, GENERATE_PROMPT + generate_tokens) + 64,
            quantization="none",
        )
    return decode_parts(llm.engine, batch, steps, context) | generate(llm, batch, generate_tokens)


def decode_parts(engine: Any, batch: int, steps: int, context: int) -> dict[str, float]:
    """Median µs per row of each part of ``steps`` decode steps at ``batch`` rows of ``context`` tokens;
    the engine is left empty."""
    from contract.sampling import SamplingParams

    rng, spent = random.Random(0), {"forward": 0.0, "sample": 0.0}
    model = engine.runner.model
    model.forward = _timed(model.forward, spent, "forward")
    model.compute_logits = _timed(model.compute_logits, spent, "forward")
    engine.sampler = _timed(engine.sampler, spent, "sample")
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=steps + 8)
    for i in range(batch):
        engine.add_request(
            f"r{i}", [rng.randrange(3, engine.model_config.vocab_size) for _ in range(context)], params
        )
    while sum(1 for seq in engine.scheduler.running if seq.num_uncomputed_tokens == 1) < batch:
        engine.step()
    engine.step()  # the last prefill's first decode
    rows: dict[str, list[float]] = {part: [] for part in PARTS}
    for _ in range(steps):
        spent.update(forward=0.0, sample=0.0)
        start = time.perf_counter()
        outputs = engine.step()
        wall = time.perf_counter() - start
        if len(outputs) != batch:
            raise RuntimeError(f"a timed step returned {len(outputs)} outputs, not {batch}")
        parts = {"forward": spent["forward"], "sample": spent["sample"]}
        parts["host"] = wall - parts["forward"] - parts["sample"]
        for part, seconds in parts.items():
            rows[part].append(1e6 * seconds / batch)
    for request in list(engine.requests):
        engine.abort(request)
    while engine.has_unfinished_requests():
        engine.step()
    return {part: statistics.median(values) for part, values in rows.items()}


def generate(llm: Any, batch: int, tokens: int) -> dict[str, float]:
    """One ``LLM.generate`` of 4 x ``batch`` prompts x ``tokens`` tokens: output tokens per second (the steps
    and whatever the library does around them) and the seconds the garbage collector's full collections
    took within it (they stop the step that sets them off)."""
    rng, vocab = random.Random(1), llm.engine.model_config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(GENERATE_PROMPT)] for _ in range(4 * batch)]
    params = llm.sampling_params(temperature=0, ignore_eos=True, max_tokens=tokens)
    full, started = [0.0], [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif info["generation"] == 2:
            full[0] += time.perf_counter() - started[0]

    gc.callbacks.append(timed)
    try:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
    finally:
        gc.callbacks.remove(timed)
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"generate_tok_s": produced / seconds, "full_gc_s": full[0]}


def _timed(function: Callable[..., Any], spent: dict[str, float], part: str) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - start

    return timed


def measure_in(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    """``measure`` in a process of its own on the checkout at ``tree``."""
    command = [sys.executable, "-m", "bench.step_host", "--only", "--batch", str(args.batch)]
    command += ["--steps", str(args.steps), "--context", str(args.context)]
    command += ["--generate-tokens", str(args.generate_tokens)]
    env = os.environ | {"PYTHONPATH": str(tree)}
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measurement in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--context", type=int, default=64, help="prompt tokens of each row")
    p.add_argument("--generate-tokens", type=int, default=128, help="tokens of each generated prompt")
    p.add_argument("--against", type=Path, help="a base checkout to compare with")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", action="store_true", help=argparse.SUPPRESS)  # internal: print JSON
    args = p.parse_args()
    if args.only:
        print(json.dumps(measure(args.batch, args.steps, args.context, args.generate_tokens)))
        return
    sides = {"this": REPO} | ({"base": args.against.resolve()} if args.against else {})
    print(f"decode steps of {args.batch} rows, tiny Llama, µs per row (median of {args.steps} steps)")
    print("| round | side | forward | sample | host | generate tok/s | its full collections, s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for round_ in range(1, args.rounds + 1):
        results = {}
        for side, tree in sides.items() if round_ % 2 else reversed(sides.items()):
            results[side] = measure_in(tree, args)
            cells = " | ".join(
                f"{results[side][part]:.2f}" for part in (*PARTS, "generate_tok_s", "full_gc_s")
            )
            print(f"| {round_} | {side} | {cells} |", flush=True)
        if "base" in results:
            host = results["base"]["host"] / results["this"]["host"]
            rate = results["this"]["generate_tok_s"] / results["base"]["generate_tok_s"]
            print(
                f"round {round_}: host time per row base / this {host:.2f}x; generate this / base {rate:.2f}x"
            )


if __name__ == "__main__":
    main()
