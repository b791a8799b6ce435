"""Step 8: the embedding and GGUF paths on the GPU, each where it exists.

Each path has a probe (does the code have it?) and a check (does it match its reference on the GPU?).
A path the code does not have yet is skipped with a line saying so. The checks are hooks, to be written
when those paths land (issue 28: embeddings; issue 29: GGUF weights); until then a path whose probe
finds it fails here, so that it cannot pass unchecked.
"""

from collections.abc import Callable

from bench.gpu_check.outcome import FAIL, PASS, SKIPPED, Context, Outcome


def embeddings_missing() -> str | None:
    from worker.engine import LLM

    return None if hasattr(LLM, "embed") else "embeddings not built yet (no LLM.embed)"


def gguf_missing() -> str | None:
    from contract.engine import EngineConfig

    try:
        EngineConfig(quantization="gguf")
    except ValueError:
        return "GGUF weights not built yet (quantization='gguf' is refused)"
    return None


def embeddings_on_gpu(ctx: Context) -> Outcome:
    """HOOK (issue 28): a random BERT made from a config and saved as a sentence-transformers directory
    (``sentence_transformers.models.Transformer`` + ``Pooling`` + ``Normalize``, then ``save``), embedded
    on ``ctx.device`` by pagedq (a batch of texts of assorted lengths) and by
    ``SentenceTransformer(path, device=ctx.device).encode``: cosine >= 0.999 for every text in float32,
    texts/s of each reported."""
    return Outcome(
        FAIL, "LLM.embed exists, but its GPU check is not written", embeddings_on_gpu.__doc__ or ""
    )


def gguf_on_gpu(ctx: Context) -> Outcome:
    """Issue 29: the GGUF path (``quantization="gguf"``) runs on CPU only: its kernels are the C++
    extension's, and the engine refuses it on a GPU, so there is nothing to check here. When a GPU path
    lands: a GGUF file written on the spot (``gguf.GGUFWriter``) from a random Llama's weights in each
    supported type, greedy tokens and logprobs against the de-quantize-then-float32 reference, and
    decode step time against bfloat16."""
    return Outcome(f"{SKIPPED}: quantization='gguf' runs on CPU only", "", gguf_on_gpu.__doc__ or "")


PATHS: list[tuple[str, Callable[[], str | None], Callable[[Context], Outcome]]] = [
    ("embeddings", embeddings_missing, embeddings_on_gpu),
    ("GGUF", gguf_missing, gguf_on_gpu),
]


def run(ctx: Context) -> Outcome:
    outcomes = {}
    for name, missing, check in PATHS:
        why = missing()
        outcomes[name] = Outcome(f"{SKIPPED}: {why}") if why else check(ctx)
    details = "\n".join(
        f"- {name}: {o.result}{f' ({o.figure})' if o.figure else ''}" for name, o in outcomes.items()
    )
    details += "".join(f"\n\n{name}:\n\n{o.details}" for name, o in outcomes.items() if o.details)
    ran = [o for o in outcomes.values() if not o.result.startswith(SKIPPED)]
    if not ran:
        return Outcome(f"{SKIPPED}: not built yet", f"none built: {', '.join(outcomes)}", details)
    worst = next((o.result for o in ran if o.result != PASS), PASS)
    return Outcome(worst, "; ".join(f"{n}: {o.figure or o.result}" for n, o in outcomes.items()), details)
