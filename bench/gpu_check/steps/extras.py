"""Step 8: the embedding and GGUF paths on the GPU, each where it exists.

Each path has a probe (does the code have it?) and a check (does it match its reference on the GPU?).
A path the code does not have yet is skipped with a line saying so; a path whose probe finds it but
whose check is still a hook fails here, so that it cannot pass unchecked.
"""

import time
from collections.abc import Callable
from typing import TypeVar

from bench.gpu_check.outcome import FAIL, PASS, SKIPPED, Context, Outcome

T = TypeVar("T")
EMBED_MIN_COSINE = 0.999


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
    """A random BERT saved as a sentence-transformers directory (mean pooling, Normalize), embedded on
    ``ctx.device`` by pagedq (texts of assorted lengths, some truncated) and by sentence-transformers on
    the same device: cosine >= ``EMBED_MIN_COSINE`` for every text in float32; texts/s of each."""
    import torch
    import torch.nn.functional as F
    from sentence_transformers import SentenceTransformer

    from bench.gpu_check import models
    from tests.support.tiny_models import make_tiny_bert
    from worker.engine import LLM

    path = make_tiny_bert(ctx.workdir / "bert", max_seq_length=48)
    texts = models.text_prompts(16 if ctx.dry_run else 512, seed=5, longest=400)
    llm = LLM(str(path), kind="embed", device=ctx.device, dtype="float32")
    ours, ours_s = timed(lambda: torch.tensor([o.embedding for o in llm.embed(texts)]))
    reference = SentenceTransformer(str(path), device=ctx.device)
    theirs, theirs_s = timed(lambda: reference.encode(texts, convert_to_tensor=True, batch_size=64).cpu())
    worst = F.cosine_similarity(ours, theirs.float()).min().item()
    figure = (
        f"min cosine {worst:.6f} over {len(texts)} texts; texts/s pagedq {len(texts) / ours_s:.0f}, "
        f"sentence-transformers {len(texts) / theirs_s:.0f}"
    )
    return Outcome(PASS if worst >= EMBED_MIN_COSINE else FAIL, figure)


def timed(work: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


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
