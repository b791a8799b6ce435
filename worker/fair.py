"""Fair share: which queued job a worker claims next. A broker message is a ticket for one claim.

Best first:
1. ``priority + queued_at // aging`` (Unix seconds): lower runs first, and a job gains one point on every
   job submitted ``aging`` seconds after it. A job is passed only by better-priority jobs submitted less
   than (its priority - theirs) × aging seconds after it, so no priority level waits forever.
2. Its key's jobs running now on this model, fewest first: a free seat goes to the key that holds the
   fewest, so keys with work waiting share the seats evenly whatever their backlogs (NULL, auth off, is
   one more key).
3. ``deadline_at`` (a batch's completion_window), earliest first; a job without one after those with one.
4. ``queued_at``: first come, first served.
5. With prefix-aware order (``PAGEDQ_PREFIX_AWARE_ORDER``), among the jobs submitted with the fairest one
   (its owner's, at its priority, window and queued_at: a batch's lines), those whose prefix key this
   worker holds (its runs, its engine's cache), then those no other worker holds, then the rest. A worker
   that claimed a document's first line so claims its other lines next: a batch runs document by
   document, in the order of each document's first line, and two workers take different documents.
6. id (a batch's lines: input order).

How it is found without reading every queued row (PostgreSQL): queued jobs fall into groups of one owner,
one priority and one window (``deadline_at - queued_at``: a job's completion_window, exactly, for jobs and
batch lines alike). Within a group the order above is the order of (queued_at, id): the aged
priority and the deadline only grow with queued_at, the owner's running jobs are one number. So the
fairest job is the fairest of the groups' first rows. ``ix_jobs_fair_heads`` holds the queued jobs in
exactly that order; the pick walks it group to group (a recursive skip scan, one index probe per group),
takes each group's first row, and orders those few by the rule above; step 5 then probes the fairest
row's batch for a line whose key this worker holds (``ix_jobs_queued_prefix``, a probe per key), when it
has one: the same statement says whether the fairest row was submitted with others (``shared``). The cost is
per group (owners x priorities x windows in the queue), not per queued job. SQLite (the embedded mode) does
the same through ``ix_jobs_fair_heads_lite`` and ``ix_jobs_queued_prefix_lite`` (``_lite_heads``,
``lite_probes``), with correlated subqueries where it has no LATERAL.
"""

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Integer,
    Interval,
    Select,
    String,
    all_,
    bindparam,
    case,
    cast,
    exists,
    extract,
    func,
    literal,
    literal_column,
    not_,
    or_,
    select,
    true,
    tuple_,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import aliased
from sqlalchemy.orm.util import AliasedClass
from sqlalchemy.sql import ColumnElement

from core.models import Job, UTCDateTime, lite_window
from core.states import JobStatus

# A group of queued jobs: owner (NULL, auth off, is '' here), priority, window (none: -1 s).
GROUP = (
    literal_column("coalesce(jobs.key_id, '')"),
    Job.priority,
    literal_column("coalesce(jobs.deadline_at - jobs.queued_at, interval '-1 second')"),
)
NO_WINDOW = timedelta(seconds=-1)
NO_DEADLINE = literal(datetime(9999, 12, 31, tzinfo=UTC), UTCDateTime)  # after every deadline
# Literals, not bound values: the planner proves ix_jobs_fair_heads' predicate whatever plan it caches, and
# a claim's prepared statements get a generic plan that reads the few queued or running rows through
# their indexes. With a bound status that plan guessed a fifth of the table, so PostgreSQL planned the
# pick anew at every claim: ~1 ms of a 2 ms take (bench/RESULTS.md, 2026-11-29).
QUEUED = literal_column(f"jobs.status = '{JobStatus.QUEUED.value}'")
RUNNING = literal_column(f"jobs.status = '{JobStatus.RUNNING.value}'")
QUEUED_ROWS = (QUEUED, not_(Job.cancel_requested))


@dataclass(frozen=True)
class Prefixes:
    """Prefix keys held: by this worker (its runs, its engine's cache) and by the others."""

    mine: frozenset[int] = frozenset()
    others: frozenset[int] = frozenset()

    def rank(self) -> ColumnElement[int]:
        """0: held here; 1: held by no worker (or no key); 2: held by another worker."""
        whens = [(Job.prefix_key.in_(self.mine), 0)] if self.mine else []
        whens += [(Job.prefix_key.in_(self.others), 2)] if self.others else []
        return case(*whens, else_=1) if whens else literal(1)


