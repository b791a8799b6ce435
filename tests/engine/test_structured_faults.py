"""A constrained output satisfies its constraint or its request fails with the reason: a choice of
10,000 strings is honoured, and a grammar the library gives up on mid-output fails the request instead
of sampling on unconstrained."""

from pathlib import Path

import pytest

from contract.structured import StructuredOutput
from tests.support.reference import assert_pool_empty
from worker.engine import LLM, SamplingParams

pytestmark = pytest.mark.fast

PROMPT = "Paged attention stores keys and values in"
CHOICES = [f"c{i:05d}x" for i in range(10_000)]


@pytest.fixture(scope="module")
def llm(tiny_llama: Path) -> LLM:
    return LLM(str(tiny_llama), kv_cache_bytes=4 << 20, block_size=16)


def test_a_choice_of_ten_thousand_strings_is_one_of_them(llm: LLM) -> None:
    constraint = StructuredOutput(choice=CHOICES)
    params = [
        SamplingParams(temperature=1.0, max_tokens=16, seed=seed, structured=constraint) for seed in range(4)
    ]
    results = llm.generate([PROMPT] * len(params), params)
    for result in results:
        sample = result.outputs[0]
        assert result.error is None
        assert sample.text in CHOICES, sample.text
        assert sample.finish_reason == "stop"
    assert_pool_empty(llm)


def test_a_grammar_that_fails_mid_output_fails_its_request_and_spares_the_others(llm: LLM) -> None:
    # a rule of 10,000 alternatives: it compiles, and the parser refuses its row after the first token.
    # The contract refuses it (its walk finds that row), so it is set past the contract's check, as a
    # failure the walk could not foresee would come.
    rule = " | ".join(f'"{choice}"' for choice in CHOICES)
    broken = SamplingParams(temperature=1.0, max_tokens=16, seed=0)
    broken.structured = StructuredOutput(grammar=f"start: {rule}")
    free = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    failed, fine = llm.generate([PROMPT, PROMPT], [broken, free])
    assert failed.finished and failed.error is not None
    assert failed.error.startswith("the structured-output constraint failed:"), failed.error
    assert "max is 2000" in failed.error
    assert failed.outputs[0].finish_reason == "abort"
    assert fine.error is None and len(fine.outputs[0].token_ids) == 8
    assert_pool_empty(llm)
