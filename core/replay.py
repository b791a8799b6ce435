"""How a replay's tokens compare with its original's: one job's (its view's ``replay``, api/jobs/schemas.py)
and a replay batch's lines counted together (its ``replay``, counted when a worker finalizes it)."""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.models import Job
from core.states import TERMINAL


@dataclass(frozen=True)
class Comparison:
    identical: bool | None  # None: not both ended, or the original is gone
    first_divergence: int | None
    same_model: bool | None  # None: a digest is unknown


UNKNOWN = Comparison(None, None, None)


def compare(replay: Job, original: Job | None) -> Comparison:
    if original is None or original.status not in TERMINAL or replay.status not in TERMINAL:
        return UNKNOWN
    digests = [(j.served_by or {}).get("model_digest") for j in (replay, original)]
    divergence = first_divergence(original.choice_token_ids, replay.choice_token_ids)
    same = None if None in digests else digests[0] == digests[1]
    return Comparison(divergence is None, divergence, same)


def first_divergence(original: list[list[int]], replay: list[list[int]]) -> int | None:
    """The first token index where some choice differs (a missing choice differs at 0); None: identical."""
    firsts = []
    for i in range(max(len(original), len(replay))):
        a = original[i] if i < len(original) else None
        b = replay[i] if i < len(replay) else None
        if a is None or b is None:
            firsts.append(0)
        elif a != b:
            firsts.append(
                next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            )
    return min(firsts, default=None)


def counted(comparisons: Iterable[Comparison]) -> dict[str, Any]:
    """Lines identical and different (a line whose original is gone counts in neither), and whether one
    model digest served them all: false if any line's model differs, null if none is known."""
    identical = different = 0
    same: set[bool] = set()
    for comparison in comparisons:
        identical += comparison.identical is True
        different += comparison.identical is False
        if comparison.same_model is not None:
            same.add(comparison.same_model)
    return {"identical": identical, "different": different, "same_model": min(same) if same else None}


def batch_counts(session: Session, batch_id: str) -> dict[str, Any]:
    """A replay batch's lines compared with their originals (``counted``), once they have all ended."""
    query = select(Job).where(Job.batch_id == batch_id).order_by(Job.id)
    jobs = session.scalars(query.execution_options(yield_per=1000))
    return counted(compare(job, job.original) for job in jobs)
