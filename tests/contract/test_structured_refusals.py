"""What no output could satisfy is refused at submission, with the field and the reason: a constraint
that matches no text or that the library gives up on, stop strings or stop tokens that would cut a
constrained output short, and min_tokens that would force tokens past its end."""

from typing import Any

import pytest

from contract.sampling import ContractError, SamplingParams

pytestmark = pytest.mark.fast

RECURSIVE_BUT_SATISFIABLE = {"type": "object", "properties": {"child": {"$ref": "#"}}}


@pytest.mark.parametrize(
    "structured",
    [
        {"regex": r"[^\s\S]"},
        {"regex": r"a[^\s\S]"},
        {"grammar": "start: start"},
        {"json": {"$ref": "#"}},
        {"json": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}},
    ],
)
def test_a_constraint_that_matches_no_text_is_refused(structured: dict[str, Any]) -> None:
    with pytest.raises(ContractError) as refused:
        SamplingParams(structured=structured)
    (problem,) = refused.value.problems
    assert problem.field == "structured"
    assert "matches no text at all" in problem.message


def test_a_grammar_the_library_gives_up_on_after_a_byte_is_refused_naming_the_limit() -> None:
    rule = " | ".join(f'"c{i:05d}"' for i in range(10_000))  # a parser row of 10,000 items after "c"
    with pytest.raises(ContractError) as refused:
        SamplingParams(structured={"grammar": f"start: {rule}"})
    (problem,) = refused.value.problems
    assert problem.field == "structured"
    assert "fails after 'c'" in problem.message and "max is 2000" in problem.message


@pytest.mark.parametrize(
    "structured",
    [
        {"regex": "[0-9]+"},
        {"grammar": 'start: "yes" | "no"'},
        {"json": RECURSIVE_BUT_SATISFIABLE},
        {"choice": [f"c{i}" for i in range(10_000)]},
    ],
)
def test_a_satisfiable_constraint_is_taken(structured: dict[str, Any]) -> None:
    assert SamplingParams(structured=structured).structured is not None


@pytest.mark.parametrize("field,value", [("stop", ["}"]), ("stop_token_ids", [7]), ("min_tokens", 5)])
def test_a_stop_or_min_tokens_with_a_constraint_is_refused(field: str, value: Any) -> None:
    with pytest.raises(ContractError) as refused:
        SamplingParams(structured={"json_object": True}, **{field: value})
    (problem,) = refused.value.problems
    assert problem.field == field
    assert "structured output" in problem.message
    SamplingParams(**{field: value})  # alone, it is fine
