"""Each key's limits, checked at submission: a refused request enqueues nothing.

- ``requests_per_second`` and ``tokens_per_minute``: fixed-window counters from the ``limits`` library,
  in Redis on the real deployment (one atomic INCRBY+EXPIRE script per check, shared by every API
  process) and in this process in the embedded mode. Tokens are the prompt's plus the max_tokens asked
  for, charged when the job is accepted; they are not given back when it ends early.
- ``max_active_jobs``: the key's queued and running jobs, counted in the database (``ix_jobs_key_id_status``)
  when it submits. Nothing is held that a crash or a cancel would have to give back: a cancelled, failed
  or finished job stops counting when its row says so, and a killed worker's jobs count until the
  reconciler requeues them and they end. Concurrent submissions may each see room for one more, so a
  key can exceed the limit by the submissions it has in flight at one instant.
- the largest ``max_tokens``, ``n`` (or beam width) and prompt: a 422 (400 on OpenAI's routes), since
  retrying cannot help (the ``openai`` SDK retries a 429 by itself).

A refusal is a 429 with ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers.
"""

import math
import time

from limits import RateLimitItem, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.storage import MemoryStorage, Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.http.caller import Caller, Limits
from api.http.problems import Invalid, TooMany
from core.models import Job
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
        rate = caller.limits.requests_per_second
        window = (
            RateLimitItemPerSecond(int(rate))
            if rate >= 1
            else RateLimitItemPerMinute(max(1, round(rate * 60)))
        )
        self._hit(caller, window, 1, "requests")

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
        per = "second" if isinstance(item, RateLimitItemPerSecond) else "minute"
        setting = "PAGEDQ_KEY_REQUESTS_PER_SECOND" if what == "requests" else "PAGEDQ_KEY_TOKENS_PER_MINUTE"
        message = f"rate limit: key {caller.name!r} may use {item.amount} {what} per {per} "
        message += f"({setting} or the key's own); this request needs {cost}; retry in {wait} s"
        raise TooMany(message, headers)


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


def check_active(session: Session, caller: Caller, adding: int, inserted: bool = False) -> None:
    """429 when the key's queued and running jobs plus ``adding`` would exceed its max_active_jobs;
    ``inserted``: this transaction has already inserted those ``adding`` jobs (a batch's)."""
    if caller.limits is None:
        return
    limit = caller.limits.max_active_jobs
    counted = select(func.count()).select_from(Job).where(Job.key_id == caller.key_id, Job.status.in_(ACTIVE))
    existing = (session.scalar(counted) or 0) - (adding if inserted else 0)
    if existing + adding <= limit:
        return
    headers = {
        "Retry-After": str(ACTIVE_RETRY_S),
        "x-ratelimit-limit-active-jobs": str(limit),
        "x-ratelimit-remaining-active-jobs": str(max(0, limit - existing)),
    }
    message = f"max_active_jobs: key {caller.name!r} may have {limit} queued or running jobs "
    message += (
        f"(PAGEDQ_KEY_MAX_ACTIVE_JOBS or the key's own); it has {existing} and this request adds {adding}"
    )
    raise TooMany(message, headers)
