"""A batch file's lines checked a slice at a time, here or in a process pool; chats tokenized by pieces."""

import gc
import itertools
import json
import multiprocessing
import os
import pickle
import signal
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer

from api.batches.check import (
    PICKLED_LINES,
    SLICE_LINES,
    BadLines,
    BatchChecker,
    CheckedLine,
    Slice,
    _check_slice_here,
    _unpickled,
)
from api.batches.lines import BatchModel
from api.prompts.encoder import PromptEncoder
from api.prompts.piece_encoding import PieceEncoder
from contract.engine import EngineConfig
from core.spec import JobSpec
from worker.engine.default_model import ensure_default_model

CHAT = "/v1/chat/completions"
MODEL = BatchModel("tiny", ("tiny",))
LINES = 2 * SLICE_LINES + 7  # three slices, the last one short


def line(i: int, **body: Any) -> bytes:
    messages = [
        {"role": "system", "content": "Summarise in one line."},
        {"role": "user", "content": f"Document {i}: the fox {'é' * (i % 5)} jumps over the dog"},
    ]
    body = {"messages": messages, "max_tokens": 4 + i % 3} | body
    return json.dumps({"custom_id": f"doc-{i}", "method": "POST", "url": CHAT, "body": body}).encode()


@pytest.fixture(scope="module")
def encoder(tiny_llama: Path) -> PromptEncoder:
    return PromptEncoder(tiny_llama, EngineConfig())


@pytest.fixture(scope="module")
def in_pool(encoder: PromptEncoder, tiny_llama: Path) -> Iterator[BatchChecker]:
    checker = BatchChecker(encoder, tiny_llama, encoder.engine, processes=2)
    yield checker
    checker.close()


def check(checker: BatchChecker, raw_lines: list[bytes]) -> tuple[list[CheckedLine], BadLines | None]:
    """The lines yielded before the end, and the ``BadLines`` raised at the end, if any."""
    checked: list[CheckedLine] = []
    try:
        checked.extend(checker.check(b"\n".join(raw_lines), CHAT, MODEL))
    except BadLines as bad:
        return checked, bad
    return checked, None


def test_a_pool_checks_a_file_as_this_process_does_and_in_its_order(encoder, in_pool):
    raw_lines = [line(i) for i in range(LINES)]
    raw_lines[10] = line(10, max_tokens=None)  # fills the context: max_tokens from the prompt's length
    raw_lines.insert(20, b"   ")  # blank: skipped, but counted in the line numbers

    here, bad_here = check(BatchChecker(encoder, Path(), encoder.engine, processes=0), raw_lines)
    pooled, bad_pooled = check(in_pool, raw_lines)

    assert bad_here is None and bad_pooled is None
    assert all(isinstance(checked.params.pop("seed"), int) for checked in here + pooled)  # each its own
    assert pooled == here
    assert [checked.number for checked in pooled] == [n for n in range(1, LINES + 2) if n != 21]
    assert [checked.custom_id for checked in pooled] == [f"doc-{i}" for i in range(LINES)]
    first, filling = pooled[0], pooled[10]
    spec = json.loads(raw_lines[0])["body"]
    assert first.prompt_token_ids == encoder.encode(JobSpec.model_validate(spec))
    assert first.messages == spec["messages"] and first.params["max_tokens"] == 4
    assert filling.params["max_tokens"] == encoder.context_length - len(filling.prompt_token_ids)


