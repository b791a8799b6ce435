"""Embeddings equal sentence-transformers' on the same weights: all-MiniLM-L6-v2 itself, and tiny random
BERT encoders and a tiny decoder in every pooling the engine supports."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from sentence_transformers import SentenceTransformer

from contract.pooling import EmbeddingParams
from tests.support.tiny_models import make_tiny_bert, make_tiny_model, write_sentence_transformers_files
from worker.engine import LLM
from worker.engine.default_model import resolve_model

PARAGRAPH = " ".join(
    f"The {word} river winds through the valley, carrying silt from the mountains to the sea."
    for word in ["long", "quiet", "old", "wide", "cold", "slow"] * 5
)  # about 300 words: longer than MiniLM's 256 tokens
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "héllo wörld — ça va? ¿qué tal? Grüße aus München!",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "I love pizza 🍕🔥 and tacos 🌮!!",
    "def add(a, b):\n    return a + b  # sum",
    'SELECT id, name FROM users WHERE email LIKE "%@example.com";',
    "a",
    "?",
    PARAGRAPH,
]


def reference(path: Path, texts: list[str], max_seq_length: int | None = None) -> torch.Tensor:
    model = SentenceTransformer(str(path), device="cpu")
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    return model.encode(texts, convert_to_tensor=True, batch_size=4).float()


def vectors(llm: LLM, texts: list[str], params: EmbeddingParams | None = None) -> torch.Tensor:
    return torch.tensor([output.embedding for output in llm.embed(texts, params)])


def assert_parity(mine: torch.Tensor, theirs: torch.Tensor, atol: float = 1e-5) -> None:
    assert mine.shape == theirs.shape
    assert F.cosine_similarity(mine, theirs).min().item() >= 0.99999
    torch.testing.assert_close(mine, theirs, atol=atol, rtol=1e-4)


@pytest.fixture(scope="module")
def minilm() -> LLM:
    return LLM(kind="embed", device="cpu")


def test_minilm_matches_sentence_transformers(minilm: LLM) -> None:
    outputs = minilm.embed(SENTENCES)
    assert_parity(
        torch.tensor([o.embedding for o in outputs]), reference(resolve_model("all-minilm-l6-v2"), SENTENCES)
    )
    assert [len(o.embedding) for o in outputs] == [384] * len(SENTENCES)
    assert outputs[-1].num_tokens == 256  # the paragraph, truncated to max_seq_length
    assert outputs[-3].num_tokens == 3  # [CLS] a [SEP]
    assert all(abs(torch.tensor(o.embedding).norm().item() - 1) < 1e-5 for o in outputs)  # 2_Normalize


def test_minilm_truncate_prompt_tokens_matches_a_shorter_max_seq_length(minilm: LLM) -> None:
    texts = [PARAGRAPH, SENTENCES[0]]
    outputs = minilm.embed(texts, EmbeddingParams(truncate_prompt_tokens=32))
    assert [o.num_tokens for o in outputs] == [32, 12]
    theirs = reference(resolve_model("all-minilm-l6-v2"), texts, max_seq_length=32)
    assert_parity(torch.tensor([o.embedding for o in outputs]), theirs)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("pooling", "normalize"), [("mean", True), ("mean", False), ("cls", True), ("cls", False)]
)
def test_tiny_bert_matches_sentence_transformers(tmp_path: Path, pooling: str, normalize: bool) -> None:
    path = make_tiny_bert(tmp_path, pooling, normalize, max_seq_length=24)
    texts = [*SENTENCES, "fox " * 40]  # the last is truncated to 24 tokens
    outputs = LLM(str(path), kind="embed", device="cpu").embed(texts)
    assert_parity(torch.tensor([o.embedding for o in outputs]), reference(path, texts))
    assert max(o.num_tokens for o in outputs) == 24


@pytest.mark.fast
@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_tiny_decoder_matches_sentence_transformers(tmp_path: Path, pooling: str) -> None:
    path = make_tiny_model(tmp_path, "llama")
    write_sentence_transformers_files(path, pooling, True, hidden_size=64, max_seq_length=None)
    texts = [s for s in SENTENCES if s != PARAGRAPH]
    outputs = LLM(str(path), kind="embed", device="cpu").embed(texts)
    assert_parity(torch.tensor([o.embedding for o in outputs]), reference(path, texts), atol=3e-5)


def test_minilm_vectors_do_not_depend_on_the_batch(minilm: LLM) -> None:
    """Bit for bit: rows are packed without padding, attention runs per input (equal lengths together),
    and the packed linears sum each row in the same order whatever the batch's size."""
    together = minilm.embed(SENTENCES * 8)  # 88 inputs, one step of ~1,800 tokens
    for i, text in enumerate(SENTENCES):
        assert minilm.embed(text)[0].embedding == together[i].embedding == together[i + 33].embedding