def fair_order(
    running: dict[str | None, int], aging: float, prefixes: Prefixes | None = None
) -> list[ColumnElement[object]]:
    """ORDER BY for queued jobs; ``running``: each key's running jobs on the model (absent: none);
    ``prefixes``: the prefix keys held (step 5), None: no preference."""
    held: ColumnElement[int] = literal(0)
    if running:
        held = case(
            *((Job.key_id.is_(None) if key is None else Job.key_id == key, n) for key, n in running.items()),
            else_=0,
        )
    order = _steps_1_to_4(held, aging)
    if prefixes is not None:
        order.append(prefixes.rank())
    return [*order, Job.id]


def aged_priority(aging: float) -> ColumnElement[int]:
    """Step 1: ``priority + queued_at // aging``, lower runs first."""
    return Job.priority + cast(extract("epoch", Job.queued_at) / aging, Integer)


def turn(aging: float) -> tuple[ColumnElement[object], ...]:
    """Steps 1, 3 and 4 as values that compare in order (a row comparison): what runs before a job,
    its owner's share apart (worker/estimates.py)."""
    return aged_priority(aging), func.coalesce(Job.deadline_at, NO_DEADLINE), Job.queued_at


def _steps_1_to_4(held: ColumnElement[int], aging: float) -> list[ColumnElement[object]]:
    """Aged priority, the owner's ``held`` jobs, deadline, arrival: the order every pick shares."""
    return [aged_priority(aging), held, Job.deadline_at.asc().nulls_last(), Job.queued_at]


# The ids of ``skip``, bound when a statement runs (``skipping``), so that it is built once per model. Twice:
# an expanding parameter renders an empty list once for all its uses, right for IN or for NOT IN, not both.
SKIP, SKIP_HELD = bindparam("skip", expanding=True), bindparam("skip_held", expanding=True)


def skipping(skip: Collection[str]) -> dict[str, list[str]]:
    """The parameters of ``fairest`` (and of other statements with ``SKIP``)."""
    ids = sorted(skip)
    return {"skip": ids, "skip_held": ids}


@cache
def fairest(
    model: str, aging: float, dialect: str
) -> Select[tuple[str, int | None, str | None, int, datetime | None, datetime, bool]]:
    """The fairest queued job of ``model`` but those in ``skip`` (bound: ``skipping``; steps 1-4
    and 6, no prefix preference), with what ``Submitted`` needs, through the groups' heads of
    ``dialect`` (PostgreSQL's or SQLite's), and ``shared``: whether other queued jobs (not in ``skip``)
    were submitted with it, among which step 5 may choose. Step 2's count is read in the same statement:
    each key's jobs running on the model or in ``skip`` (being claimed here)."""
    queued = [*_queued(model, ()), Job.id.not_in(SKIP)]
    candidates = (_lite_heads if dialect == "sqlite" else _heads)(model, queued)
    owner = func.coalesce(Job.key_id, "")
    held_here = or_(RUNNING, Job.id.in_(SKIP_HELD))
    held = select(owner.label("owner"), func.count().label("n")).where(Job.model == model, held_here)
    held = held.group_by(owner).subquery("held")
    order = _steps_1_to_4(func.coalesce(held.c.n, 0), aging)
    group = lite_group(Job) if dialect == "sqlite" else GROUP
    columns = (Job.id, Job.prefix_key, Job.key_id, Job.priority, Job.deadline_at, Job.queued_at)
    named = (*columns, *(c.label(f"g{i}") for i, c in enumerate(group)))
    best = select(*named).outerjoin(held, held.c.owner == owner).where(Job.id.in_(candidates))
    best = best.order_by(*order, Job.id).limit(1).subquery("best")
    values = (best.c[f"g{i}"] for i in range(len(group)))
    mates = select(Job.id).where(*submitted_with(model, group, values, best.c.queued_at), Job.id != best.c.id)
    return select(*(best.c[c.key] for c in columns), exists(mates).label("shared"))


