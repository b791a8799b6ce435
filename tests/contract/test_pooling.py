"""The embedding contract: what a request may ask of a model's pooling."""

import pytest

from contract.pooling import EmbeddingParams, Pooling, problems, token_limit
from contract.sampling import ContractError

pytestmark = pytest.mark.fast

MINILM = Pooling("mean", True, max_seq_length=256, hidden_size=384)
MATRYOSHKA = Pooling("last", True, max_seq_length=8192, hidden_size=1024, dimensions=(512, 256))


def test_defaults_take_the_models_limit() -> None:
    assert problems(EmbeddingParams(), MINILM) == []
    assert token_limit(EmbeddingParams(), MINILM) == 256
    assert token_limit(EmbeddingParams(truncate_prompt_tokens=16), MINILM) == 16


@pytest.mark.parametrize("truncate", [0, -1, 257])
def test_truncate_prompt_tokens_within_the_models_limit(truncate: int) -> None:
    with pytest.raises(ContractError, match=r"truncate_prompt_tokens must be in \[1, 256\]") as error:
        EmbeddingParams(truncate_prompt_tokens=truncate).check(MINILM)
    assert [p.field for p in error.value.problems] == ["truncate_prompt_tokens"]


def test_dimensions_only_where_the_model_has_them() -> None:
    EmbeddingParams(dimensions=384).check(MINILM)
    EmbeddingParams(dimensions=256).check(MATRYOSHKA)
    with pytest.raises(ContractError, match=r"384 dimensions \(no other size besides\), got 128"):
        EmbeddingParams(dimensions=128).check(MINILM)
    with pytest.raises(ContractError, match=r"1024 dimensions \(512, 256 besides\), got 100"):
        EmbeddingParams(dimensions=100).check(MATRYOSHKA)


def test_pooling_checks_itself() -> None:
    with pytest.raises(ValueError, match="pooling mode must be one of"):
        Pooling("max", True, 256, 384)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_seq_length"):
        Pooling("mean", True, 0, 384)
