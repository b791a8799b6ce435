"""The request contract: the API refuses exactly what the engine refuses, through every entry point.

Thousands of random parameter combinations, edges included (beam search with each sampling field,
n/best_of, min_tokens > max_tokens, stop lists, seeds, logprobs bounds), each judged by the API's models
and mappings and by the engine's ``SamplingParams``: no model is needed, so it runs in seconds.
"""

import json
import math
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from api.batches.lines import CHAT, COMPLETIONS, BatchModel, read_lines
from api.generate.router import GenerateIn
from api.openai.online import OpenAIError, online_request
from contract.context import context_problem, max_model_len
from contract.sampling import ContractError, SamplingParams, hints
from contract.sampling_defaults import model_defaults
from core.spec import JobSpec, SamplingSpec

pytestmark = pytest.mark.fast

MANY = settings(
    max_examples=1200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
SOME = settings(
    max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
BEAM = {"use_beam_search": True, "n": 2, "temperature": 0}
THE_NEW_USERS_REQUEST = BEAM | {"top_k": 5, "max_tokens": 8}


def reals(low: float, high: float) -> st.SearchStrategy[float]:
    """The edges of [low, high] and just past them, a value inside, and the floats that are no number."""
    inside = [low + (high - low) * share for share in (0.001, 0.5, 0.999)]
    return st.sampled_from(
        [low, high, low - 0.001, high + 0.001, *inside, 0.0, 1.0, math.nan, math.inf, -math.inf]
    )


def whole(low: int, high: int, *edges: int) -> st.SearchStrategy[int]:
    return st.sampled_from([low - 1, low, low + 1, (low + high) // 2, high - 1, high, high + 1, *edges])


def strings(most: int) -> st.SearchStrategy[list[str]]:
    """Lists of stop strings: none, one, the most allowed, one too many, one empty."""
    return st.sampled_from([[], ["x"], ["\n", "END"], ["a"] * most, ["a"] * (most + 1), [""], ["x", ""]])


FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": whole(1, 40, 2**31),
    "min_tokens": whole(0, 40),
    "temperature": reals(0.0, 10.0),
    "top_p": reals(0.0, 1.0),
    "top_k": whole(-1, 50, 0),
    "min_p": reals(0.0, 1.0),
    "repetition_penalty": reals(0.0, 10.0),
    "presence_penalty": reals(-2.0, 2.0),
    "frequency_penalty": reals(-2.0, 2.0),
    "seed": st.none() | whole(0, 2**63 - 1, 2**64),
    "stop": strings(16),
    "stop_token_ids": st.sampled_from([[], [0], [5, 7], [-1], list(range(16)), list(range(17))]),
    "ignore_eos": st.booleans(),
    "logprobs": st.none() | whole(0, 20),
    "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "n": whole(1, 16, 2),
    "use_beam_search": st.booleans(),
    "best_of": st.none() | whole(2, 16, 1, 3),
    "length_penalty": reals(-10.0, 10.0),
    "early_stopping": st.sampled_from([True, False, "never"]),
    "structured": st.sampled_from(
        [
            None,
            {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}},
            {"json": {"type": "nonsense"}},
            {"json_object": True},
            {"regex": "[0-9]{3}"},
            {"regex": "[0-9"},
            {"choice": ["yes", "no"]},
            {"choice": []},
            {"grammar": 'start: "a"+'},
            {"grammar": "start: undefined_rule"},
            {"regex": "a", "choice": ["a"]},
            {},
            {"schema": {}},
        ]
    ),
}


@st.composite
def sampling(draw: st.DrawFn, leave_out: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Some parameters; half the time a beam search at temperature 0 with one or two more fields, so that
    beam search meets each sampling field often."""
    params = draw(st.fixed_dictionaries({}, optional={k: v for k, v in FIELDS.items() if k not in leave_out}))
    if draw(st.booleans()):
        params = BEAM | {k: v for k, v in params.items() if k not in BEAM or draw(st.booleans())}
    return params


def engine_accepts(params: dict[str, Any]) -> bool:
    try:
        SamplingParams(**params)
    except ValueError:
        return False
    return True


def api_accepts(model: type[SamplingSpec], body: dict[str, Any]) -> SamplingSpec | None:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        fields = {str(problem["loc"][0]) for problem in error.errors()}
        assert fields <= set(FIELDS) | {"prompt"}, error  # each problem names the field at fault
        return None


@MANY
@given(sampling())
@example(THE_NEW_USERS_REQUEST)
@example(BEAM | {"best_of": 3, "n": 4})
@example({"min_tokens": 9, "max_tokens": 4})
@example({"best_of": 2})
@example({"top_k": -1} | BEAM)
def test_the_api_and_the_engine_judge_every_request_alike(params: dict[str, Any]) -> None:
    engine = engine_accepts(params)
    for model, body in (
        (SamplingSpec, params),
        (JobSpec, params | {"prompt": "Hi"}),
        (GenerateIn, params | {"prompt": "Hi"}),
    ):
        spec = api_accepts(model, body)
        assert (spec is not None) == engine, (model.__name__, params)
        if spec is not None:  # what the API stores is what the engine runs, with a seed chosen if none
            stored = spec.engine_params()
            seed = stored["seed"] if params.get("seed") is None else params["seed"]
            assert SamplingParams(**stored) == SamplingParams(**params | {"seed": seed})


def openai_body(endpoint: str, params: dict[str, Any]) -> dict[str, Any]:
    prompt = (
        {"prompt": "Hi"} if endpoint == COMPLETIONS else {"messages": [{"role": "user", "content": "Hi"}]}
    )
    return {"model": "m", "max_tokens": 16} | params | prompt


def online_accepts(endpoint: str, body: dict[str, Any]) -> JobSpec | None:
    try:
        return online_request(body, endpoint).spec
    except OpenAIError as error:
        assert error.status == 400
        return None


def batch_line_accepts(endpoint: str, body: dict[str, Any]) -> bool:
    line = {"custom_id": "1", "method": "POST", "url": endpoint, "body": body}
    return not read_lines([json.dumps(line).encode()], 1, endpoint, BatchModel("m", ("m",)))[1]


# logprobs and best_of mean something else to OpenAI: they have their own test below.
@SOME
@given(st.sampled_from([CHAT, COMPLETIONS]), sampling(frozenset({"logprobs", "best_of"})))
@example(COMPLETIONS, THE_NEW_USERS_REQUEST)
@example(CHAT, THE_NEW_USERS_REQUEST)
def test_openai_bodies_and_batch_lines_are_judged_as_the_engine_judges(
    endpoint: str, params: dict[str, Any]
) -> None:
    body = openai_body(endpoint, params)
    engine = engine_accepts({"max_tokens": 16} | params)
    assert (online_accepts(endpoint, body) is not None) == engine, params
    assert batch_line_accepts(endpoint, body) == engine, params


@SOME
@given(
    st.sampled_from([CHAT, COMPLETIONS]),
    sampling(frozenset({"logprobs", "best_of"})),
    st.fixed_dictionaries(
        {}, optional={"logprobs": st.booleans() | whole(0, 5), "top_logprobs": whole(0, 20)}
    ),
)
@example(CHAT, BEAM, {"logprobs": True, "top_logprobs": 2})
@example(COMPLETIONS, BEAM, {"logprobs": 1})
def test_an_openai_request_asking_for_logprobs_is_never_one_the_engine_refuses(
    endpoint: str, params: dict[str, Any], logprobs: dict[str, Any]
) -> None:
    spec = online_accepts(endpoint, openai_body(endpoint, params | logprobs))
    if spec is not None:
        assert engine_accepts(spec.engine_params())
    if params.get("use_beam_search") and logprobs.get("logprobs") not in (None, False):
        assert spec is None  # beam search returns no logprobs: refused at submission


def test_every_parameter_is_generated_here() -> None:
    assert set(FIELDS) == set(hints()), "a new parameter needs its values (edges included) in FIELDS"


def test_the_new_users_request_names_the_field_at_fault() -> None:
    with pytest.raises(ValidationError) as refused:
        JobSpec.model_validate({"prompt": "Hello"} | THE_NEW_USERS_REQUEST)
    [problem] = refused.value.errors()
    assert problem["loc"] == ("top_k",) and "beam search does not support top_k" in problem["msg"]
    with pytest.raises(OpenAIError) as openai:
        online_request(openai_body(COMPLETIONS, THE_NEW_USERS_REQUEST), COMPLETIONS)
    assert (openai.value.param, openai.value.code) == ("top_k", "invalid_value")


@pytest.mark.parametrize(
    ("config", "cap", "want"),
    [
        ({"max_position_embeddings": 2048}, None, 2048),
        ({"max_position_embeddings": 2048}, 512, 512),
        ({"max_position_embeddings": 2048}, 4096, 2048),
        ({"max_position_embeddings": 32768, "sliding_window": 4096}, None, 4096),
        (
            {"max_position_embeddings": 32768, "sliding_window": 4096, "use_sliding_window": False},
            None,
            32768,
        ),
        ({}, 256, 256),
    ],
)
def test_max_model_len_is_the_smallest_limit(config: dict[str, Any], cap: int | None, want: int) -> None:
    assert max_model_len(config, cap) == want


def test_a_model_without_a_known_context_needs_a_cap() -> None:
    with pytest.raises(ValueError, match="give max_model_len"):
        max_model_len({})


def test_a_prompt_fits_when_it_and_max_tokens_do() -> None:
    assert context_problem(1000, 24, 1024) is None
    assert context_problem(1000, 25, 1024) == (
        "prompt (1000 tokens) + max_tokens (25) = 1025 tokens exceeds the model's context of 1024 tokens"
    )


def test_the_contract_imports_neither_torch_nor_pydantic_nor_the_service() -> None:
    modules = "contract.sampling, contract.sampling_defaults, contract.context, contract.engine"
    code = f"import sys, {modules}; print(*sorted(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    roots = {name.split(".")[0] for name in loaded.split()}
    assert not roots & {"torch", "pydantic", "sqlalchemy", "transformers", "core", "api", "worker", "kernels"}


def test_an_unseeded_request_gets_a_seed_of_its_own_and_a_seeded_one_keeps_its_own() -> None:
    seeds = {JobSpec(prompt="hi", temperature=0.7).engine_params()["seed"] for _ in range(8)}
    assert len(seeds) == 8 and all(0 <= seed < 2**63 for seed in seeds)
    assert JobSpec(prompt="hi", seed=7).engine_params()["seed"] == 7


def test_model_defaults_fill_only_what_a_request_left_out() -> None:
    model = model_defaults({"temperature": 0.2, "top_p": 0.9, "do_sample": True, "max_length": 20})
    assert model == {"temperature": 0.2, "top_p": 0.9}  # only sampling fields the contract has
    spec = JobSpec(prompt="hi", temperature=0.7)
    params = spec.engine_params(model)
    assert (params["temperature"], params["top_p"]) == (0.7, 0.9)
    beams = JobSpec(prompt="hi", use_beam_search=True, n=2, temperature=0).engine_params(model)
    assert (beams["temperature"], beams["top_p"]) == (0.0, 1.0)
    with pytest.raises(ContractError, match="top_p"):
        model_defaults({"top_p": 1.5})


def test_repeated_settings_are_checked_by_the_engine_once_and_each_new_one_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch's lines mostly repeat one sampling setting: the engine's check runs once for it, and a
    setting that differs in any value is checked on its own."""
    import core.spec

    checked: list[dict[str, Any]] = []

    def counted(**params: Any) -> SamplingParams:
        checked.append(params)
        return SamplingParams(**params)

    monkeypatch.setattr(core.spec, "SamplingParams", counted)
    monkeypatch.setattr(core.spec, "_accepted", set())
    body = {"prompt": "x", "max_tokens": 4, "min_tokens": 2}
    for _ in range(3):
        JobSpec.model_validate(body)
    assert len(checked) == 1
    for refused in ({"min_tokens": 5}, {"max_tokens": 1}):  # the rules between values are the engine's
        with pytest.raises(ValidationError, match="min_tokens"):
            JobSpec.model_validate(body | refused)
    JobSpec.model_validate(body | {"temperature": 0.5})
    JobSpec.model_validate(body | {"temperature": 0.5, "stop": ["."]})
    JobSpec.model_validate(body | {"temperature": 0.5})
    assert len(checked) == 5