@dataclass(frozen=True)
class Submitted:
    """The rows submitted with the fairest job: its owner's, at its priority, window and queued_at (a
    batch's lines). Step 5 reorders only these: it cannot pass a better job (steps 1-4 are theirs)."""

    model: str
    skip: Collection[str]
    key_id: str | None
    priority: int
    deadline_at: datetime | None
    queued_at: datetime
    dialect: str  # "sqlite": lite_probes; else PostgreSQL's, by GROUP so that ix_jobs_fair_heads finds them

    def first_mine(self, connection: Connection, prefixes: Prefixes) -> str | None:
        """The first of them whose prefix this worker holds: a probe per key."""
        return self._probe(0, connection, prefixes)

    def first_free(self, connection: Connection, prefixes: Prefixes) -> str | None:
        """The first of them whose prefix no other worker holds (skipping those the others hold)."""
        return self._probe(1, connection, prefixes)

    def _probe(self, which: int, connection: Connection, prefixes: Prefixes) -> str | None:
        """Probe ``which`` (0: mine, 1: free) of the dialect's pair, each built once and bound here."""
        bound = {"owner": self.key_id or "", "priority": self.priority, "queued": self.queued_at}
        mine, others = sorted(prefixes.mine), sorted(prefixes.others)
        if self.dialect == "sqlite":  # the keys as JSON, the deadline itself (its window is SQLite's)
            keys = {"mine": json.dumps(mine), "others": json.dumps(others)}
            bound |= keys | {"deadline": self.deadline_at, "skip": sorted(self.skip)}
            return connection.execute(lite_probes(self.model)[which], bound).scalar()
        window = NO_WINDOW if self.deadline_at is None else self.deadline_at - self.queued_at
        bound |= skipping(self.skip) | {"window": window, "mine": mine, "others": others}
        return connection.execute(pg_probes(self.model)[which], bound).scalar()


def lite_group(jobs: type[Job] | AliasedClass[Job]) -> tuple[ColumnElement[object], ...]:
    """GROUP on SQLite, whose datetimes are text. Literals, not bound parameters, so that the expressions
    are ``ix_jobs_fair_heads_lite``'s."""
    owner = func.coalesce(jobs.key_id, literal_column("''"))
    return owner, jobs.priority, lite_window(jobs.deadline_at, jobs.queued_at)


@cache
def pg_probes(model: str) -> tuple[Select[tuple[str]], Select[tuple[str]]]:
    """Step 5's two probes on PostgreSQL, ``first_mine``'s and ``first_free``'s, built once and bound by
    ``Submitted._probe``: the keys as arrays, so that a probe is one statement text whatever the number
    of keys, and its plan is reused (a VALUES row or an IN item per key made a new statement, compiled and
    planned at every pick, for a worker holding many runs)."""
    group = (
        bindparam("owner", type_=String),
        bindparam("priority", type_=Integer),
        bindparam("window", type_=Interval),
    )
    queued = bindparam("queued", type_=UTCDateTime)
    rows = select(Job.id).where(*submitted_with(model, GROUP, group, queued))
    keys = func.unnest(bindparam("mine", type_=ARRAY(BigInteger)))
    held = keys.table_valued("key").render_derived(name="held")  # unnest(:mine) AS held(key)
    first = rows.where(Job.prefix_key == held.c.key).order_by(Job.id).limit(1).lateral("first")
    mine = select(first.c.id).select_from(held).join(first, true()).order_by(first.c.id).limit(1)
    others = all_(bindparam("others", type_=ARRAY(BigInteger)))
    free = or_(Job.prefix_key.is_(None), Job.prefix_key != others)
    return mine, rows.where(free).order_by(Job.id).limit(1)


@cache
def lite_probes(model: str) -> tuple[Select[tuple[str | None]], Select[tuple[str]]]:
    """Step 5's two probes on SQLite, ``first_mine``'s and ``first_free``'s, built once (building them
    cost more than running them) and bound by ``Submitted._probe``: the keys as JSON tables (no
    VALUES list or LATERAL there); ``ix_jobs_queued_prefix_lite`` and ``ix_jobs_fair_heads_lite``."""
    deadline, queued = bindparam("deadline", type_=UTCDateTime), bindparam("queued", type_=UTCDateTime)
    group = (
        bindparam("owner", type_=String),
        bindparam("priority", type_=Integer),
        lite_window(deadline, queued),
    )
    rows = select(Job.id).where(*submitted_with(model, lite_group(Job), group, queued))
    held = func.json_each(bindparam("mine", type_=String)).table_valued("value")
    first = rows.where(Job.prefix_key == held.c.value).order_by(Job.id).limit(1).scalar_subquery()
    others = func.json_each(bindparam("others", type_=String)).table_valued("value")
    free = or_(Job.prefix_key.is_(None), Job.prefix_key.not_in(select(others.c.value)))
    return select(func.min(first)).select_from(held), rows.where(free).order_by(Job.id).limit(1)


