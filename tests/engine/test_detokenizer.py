"""Streamed text equals a full decode, also for characters split across byte-fallback tokens."""

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from contract.sampling import SamplingParams
from tests.support.tiny_models import build_tokenizer
from worker.engine.detokenizer import IncrementalDetokenizer

pytestmark = pytest.mark.fast

TEXT = "héllo wörld — 日本語 🙂 ça va"


def byte_fallback_tokenizer() -> Tokenizer:
    """A SentencePiece-style tokenizer (Llama 2, Mistral) knowing only ASCII pieces: the rest is bytes."""
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": b + 1 for b in range(256)}}
    for piece in ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁h", "▁w", "llo", "▁ça", "▁va"]:
        vocab.setdefault(piece, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tokenizer


def stream(
    tokenizer: Tokenizer, ids: list[int], params: SamplingParams, prompt: list[int]
) -> tuple[str, str | None]:
    detok = IncrementalDetokenizer(tokenizer, prompt, params)
    text = ""
    for token in ids:
        stop = detok.add_token(token)
        text += detok.take_new_text(finished=stop is not None)
        if stop is not None:
            return text, stop
    detok.flush()
    return text + detok.take_new_text(finished=True), None


@pytest.mark.parametrize("kind", ["byte-level", "byte-fallback"])
def test_streamed_text_equals_full_decode(kind: str) -> None:
    tokenizer = build_tokenizer().backend_tokenizer if kind == "byte-level" else byte_fallback_tokenizer()
    prompt = tokenizer.encode("hello").ids
    ids = tokenizer.encode(" " + TEXT, add_special_tokens=False).ids
    if kind == "byte-fallback":
        assert sum(1 for i in ids if 1 <= i <= 256) >= 10, "the test must exercise byte tokens"
    full = tokenizer.decode(prompt + ids)[len(tokenizer.decode(prompt)) :]
    text, stop = stream(tokenizer, ids, SamplingParams(), prompt)
    assert text == full and "日本語 🙂" in text and stop is None


def test_stop_string_split_across_tokens_is_held_back_and_cut() -> None:
    tokenizer = build_tokenizer().backend_tokenizer
    ids = tokenizer.encode("héllo wörld — 日本語 🙂", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=["本語"]))
    emitted, stop = "", None
    for token in ids:
        stop = detok.add_token(token)
        emitted += detok.take_new_text(finished=stop is not None)
        assert "本" not in emitted or stop is not None, "a stop-string prefix leaked before the stop"
        if stop:
            break
    assert (emitted, stop) == ("héllo wörld — 日", "本語")


def test_a_truncated_character_at_the_end_becomes_a_replacement_char() -> None:
    tokenizer = byte_fallback_tokenizer()
    ids = tokenizer.encode("ok 日", add_special_tokens=False).ids[:-1]  # drop the character's last byte
    text, _ = stream(tokenizer, ids, SamplingParams(), [])
    assert text == tokenizer.decode(ids) and text.endswith("\ufffd")
