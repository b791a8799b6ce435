"""Embedding throughput: pagedq's engine offline (``LLM(kind="embed").embed``) against sentence-transformers
(``SentenceTransformer.encode``: its own length-sorted, padded batches of 32) on the same texts, with the
same threads, in one process, rounds interleaved so that a shared machine's noise hits both alike.

    python -m bench.embeddings [--num 2000] [--threads 2] [--rounds 2] [--budgets 2048,8192]

The texts are seeded, of 10-250 tokens each (uniform), mixed prose, code and non-English words. Both
sides tokenize inside the timed region. Prints texts/s, tokens/s (the tokens embedded) and GFLOP/s of
each (the encoder's matmuls, attention included), the best round of each, the ratio, and the two sides'
smallest cosine similarity, which must be ~1.
"""

import argparse
import random
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

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
    parser.add_argument("--st-batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from sentence_transformers import SentenceTransformer

    from worker.engine import LLM
    from worker.engine.default_model import resolve_model

    path = resolve_model(args.model)
    st = SentenceTransformer(str(path), device="cpu")
    engines = {
        f"pagedq (budget {budget})": LLM(str(path), kind="embed", device="cpu", max_num_batched_tokens=budget)
        for budget in map(int, args.budgets.split(","))
    }
    tokenizer = next(iter(engines.values())).tokenizer
    texts = make_texts(args.num, lambda text: len(tokenizer(text)["input_ids"]))
    next(iter(engines.values())).embed(texts[:50])  # warm-up
    st.encode(texts[:50], batch_size=args.st_batch_size)
    outputs = next(iter(engines.values())).embed(texts)
    tokens = sum(o.num_tokens for o in outputs)
    theirs = st.encode(texts, batch_size=args.st_batch_size, convert_to_tensor=True)
    cosine = F.cosine_similarity(torch.tensor([o.embedding for o in outputs]), theirs.float()).min().item()

    runs: dict[str, Callable[[], object]] = {
        "sentence-transformers": lambda: st.encode(texts, batch_size=args.st_batch_size)
    }
    runs |= {name: (lambda llm=llm: llm.embed(texts)) for name, llm in engines.items()}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.rounds):
        for name, run in runs.items():
            best[name] = min(best[name], timed(run))

    gflop = flops_per_token(st[0].auto_model.config.to_dict(), tokens / len(texts)) * tokens / 1e9
    print(f"{len(texts)} texts, {tokens} tokens ({tokens / len(texts):.0f} per text), {args.threads} threads")
    print(f"{'':28} {'texts/s':>9} {'tokens/s':>9} {'GFLOP/s':>8} {'vs s-t':>7}")
    for name, seconds in best.items():
        rates = f"{len(texts) / seconds:9.1f} {tokens / seconds:9.0f} {gflop / seconds:8.1f}"
        print(f"{name:28} {rates} {best['sentence-transformers'] / seconds:6.2f}x")
    print(f"smallest cosine similarity pagedq vs sentence-transformers: {cosine:.7f}")


if __name__ == "__main__":
    main()
