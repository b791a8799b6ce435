"""What structured outputs add to a decode step: batch 64, every row constrained, against unconstrained.

    python bench/structured_step.py [--model DIR] [--device cpu] [--steps 24] [--rounds 2]

Three modes run on one engine, interleaved for `--rounds` rounds: `free` (no constraint), `shared` (the
64 rows under one JSON schema) and `distinct` (64 different schemas). Each mode adds 64 greedy requests
with equal prompts of random words, lets the prefill pass, then times `--steps` decode steps of batch 64
(whole `LLMEngine.step()` calls: schedule, forward, bitmask fill, sampling, detokenizing). The schema's
string field keeps every row decoding. Prints the median step time per mode and the ratio to `free`
(target: shared <= 1.10), plus the median time of the bitmask fill alone.
"""

import argparse
import random
import statistics
import time
from typing import Any

from contract.structured import StructuredOutput
from worker.engine import LLMEngine, SamplingParams
from worker.engine.default_model import ensure_default_model

BATCH = 64


def schema(i: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {f"note_{i}": {"type": "string"}, f"score_{i}": {"type": "integer"}},
        "required": [f"note_{i}", f"score_{i}"],
    }


def run(engine: LLMEngine, mode: str, steps: int, words: list[str]) -> tuple[float, float]:
    """Median seconds of a batch-64 decode step in ``mode``, and of its bitmask fill."""
    for i in range(BATCH):
        constraint = None if mode == "free" else StructuredOutput(json=schema(0 if mode == "shared" else i))
        params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True, structured=constraint)
        engine.add_request(f"{mode}-{i}-{time.monotonic_ns()}", " ".join(words), params)
    fills: list[float] = []
    fill = engine.grammars.fill_bitmask

    def timed_fill(matchers: list) -> Any:
        start = time.perf_counter()
        result = fill(matchers)
        fills.append(time.perf_counter() - start)
        return result

    engine.grammars.fill_bitmask = timed_fill  # type: ignore[method-assign]
    while len(engine.scheduler.running) < BATCH or engine.scheduler.waiting or engine.compiling:
        engine.step()  # compile and prefill, untimed
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    engine.grammars.fill_bitmask = fill  # type: ignore[method-assign]
    for request_id in list(engine.requests):
        engine.abort(request_id)
    engine.step()
    return statistics.median(times), statistics.median(fills[-steps:]) if fills else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from contract.engine import EngineConfig

    model = args.model or str(ensure_default_model())
    engine = LLMEngine(EngineConfig(model=model, device=args.device, kv_cache_bytes=1 << 30))
    vocab = [w for w in engine.tokenizer.get_vocab() if w.isalpha()]
    words = random.Random(0).sample(vocab, 40)
    results: dict[str, list[tuple[float, float]]] = {"free": [], "shared": [], "distinct": []}
    for mode in results:  # warm-up: the library's tokenizer, the compiles, the first steps
        run(engine, mode, 2, words)
    for _ in range(args.rounds):
        for mode in results:
            results[mode].append(run(engine, mode, args.steps, words))
    free = statistics.median(step for step, _ in results["free"])
    print(
        f"model {model}, device {engine.runner.device}, batch {BATCH}, "
        f"{args.steps} steps x {args.rounds} rounds"
    )
    for mode, found in results.items():
        step = statistics.median(s for s, _ in found)
        fill = statistics.median(f for _, f in found)
        print(
            f"{mode:9s} step {step * 1e3:7.1f} ms  ratio {step / free:5.3f}  "
            f"bitmask fill {fill * 1e3:6.2f} ms"
        )


if __name__ == "__main__":
    main()
