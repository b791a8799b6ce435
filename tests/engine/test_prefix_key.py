"""A prompt's prefix key (contract/prefix.py), which the API stores on a job, is the engine's own prefix-cache
key of the prompt's leading blocks: once a worker's engine ran the prompt, it finds the key cached."""

from pathlib import Path

import pytest

from contract.prefix import MAX_PREFIX_BLOCKS, prefix_key
from worker.engine import LLM, SamplingParams

pytestmark = pytest.mark.fast

BLOCK = 16


def test_the_key_is_the_cache_s_key_of_the_prompt_s_leading_blocks(tiny_llama: Path) -> None:
    engine = LLM(str(tiny_llama), kv_cache_bytes=4 << 20, block_size=BLOCK).engine
    document = [(7 * i) % 300 + 3 for i in range(6 * BLOCK)]
    key = prefix_key([*document, 11, 12], BLOCK)
    assert key is not None and engine.cached_prefixes([key]) == []
    engine.add_request("r", [*document, 11, 12], SamplingParams(max_tokens=1))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.cached_prefixes([key, key + 1]) == [key]  # its blocks stay cached after it ends


def test_questions_about_one_document_share_a_key_and_documents_do_not() -> None:
    document = list(range(100, 100 + 40 * BLOCK))
    other = [document[0] + 1, *document[1:]]
    key = prefix_key([*document, 1, 2, 3], BLOCK)
    assert key == prefix_key([*document, 4, 5], BLOCK)  # past its leading blocks: the same key
    assert key != prefix_key([*other, 1, 2, 3], BLOCK)  # a different first token: another
    long = list(range(80 * BLOCK))  # half its blocks would be 40: its key covers 32 of them
    assert prefix_key(long, BLOCK) == prefix_key([*long[: MAX_PREFIX_BLOCKS * BLOCK], *reversed(long)], BLOCK)
    assert prefix_key(list(range(2 * BLOCK - 1)), BLOCK) is None  # under two full blocks: none
