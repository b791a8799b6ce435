"""Fair share: which queued job a worker claims next. A broker message is a ticket for one claim.

Best first:
1. ``priority + queued_at // aging`` (Unix seconds): lower runs first, and a job gains one point on every
   job submitted ``aging`` seconds after it. A job is passed only by better-priority jobs submitted less
   than (its priority - theirs) × aging seconds after it, so no priority level waits forever.
2. Its key's jobs running now on this model, fewest first: a free seat goes to the key that holds the
   fewest, so keys with work waiting share the seats evenly whatever their backlogs (NULL, auth off, is
   one more key).
3. ``deadline_at`` (a batch's completion_window), earliest first; a job without one after those with one.
4. ``queued_at``, then id: first come, first served.
"""

from sqlalchemy import Integer, case, cast, extract, literal
from sqlalchemy.sql import ColumnElement

from core.models import Job


def fair_order(running: dict[str | None, int], aging: float) -> list[ColumnElement[object]]:
    """ORDER BY for queued jobs; ``running``: each key's running jobs on the model (absent: none)."""
    aged = cast(extract("epoch", Job.queued_at) / aging, Integer)
    held: ColumnElement[int] = literal(0)
    if running:
        held = case(
            *((Job.key_id.is_(None) if key is None else Job.key_id == key, n) for key, n in running.items()),
            else_=0,
        )
    return [Job.priority + aged, held, Job.deadline_at.asc().nulls_last(), Job.queued_at, Job.id]
