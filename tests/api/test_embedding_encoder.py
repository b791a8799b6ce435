"""The API's side of embeddings without a service: a body's four forms of ``input`` and their refusals,
and the API's tokenization of a model's inputs, which must be exactly the engine's (the worker embeds the
ids the API stored as they are)."""

from pathlib import Path

import pytest

from api.embeddings.encoder import EmbeddingEncoder, EmbeddingInputError
from api.embeddings.schemas import BodyError, inputs_of, read_body
from contract.engine import EngineConfig
from contract.pooling import EmbeddingParams
from tests.support.tiny_models import CORPUS
from worker.engine.embedding_engine import EmbeddingEngine


@pytest.mark.fast
@pytest.mark.parametrize(
    ("given", "inputs"),
    [
        ("one", ["one"]),
        (["one", "two"], ["one", "two"]),
        ([5, 6, 7], [[5, 6, 7]]),
        ([[5, 6], [7]], [[5, 6], [7]]),
    ],
)
def test_the_four_forms_of_input(given, inputs) -> None:
    assert inputs_of(given) == inputs


@pytest.mark.fast
@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"input": ["a", ""]}, "input", "input 1 is an empty string"),
        ({"input": ["a", 1]}, "input", "must be a string"),
        ({"input": [[1], []]}, "input", "input 1 is empty"),
        ({"input": [[1.5]]}, "input", "must be a string"),
        ({"input": ["a\x00"]}, "input", "NUL"),
        ({"input": "a", "dimensions": "8"}, "dimensions", "valid integer"),
        ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "greater than or equal to 1"),
        ({"input": "a", "stream": True}, "stream", "Extra inputs"),
        ({"input": "a", "model": None}, "model", "valid string"),
    ],
)
def test_a_bad_body_names_its_field(body, param, says) -> None:
    with pytest.raises(BodyError) as refused:
        read_body({"model": "m"} | body)
    assert refused.value.param == param and says in str(refused.value)


@pytest.fixture(scope="module")
def engine_and_encoder(tiny_bert_model: Path) -> tuple[EmbeddingEngine, EmbeddingEncoder]:
    engine = EmbeddingEngine(EngineConfig(model=str(tiny_bert_model), device="cpu", dtype="float32"))
    return engine, EmbeddingEncoder(tiny_bert_model)


@pytest.mark.parametrize("truncate", [None, 1, 2, 3, 10, 48])
def test_the_api_tokenizes_as_the_engine_does(engine_and_encoder, truncate) -> None:
    engine, encoder = engine_and_encoder
    params = EmbeddingParams(truncate_prompt_tokens=truncate)
    texts = [*CORPUS, " ".join(CORPUS) * 3, "x"]
    ids = encoder.encode(texts, params)
    assert ids == engine.encode(texts, params)
    assert max(map(len, ids)) == (truncate or 48)  # cut to the limit, special tokens counted


def test_what_the_model_cannot_embed_is_refused(engine_and_encoder) -> None:
    _, encoder = engine_and_encoder
    vocab = encoder.vocab_size
    assert encoder.encode([[2, vocab - 1, 3] * 40], EmbeddingParams()) == [[2, vocab - 1, 3] * 16]
    for inputs, params, param in [
        ([[2, vocab, 3]], EmbeddingParams(), "input"),
        (["a"], EmbeddingParams(truncate_prompt_tokens=49), "truncate_prompt_tokens"),
        (["a"], EmbeddingParams(dimensions=32), "dimensions"),
    ]:
        with pytest.raises(EmbeddingInputError) as refused:
            encoder.encode(inputs, params)
        assert refused.value.param == param