def test_a_slice_comes_back_as_bytes_and_its_lines_are_unpickled_a_piece_at_a_time(in_pool):
    """What a pool process sends, the pool's result thread unpickles in one call that holds the GIL, and
    so the event loop: sent as objects, a slice's 2,048 lines held it 20-30 ms, and 0.3-0.5 s when their
    allocations set off a full collection. As bytes it holds nothing the collector walks; the writer
    unpickles its lines a piece at a time as it takes them."""
    task = Slice([line(i) for i in range(SLICE_LINES)], 1, CHAT, MODEL)
    sent = in_pool._pool.submit(_check_slice_here, task).result()  # as the result thread unpickled it

    pickled, errors = sent
    assert errors == [] and not any(gc.is_tracked(piece) for piece in pickled)
    assert [len(pickle.loads(piece)) for piece in pickled] == [PICKLED_LINES] * (SLICE_LINES // PICKLED_LINES)
    lines, _ = _unpickled(([pickled[0], b"not yet unpickled"], []))
    first_piece = list(itertools.islice(lines, PICKLED_LINES))
    assert [checked.custom_id for checked in first_piece] == [f"doc-{i}" for i in range(PICKLED_LINES)]


def test_each_pool_process_checks_with_its_startup_heap_frozen(in_pool):
    """A slice's lines stay alive while they are checked, and set off full collections: each walked the
    tokenizer's heap (~350,000 objects, 0.15 s) until the process froze it once loaded."""
    for frozen in in_pool._pool.map(_frozen_objects, range(4)):
        assert frozen > 100_000, frozen


def _frozen_objects(_: int) -> int:
    return gc.get_freeze_count()


def test_bad_lines_of_every_slice_are_reported_by_number_and_no_line_is_given_after_one(in_pool):
    raw_lines = [line(i) for i in range(LINES)]
    raw_lines[4] = b"{not json"
    raw_lines[SLICE_LINES + 2] = line(0)  # custom_id doc-0 again, in another slice
    raw_lines[-1] = line(LINES - 1, temperature=-1)

    checked, bad = check(in_pool, raw_lines)

    assert bad is not None and checked == []
    found = [(error.line, error.code) for error in bad.errors]
    assert found == [
        (5, "invalid_json_line"),
        (SLICE_LINES + 3, "duplicate_custom_id"),
        (LINES, "invalid_value"),
    ]
    assert "already used on line 1" in bad.errors[1].message


def test_lines_before_a_later_slices_bad_line_are_given_and_the_end_still_fails(in_pool):
    raw_lines = [line(i) for i in range(LINES)]
    raw_lines[-1] = b"[]"

    checked, bad = check(in_pool, raw_lines)

    assert bad is not None and [(e.line, e.code) for e in bad.errors] == [(LINES, "invalid_json_line")]
    assert 0 < len(checked) < LINES - 1  # what came before is written, then rolled back by the caller


def test_a_file_without_lines_is_refused(in_pool):
    checked, bad = check(in_pool, [b"", b"  "])
    assert checked == [] and bad is not None and [e.code for e in bad.errors] == ["empty_file"]


def test_a_dead_pool_process_fails_one_check_and_the_next_check_gets_a_new_pool(encoder, tiny_llama):
    raw_lines = [line(i) for i in range(3)]
    before = {child.pid for child in multiprocessing.active_children()}
    checker = BatchChecker(encoder, tiny_llama, encoder.engine, processes=1)
    try:
        assert len(check(checker, raw_lines)[0]) == 3
        [process] = [child for child in multiprocessing.active_children() if child.pid not in before]
        os.kill(process.pid, signal.SIGKILL)
        process.join()

        with pytest.raises(BrokenProcessPool):
            check(checker, raw_lines)
        checked, bad = check(checker, raw_lines)
        assert bad is None and [c.custom_id for c in checked] == ["doc-0", "doc-1", "doc-2"]
    finally:
        checker.close()


TRICKY = [
    "plain",
    "",
    "  leading and trailing spaces  ",
    "a<|im_end|>b inside the content",
    "<|im_start|><|im_end|>",
    "new\n\nlines\r\n and tabs\t",
    "émoji 🦊 and 中文 and ﬁ ligature",
    "Document 12345. The committee met on Tuesday.",
]


def chats(tokenizer: Any) -> list[str]:
    conversations = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}] for text in TRICKY
    ]
    return tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False)


def whole(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_chats_encoded_by_pieces_equal_whole_encodes(model, tiny_llama):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama if model == "tiny" else ensure_default_model())
    texts = chats(tokenizer) * 3  # repeated pieces come from the cache
    pieces = PieceEncoder(tokenizer.backend_tokenizer)

    assert pieces.encode(texts) == whole(tokenizer.backend_tokenizer, texts)
    assert pieces.by_pieces


def metaspace_tokenizer(normalize: bool) -> Tokenizer:
    """A tokenizer that marks only a text's first piece with a leading space, or that normalizes."""
    vocab = {"<unk>": 0, "<s>": 1, "▁": 2} | {c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz▁")}
    tokenizer = Tokenizer(models.BPE(vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    if normalize:
        tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.add_special_tokens(["<s>"])
    return tokenizer


@pytest.mark.parametrize("normalize", [False, True])
def test_a_tokenizer_whose_pieces_differ_is_encoded_whole(normalize):
    tokenizer = metaspace_tokenizer(normalize)
    texts = ["ab<s>cd", "<s>ef gh<s>", "ij"]
    pieces = PieceEncoder(tokenizer)

    assert pieces.encode(texts) == whole(tokenizer, texts)
    assert not pieces.by_pieces
