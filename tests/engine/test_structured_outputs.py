"""Structured outputs in the engine: 20 JSON schemas, a regex, a choice and a grammar, greedy and sampled,
mixed with free requests in one batch; n > 1, preemption and prefix caching with constraints.

Every output parses and validates against its schema, except one cut by ``max_tokens``: those, and only
those, end with finish_reason "length".
"""

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from contract.structured import StructuredOutput
from tests.support.reference import assert_pool_empty
from worker.engine import LLM, RequestOutput, SamplingParams
from worker.engine.default_model import ensure_default_model
from worker.engine.sampler import Sampler, SamplingRow

pytestmark = pytest.mark.slow

NAME = {"type": "string", "minLength": 1, "maxLength": 16}
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {"type": "object", "properties": {"city": NAME, "country": NAME}, "required": ["city"]},
    {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}},
        "required": ["colour"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "primes": {
                "type": "array",
                "items": {"type": "integer", "minimum": 2, "maximum": 99},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["primes"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "price": {"type": "number", "minimum": 0, "maximum": 1000},
            "currency": {"enum": ["USD", "EUR"]},
        },
        "required": ["price", "currency"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "invoice": {
                "type": "object",
                "properties": {"vendor": NAME, "total": {"type": "number", "minimum": 0, "maximum": 99999}},
                "required": ["vendor", "total"],
                "additionalProperties": False,
            }
        },
        "required": ["invoice"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
        "required": ["date"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "title": NAME,
            "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
            "genre": {"enum": ["drama", "comedy"]},
        },
        "required": ["title", "year"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "x": {"type": "integer", "minimum": -10, "maximum": 10},
            "y": {"type": "integer", "minimum": -10, "maximum": 10},
        },
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]}, "why": NAME},
        "required": ["answer"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "lines": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"item": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                    "required": ["item", "qty"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 2,
            }
        },
        "required": ["lines"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
        "required": ["email"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 3, "maxItems": 3},
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {
                    "b": {
                        "type": "object",
                        "properties": {"c": {"type": "integer", "minimum": 0, "maximum": 5}},
                        "required": ["c"],
                        "additionalProperties": False,
                    }
                },
                "required": ["b"],
                "additionalProperties": False,
            }
        },
        "required": ["a"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "temperature": {"type": "number", "minimum": -50, "maximum": 50},
            "unit": {"const": "C"},
        },
        "required": ["temperature", "unit"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"nickname": {"type": ["string", "null"], "maxLength": 10}},
        "required": ["nickname"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
            "stock": {"type": "integer", "minimum": 0, "maximum": 500},
        },
        "required": ["sku", "stock"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "summary": {"type": "string", "maxLength": 40},
            "words": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        "required": ["summary"],
        "additionalProperties": False,
    },
]
REGEX = r"[0-9]{3}-[0-9]{4}"
CHOICE = ["positive", "negative", "neutral"]
GRAMMAR = 'start: "(" expr ")"\nexpr: NUMBER (("+" | "*") NUMBER)*\nNUMBER: /[0-9]{1,3}/'
FREE = ["What is the capital of France?", "Count from one to five.", "Who wrote Romeo and Juliet?"]
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(ensure_default_model()), kv_cache_bytes=256 << 20)


def chat(llm: LLM, text: str) -> list[int]:
    return llm.chat_prompt([{"role": "user", "content": text}])


def json_prompt(schema: dict[str, Any]) -> str:
    """A short prompt naming the fields: the grammar, not the prompt, holds the schema."""
    return f"Answer in JSON: {', '.join(schema.get('properties', {})) or 'a list'}."


def assert_valid(output: RequestOutput, check: Any) -> None:
    for sample in output.outputs:
        if sample.finish_reason == "length":
            continue  # cut off by max_tokens: the one way an output may be incomplete
        assert sample.finish_reason == "stop", sample
        check(sample.text)


