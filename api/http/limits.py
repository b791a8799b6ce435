"""Each key's limits, checked at submission: a refused request enqueues nothing.

- ``requests_per_second`` and ``tokens_per_minute``: fixed-window counters from the ``limits`` library,
  in Redis on the real deployment (one atomic INCRBY+EXPIRE script per check, shared by every API
  process) and in this process in the embedded mode. Tokens are the prompt's plus the max_tokens asked
  for, charged when the job is accepted; they are not given back when it ends early.
- ``max_active_jobs``: the key's queued and running jobs, counted in the database (``ix_jobs_key_id_status``)
  in the transaction that inserts the new ones, after ``hold_keys`` has locked the key (its row, FOR
  UPDATE, on PostgreSQL; SQLite's one write lock): concurrent submissions of a key, from any number of
  API processes, are counted one after another, so the limit holds exactly. Nothing is held that a
  crash or a cancel would have to give back: a cancelled, failed or finished job stops counting when
  its row says so, and a killed worker's jobs count until the reconciler requeues them and they end.
- the largest ``max_tokens``, ``n`` (or beam width) and prompt: a 422 (400 on OpenAI's routes), since
  retrying cannot help (the ``openai`` SDK retries a 429 by itself).

A refusal is a 429 with ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers.
"""

import math
import time
from collections.abc import Iterable
from fractions import Fraction

from limits import RateLimitItem, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.storage import MemoryStorage, Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from api.http.caller import Caller, Limits
from api.http.problems import Invalid, TooMany
from core.models import ApiKey, Job
from core.states import JobStatus

ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)
ACTIVE_RETRY_S = 5  # a key at max_active_jobs waits for some of its jobs to end: no time is known


class KeyLimiter:
    def __init__(self, redis_url: str | None) -> None:
        storage: Storage = storage_from_string(redis_url) if redis_url else MemoryStorage()
        self._windows = FixedWindowRateLimiter(storage)

    def request(self, caller: Caller) -> None:
        """Counts one submission of the caller's key; 429 past its requests_per_second."""
        if caller.limits is None:
            return
        self._hit(caller, rate_window(caller.limits.requests_per_second), 1, "requests")

    def tokens(self, caller: Caller, tokens: int) -> None:
        """Charges a submission's tokens (prompt + max_tokens); 429 past the key's tokens_per_minute."""
        if caller.limits is None:
            return
        self._hit(caller, RateLimitItemPerMinute(caller.limits.tokens_per_minute), tokens, "tokens")

    def _hit(self, caller: Caller, item: RateLimitItem, cost: int, what: str) -> None:
        if self._windows.hit(item, caller.key_id or "", what, cost=cost):
            return
        stats = self._windows.get_window_stats(item, caller.key_id or "", what)
        wait = max(1, math.ceil(stats.reset_time - time.time()))
        headers = {
            "Retry-After": str(wait),
            f"x-ratelimit-limit-{what}": str(item.amount),
            f"x-ratelimit-remaining-{what}": str(stats.remaining),
            f"x-ratelimit-reset-{what}": f"{wait}s",
        }
        per = "minute" if isinstance(item, RateLimitItemPerMinute) else "second"
        per = f"{item.multiples} {per}s" if item.multiples > 1 else per
        setting = "PAGEDQ_KEY_REQUESTS_PER_SECOND" if what == "requests" else "PAGEDQ_KEY_TOKENS_PER_MINUTE"
        message = f"rate limit: key {caller.name!r} may use {item.amount} {what} per {per} "
        message += f"({setting} or the key's own); this request needs {cost}; retry in {wait} s"
        raise TooMany(message, headers)


def rate_window(per_second: float) -> RateLimitItem:
    """``per_second`` as a whole number of requests per whole number of seconds (at most a minute):
    1.5/s is 3 per 2 s, 0.25/s 1 per 4 s; a rate under one a minute is one a minute."""
    rate = Fraction(per_second).limit_denominator(60)
    if rate.numerator == 0:
        return RateLimitItemPerMinute(1)
    return RateLimitItemPerSecond(rate.numerator, rate.denominator)