def submitted_with(
    model: str,
    group: Sequence[ColumnElement[object]],
    values: Iterable[object],
    queued: ColumnElement[object],
) -> list[ColumnElement[bool]]:
    """Where-clauses of the queued jobs of ``model`` (but those in ``skip``) submitted with a job: its group
    (``group``'s expressions equal to ``values``) at its ``queued_at`` (``queued``): among them step 5
    chooses. Written as ``ix_jobs_fair_heads`` (or its SQLite twin) is, so that a probe walks it."""
    same = (c == v for c, v in zip(group, values, strict=True))
    return [*_queued(model, ()), Job.id.not_in(SKIP), *same, Job.queued_at == queued]


def _queued(model: str, skip: Collection[str]) -> list[ColumnElement[bool]]:
    queued = [Job.model == model, *QUEUED_ROWS]
    if skip:
        queued.append(Job.id.not_in(skip))
    return queued


def _heads(model: str, queued: list[ColumnElement[bool]]) -> Select[tuple[str]]:
    """The first row of every group of queued jobs: candidates that hold the fairest."""
    ours = (Job.model == model, *QUEUED_ROWS)  # a group is found whatever ``skip`` holds
    named = [c.label(f"g{i}") for i, c in enumerate(GROUP)]
    groups = select(*named).where(*ours).order_by(*GROUP).limit(1).cte("fair_groups", recursive=True)
    after = tuple_(*GROUP) > tuple_(*groups.c)
    following = select(*named).where(*ours, after).order_by(*GROUP).limit(1).lateral("next_group")
    groups = groups.union_all(select(*following.c).select_from(groups).join(following, true()))
    in_group = (c == g for c, g in zip(GROUP, groups.c, strict=True))
    order = (Job.queued_at, Job.id)  # the index's, in a group
    head = select(Job.id).where(*queued, *in_group).order_by(*order).limit(1).lateral("head")
    return select(head.c.id).select_from(groups).join(head, true())


def _lite_heads(model: str, queued: list[ColumnElement[bool]]) -> Select[tuple[str]]:
    """``_heads`` on SQLite, which has no LATERAL: the recursion carries a row of each group, from which
    correlated subqueries find the next group's first row and the group's first row not in ``skip``, each
    by a probe of ``ix_jobs_fair_heads_lite``."""
    ours = (Job.model == model, *QUEUED_ROWS)
    in_order = (*lite_group(Job), Job.queued_at, Job.id)

    def first(*where: ColumnElement[bool], equal: int = 0) -> ColumnElement[str]:
        """The first row in ``where``, whose first ``equal`` group columns are fixed: left out of the order,
        or SQLite sorts the rows rather than walk the index."""
        return select(Job.id).where(*ours, *where).order_by(*in_order[equal:]).limit(1).scalar_subquery()

    row = aliased(Job, name="group_row")
    (g0, g1, g2), (r0, r1, r2) = lite_group(Job), lite_group(row)
    # The next group: after the row's in its last column, else its middle one, else its first; as three
    # probes, since SQLite walks an index range for one column past equal ones, not for a row value.
    following = func.coalesce(
        first(g0 == r0, g1 == r1, g2 > r2, equal=2), first(g0 == r0, g1 > r1, equal=1), first(g0 > r0)
    )
    groups = select(first().label("id")).cte("fair_groups", recursive=True)
    groups = groups.union_all(select(following).select_from(groups).join(row, row.id == groups.c.id))
    head = (
        select(Job.id).where(*queued, g0 == r0, g1 == r1, g2 == r2).order_by(Job.queued_at, Job.id).limit(1)
    )
    return select(head.scalar_subquery()).select_from(groups).join(row, row.id == groups.c.id)
