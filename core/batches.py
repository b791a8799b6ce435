"""What the API and the workers both do to a batch's jobs: stop the unfinished ones, count them all."""

from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from core.models import Job, utcnow
from core.states import JobStatus

NO_SYNC = {"synchronize_session": False}


def cancel_unfinished(session: Session, batch_ids: list[str]) -> None:
    """Queued jobs of these batches end cancelled now; running ones are asked to stop (their worker aborts
    them within a flush interval and records them cancelled). Idempotent: safe to repeat every round."""
    if not batch_ids:
        return
    of_batches = Job.batch_id.in_(batch_ids)
    session.execute(
        update(Job)
        .where(of_batches, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, finished_at=utcnow()),
        execution_options=NO_SYNC,
    )
    session.execute(
        update(Job)
        .where(of_batches, Job.status == JobStatus.RUNNING, Job.cancel_requested.is_(False))
        .values(cancel_requested=True),
        execution_options=NO_SYNC,
    )


@dataclass
class Tally:
    """A batch's jobs by outcome, and the tokens they used so far."""

    completed: int = 0  # succeeded
    failed: int = 0  # failed or cancelled
    unfinished: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def tally(session: Session, batch_ids: list[str]) -> dict[str, Tally]:
    """One GROUP BY over the jobs of these batches (the (batch_id, status) index finds them)."""
    query = (
        select(
            Job.batch_id,
            Job.status,
            func.count(),
            func.coalesce(func.sum(Job.prompt_tokens), 0),
            func.coalesce(func.sum(Job.completion_tokens), 0),
            func.coalesce(func.sum(Job.cached_tokens), 0),
        )
        .where(Job.batch_id.in_(batch_ids))
        .group_by(Job.batch_id, Job.status)
    )
    tallies = {batch_id: Tally() for batch_id in batch_ids}
    for batch_id, status, count, prompt, completion, cached in session.execute(query):
        t = tallies[batch_id]
        if status == JobStatus.SUCCEEDED:
            t.completed += count
        elif status in (JobStatus.FAILED, JobStatus.CANCELLED):
            t.failed += count
        else:
            t.unfinished += count
        t.prompt_tokens += prompt
        t.completion_tokens += completion
        t.cached_tokens += cached
    return tallies