def check_sizes(limits: Limits, prompt_tokens: int, max_tokens: int, n: int, loc: tuple[str, ...]) -> None:
    for name, value, limit in (
        ("max_tokens", max_tokens, limits.max_tokens),
        ("n", n, limits.max_n),
        ("prompt", prompt_tokens, limits.max_prompt_tokens),
    ):
        if limit is not None and value > limit:
            what = "tokens" if name == "prompt" else ""
            message = (
                f"{name} is {value} {what}".rstrip()
                + f"; this key accepts at most {limit} (its {name} limit)"
            )
            raise Invalid((*loc, name), message, "key_limit_exceeded")


def hold_keys(session: Session, key_ids: Iterable[str]) -> None:
    """Until this transaction ends, no other counts or adds these keys' active jobs. Taken in one order
    (sorted), so two transactions holding several keys cannot wait on each other."""
    ordered = sorted(set(key_ids))
    if not ordered:
        return
    if session.get_bind().dialect.name == "sqlite":  # a write takes the database's one write lock
        session.execute(update(ApiKey).where(ApiKey.id.in_(ordered)).values(prefix=ApiKey.prefix))
        return
    session.execute(
        select(ApiKey.id).where(ApiKey.id.in_(ordered)).order_by(ApiKey.id).with_for_update(key_share=True)
    )


def check_active(session: Session, caller: Caller, adding: int, inserted: bool = False) -> None:
    """429 when the key's queued and running jobs plus ``adding`` would exceed its max_active_jobs;
    ``inserted``: this transaction has already inserted those ``adding`` jobs (a batch's). Exact when the
    transaction holds the key (``hold_keys``), else a first look that may race."""
    if caller.limits is None or caller.key_id is None:
        return
    existing = active_jobs(session, caller.key_id) - (adding if inserted else 0)
    if existing + adding > caller.limits.max_active_jobs:
        raise too_many_active(caller, existing, adding)


def active_jobs(session: Session, key_id: str) -> int:
    counted = select(func.count()).select_from(Job).where(Job.key_id == key_id, Job.status.in_(ACTIVE))
    return session.scalar(counted) or 0


def too_many_active(caller: Caller, existing: int, adding: int) -> TooMany:
    assert caller.limits is not None
    limit = caller.limits.max_active_jobs
    headers = {
        "Retry-After": str(ACTIVE_RETRY_S),
        "x-ratelimit-limit-active-jobs": str(limit),
        "x-ratelimit-remaining-active-jobs": str(max(0, limit - existing)),
    }
    message = f"max_active_jobs: key {caller.name!r} may have {limit} queued or running jobs "
    message += (
        f"(PAGEDQ_KEY_MAX_ACTIVE_JOBS or the key's own); it has {existing} and this request adds {adding}"
    )
    return TooMany(message, headers)


def counted(caller: Caller) -> bool:
    """Whether ``caller``'s key has a max_active_jobs that a write of its job must count (``admit``)."""
    return bool(caller.limits and caller.key_id)


def admit(session: Session, callers: list[Caller]) -> dict[int, TooMany]:
    """Before a transaction inserts one job for each of ``callers``: holds their keys that have a
    max_active_jobs and counts each one's active jobs once; the jobs (by index) that would take their
    key past its limit, each with its refusal."""
    limited = [(i, caller, caller.key_id) for i, caller in enumerate(callers) if counted(caller)]
    hold_keys(session, [key_id for _, _, key_id in limited])
    counts = {key_id: active_jobs(session, key_id) for key_id in {key_id for _, _, key_id in limited}}
    refused = {}
    for i, caller, key_id in limited:
        assert caller.limits is not None
        if counts[key_id] + 1 > caller.limits.max_active_jobs:
            refused[i] = too_many_active(caller, counts[key_id], 1)
        else:
            counts[key_id] += 1
    return refused
