"""Numbers and booleans are strict, as in OpenAI's API: ``"4"`` is no 4 and ``true`` no 1, in the
engine's contract and in the API's spec alike, each refusal naming the field."""

from typing import Any

import pytest
from pydantic import ValidationError

from contract.sampling import ContractError, SamplingParams
from core.spec import JobSpec

pytestmark = pytest.mark.fast

WRONG = [
    ("max_tokens", "4"),
    ("max_tokens", True),
    ("max_tokens", 4.0),
    ("n", False),
    ("temperature", "0.5"),
    ("temperature", True),
    ("seed", 1.5),
    ("ignore_eos", 1),
    ("ignore_eos", "true"),
    ("stop_token_ids", [True]),
    ("early_stopping", 1),
]


@pytest.mark.parametrize(("field", "value"), WRONG)
def test_a_string_or_boolean_for_a_number_is_refused_everywhere(field: str, value: Any) -> None:
    with pytest.raises(ContractError) as refused:
        SamplingParams(**{field: value})
    assert refused.value.problems[0].field == field
    with pytest.raises(ValidationError) as invalid:
        JobSpec.model_validate({"prompt": "hi", field: value})
    assert invalid.value.errors()[0]["loc"][0] == field


def test_an_integer_is_a_number_and_priority_is_strict_too() -> None:
    params = SamplingParams(temperature=0, top_p=1, max_tokens=3)
    assert (params.temperature, params.top_p) == (0, 1)
    assert JobSpec.model_validate({"prompt": "hi", "temperature": 1, "priority": -2}).priority == -2
    with pytest.raises(ValidationError):
        JobSpec.model_validate({"prompt": "hi", "priority": "1"})
