"""A running batch's estimated end, every reconcile round, and its one ``batch.at_risk`` event.

Work is counted in one unit on both sides: a job's ``prompt_tokens + max_tokens``, of which an
unfinished job has done its prompt once its first token came and the tokens it has generated. The
model's rate is that work, done by its jobs that ended or ran in the last ``RATE_WINDOW``, over the time
since the first of them started, so it is what the model's workers did lately, whatever their number,
their seats or their prefix cache hits. A batch's remaining work is its own unfinished jobs' and that of
every job of its model running now or queued ahead of it in fair share's order (worker/fair.py steps 1, 3
and 4: ``priority + queued_at // aging``, then deadline, then queued_at); its ``estimated_completion_at``
is now + that work / the rate. Jobs that arrive later with a better rank will push it back: it is an
estimate, redone every round. A batch whose estimate is past its ``expires_at`` is at risk:
``at_risk_at`` is set and ``batch.at_risk`` recorded, once.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, case, func, or_, select, true, tuple_
from sqlalchemy.orm import Session

from core.models import Batch, Job, utcnow
from core.states import BatchStatus, JobStatus
from core.webhooks import Outbox
from worker.fair import turn

RATE_WINDOW = timedelta(minutes=10)
UNFINISHED = (JobStatus.QUEUED, JobStatus.RUNNING)


@dataclass
class Estimator:
    outbox: Outbox

    def estimate(self, session: Session) -> list[str]:
        """Estimates every running batch; returns the deliveries of new ``batch.at_risk`` events."""
        now, deliveries = utcnow(), []
        rates: dict[str, float | None] = {}
        running = select(Batch).where(Batch.status == BatchStatus.IN_PROGRESS, Batch.expired_at.is_(None))
        for batch in session.scalars(running):
            model = batch.model or ""
            if model not in rates:
                rates[model] = rate(session, model, now)
            if rates[model] is None:
                continue  # nothing ended lately: no measured rate yet
            seconds = remaining(session, batch, self.outbox.settings.fair_aging_seconds) / rates[model]
            batch.estimated_completion_at = now + timedelta(seconds=seconds)
            late = batch.expires_at is not None and batch.estimated_completion_at > batch.expires_at
            if late and batch.at_risk_at is None:
                batch.at_risk_at = now
                session.flush()
                deliveries += self.outbox.record(session, "batch.at_risk", batch=batch)
        return deliveries


# A job's work: its prompt and max tokens; what an unfinished one has done of it: its prompt once its first
# token came (the prefill is over), and the tokens it generated (so a running job's work counts as it goes).
MAX_TOKENS = func.coalesce(Job.params["max_tokens"].as_integer(), 0)
WORK = Job.prompt_tokens + MAX_TOKENS
# min(completion, max_tokens), spelled as a CASE: SQLite has no least()
GENERATED = case((Job.completion_tokens < MAX_TOKENS, Job.completion_tokens), else_=MAX_TOKENS)
DONE = case((Job.first_token_at.is_(None), 0), else_=Job.prompt_tokens + GENERATED)


def rate(session: Session, model: str, now: datetime) -> float | None:
    """Work per second of the model's jobs within ``RATE_WINDOW``: those that ended in it and the done
    part of those running since it began, over the time since the first of them started. Without the
    running ones a batch's first rate, once a single job has ended, would leave out the work of every
    seat beside it."""
    since = now - RATE_WINDOW
    ended = Job.finished_at > since
    running = and_(Job.status == JobStatus.RUNNING, Job.started_at > since)
    done = func.sum(case((Job.status == JobStatus.RUNNING, DONE), else_=WORK))
    lately = (Job.model == model, Job.started_at.is_not(None), or_(ended, running))
    work, first = session.execute(select(done, func.min(Job.started_at)).where(*lately)).one()
    if not work or first is None:
        return None
    return float(work) / max((now - first).total_seconds(), 1.0)


def remaining(session: Session, batch: Batch, aging: float) -> float:
    """The unfinished work of the batch and of every job of its model that runs before it or beside it:
    those running now and those queued ahead of it in fair share's steps 1, 3 and 4 (aged priority,
    deadline, queued_at). A batch submitted seconds after another shares its aged priority, not its turn."""
    its_turn = turn(aging)
    own = select(*(column.label(f"own{i}") for i, column in enumerate(its_turn)))
    own = own.where(Job.batch_id == batch.id).limit(1).subquery()
    ahead = or_(Job.status == JobStatus.RUNNING, tuple_(*its_turn) <= tuple_(*own.c))
    left = select(func.coalesce(func.sum(WORK - DONE), 0)).select_from(Job).join(own, true())
    left = left.where(Job.model == batch.model, Job.status.in_(UNFINISHED), ahead)
    return float(session.scalar(left) or 0)