def test_every_kind_of_constraint_holds_in_one_mixed_batch(llm: LLM) -> None:
    free = SamplingParams(temperature=0.0, max_tokens=16)
    alone = [o.outputs[0].token_ids for o in llm.generate([chat(llm, q) for q in FREE], free)]

    prompts, params, checks = [], [], []
    for i, schema in enumerate(SCHEMAS):  # each schema greedy and sampled
        for extra in ({"temperature": 0.0}, {"temperature": 0.9, "seed": i}):
            prompts.append(chat(llm, json_prompt(schema)))
            params.append(
                SamplingParams(max_tokens=MAX_TOKENS, structured=StructuredOutput(json=schema), **extra)
            )
            checks.append(lambda text, s=schema: jsonschema.validate(json.loads(text), s))
    others = [
        ("Give me a US phone number.", StructuredOutput(regex=REGEX), lambda t: re.fullmatch(REGEX, t)),
        ("Is 'I love it' positive?", StructuredOutput(choice=CHOICE), lambda t: t in CHOICE),
        (
            "Write a sum.",
            StructuredOutput(grammar=GRAMMAR),
            lambda t: re.fullmatch(r"\([0-9]{1,3}([+*][0-9]{1,3})*\)", t),
        ),
        (
            "Describe a cat as JSON.",
            StructuredOutput(json_object=True),
            lambda t: isinstance(json.loads(t), dict),
        ),
    ]
    for text, constraint, check in others:
        prompts.append(chat(llm, text))
        params.append(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, structured=constraint))
        checks.append(lambda t, c=check: c(t) or pytest.fail(f"{t!r} breaks its constraint"))
    free_at = len(prompts)
    prompts += [chat(llm, q) for q in FREE]
    params += [free] * len(FREE)

    outputs = llm.generate(prompts, params)
    for output, check in zip(outputs, checks, strict=False):
        assert_valid(output, check)
    cut = sum(s.finish_reason == "length" for o in outputs[:free_at] for s in o.outputs)
    assert cut <= len(prompts) // 10, "most constrained outputs end on their own"
    assert [o.outputs[0].token_ids for o in outputs[free_at:]] == alone  # free rows are untouched
    assert any(o.num_cached_tokens for o in outputs), "prompts share the chat template's cached prefix"
    assert_pool_empty(llm)


def test_constraints_hold_through_preemption_and_forks(tiny_llama: Path) -> None:
    # a random model under a grammar: its output is still valid, whatever it would have said
    tight = LLM(str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=12 * 2 * 2 * 16 * 32 * 4)
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 20}
    schema["maxItems"] = 22
    constraint = StructuredOutput(json=schema)
    constrained = SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=60, structured=constraint)
    outputs = tight.generate(["a b c d e f g h"] * 3, constrained)  # n=2: each sample its own matcher
    assert tight.engine.scheduler.num_preemptions > 0
    assert any(s.finish_reason == "stop" for o in outputs for s in o.outputs)
    for output in outputs:
        assert_valid(output, lambda text: jsonschema.validate(json.loads(text), schema))
    assert_pool_empty(tight)


def test_a_constraint_that_cannot_compile_fails_only_its_request(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=8 << 20)
    bad = SamplingParams.__new__(SamplingParams)  # past the contract's check, as a stored job could be
    bad.__dict__.update(vars(SamplingParams(max_tokens=4)) | {"structured": StructuredOutput(regex="[0-")})
    good = SamplingParams(max_tokens=4, temperature=0.0)
    failed, fine = llm.generate(["one", "two"], [bad, good])
    assert failed.finished and "regex" in (failed.error or "")
    assert fine.error is None and len(fine.outputs[0].token_ids) == 4


def test_the_bitmask_refuses_tokens_in_its_rows_only() -> None:
    logits = torch.randn(3, 70, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    bitmask = torch.zeros(2, 3, dtype=torch.int32)
    bitmask[0, 0] = 1 << 5  # row 0: tokens 5 and 69 (word 2, bit 5)
    bitmask[0, 2] = 1 << 5
    bitmask[1, 1] = 1 << 1  # row 2: token 33
    greedy = SamplingRow(SamplingParams(temperature=0.0), 0, [1], [], [0])
    hot = SamplingRow(SamplingParams(temperature=5.0, seed=1), 1, [1], [], [0])
    tokens = Sampler()(logits, [greedy, greedy, hot], ([0, 2], bitmask)).token_ids
    assert tokens[0] == (5 if logits[0, 5] > logits[0, 69] else 69)
    assert tokens[1] == int(logits[1].argmax()) and tokens[2] == 33
    assert torch.equal(logits, before)  # the caller's logits (and so logprobs) are untouched


def test_a_request_aborted_while_its_constraint_compiles_ends_at_once(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=8 << 20)
    engine = llm.engine
    engine.add_request(
        "r", "one two", SamplingParams(max_tokens=4, structured=StructuredOutput(regex="[a-z]{9}"))
    )
    assert engine.abort("r") and not engine.compiling
    [output] = engine.step()
    assert output.finished and output.outputs[0].finish_reason == "abort"
    assert not engine.has_unfinished_requests()
    assert_pool_empty(llm)
