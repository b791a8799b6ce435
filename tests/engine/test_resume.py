"""Continuing a request from an earlier run's output tokens (``add_request(continue_from=...)``): what
follows is exactly what the uninterrupted run produced, greedy, seeded and under a grammar."""

import json
from pathlib import Path

import jsonschema
import pytest

from contract.structured import StructuredOutput
from tests.engine.test_engine_behaviour import drain
from worker.engine import LLM, LLMEngine, SamplingParams

pytestmark = pytest.mark.fast

PROMPT = list(range(3, 43))
SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 12}
CASES = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    "seeded": SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24, ignore_eos=True, seed=11),
    "penalised": SamplingParams(
        temperature=0.8, frequency_penalty=1.0, max_tokens=24, ignore_eos=True, seed=5
    ),
    "grammar": SamplingParams(
        temperature=1.0, seed=3, max_tokens=60, structured=StructuredOutput(json=SCHEMA | {"maxItems": 14})
    ),
}


@pytest.fixture(scope="module")
def engine(tiny_llama: Path) -> LLMEngine:
    return LLM(str(tiny_llama), kv_cache_bytes=4 << 20, block_size=16).engine


def run(engine: LLMEngine, name: str, params: SamplingParams, continue_from: list[int] | None = None):
    engine.add_request(name, PROMPT, params, continue_from=continue_from)
    for i in range(3):  # others share its steps: invariance makes that irrelevant
        engine.add_request(
            f"{name}-other{i}", PROMPT[: 9 + 7 * i], SamplingParams(temperature=0.0, max_tokens=6)
        )
    return drain(engine)[name]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("cut", [1, 17])
def test_a_continued_request_ends_as_the_uninterrupted_one(engine: LLMEngine, case: str, cut: int) -> None:
    params = CASES[case]
    whole = run(engine, f"{case}-{cut}-whole", params).outputs[0]
    assert len(whole.token_ids) > cut
    rest = run(engine, f"{case}-{cut}-rest", params, whole.token_ids[:cut]).outputs[0]
    assert rest.token_ids == whole.token_ids[cut:]  # only what follows is reported
    assert rest.finish_reason == whole.finish_reason
    assert whole.text.endswith(rest.text) and len(rest.text) < len(whole.text)
    if case == "grammar":
        assert whole.finish_reason == "stop"
        jsonschema.validate(json.loads(whole.text), CASES[case].structured.json)  # type: ignore[union-attr]


def test_a_request_whose_earlier_run_had_ended_ends_at_once(engine: LLMEngine) -> None:
    params = CASES["greedy"]
    whole = run(engine, "ended-whole", params).outputs[0]
    engine.add_request("ended-again", PROMPT, params, continue_from=whole.token_ids)
    [output] = engine.step()
    assert output.finished and output.outputs[0].finish_reason == "length"
    assert output.outputs[0].token_ids == [] and not engine.has_unfinished_requests()


def test_tokens_the_grammar_refuses_fail_the_request(engine: LLMEngine) -> None:
    bad = engine.tokenizer.encode("hello", add_special_tokens=False)
    engine.add_request("refused", PROMPT, CASES["grammar"], continue_from=bad)
    outputs = drain(engine)
    assert outputs["refused"].finished and "constraint" in (outputs["refused"].error or "")


@pytest.mark.parametrize(
    "params",
    [SamplingParams(n=2, max_tokens=8), SamplingParams(logprobs=1, max_tokens=8)],
    ids=["n=2", "logprobs"],
)
def test_what_cannot_continue_is_refused(engine: LLMEngine, params: SamplingParams) -> None:
    with pytest.raises(ValueError, match="only a single sample"):
        engine.add_request("no", PROMPT, params, continue_from=[5, 6])
