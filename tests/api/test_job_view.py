"""What a job's view says beyond its columns."""

import pytest

from api.jobs.schemas import RAW_PROMPT_ENDED_AT_ONCE, hint
from core.models import Job
from core.states import JobStatus

pytestmark = pytest.mark.fast


def job(**columns: object) -> Job:
    ended = {"status": JobStatus.SUCCEEDED, "finish_reason": "stop", "output_text": "", "prompt": "Hi"}
    return Job(**(ended | columns))


def test_a_raw_prompt_that_ended_at_once_says_why_and_how_to_ask() -> None:
    assert hint(job()) == RAW_PROMPT_ENDED_AT_ONCE and "`messages`" in RAW_PROMPT_ENDED_AT_ONCE


@pytest.mark.parametrize(
    "columns",
    [
        {"prompt": None, "messages": [{"role": "user", "content": "Hi"}]},  # chat: its template was applied
        {"output_text": "Hello"},
        {"finish_reason": "length"},
        {"status": JobStatus.RUNNING, "finish_reason": None},
        {"status": JobStatus.CANCELLED, "finish_reason": "abort"},
    ],
)
def test_no_hint_where_nothing_is_surprising(columns: dict[str, object]) -> None:
    assert hint(job(**columns)) is None
