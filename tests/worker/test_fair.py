"""The claim's pick (worker/fair.py, ``JobStore.pick``) on the real PostgreSQL: through the groups' heads of
``ix_jobs_fair_heads`` it finds the same job as ordering every queued row by ``fair_order`` (priority with
aging, the keys' running jobs, deadline, arrival; with prefix-aware order, the prefix keys held), and it
reads a few rows per group, not every queued row."""

import json
import random
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import event, or_, select, text

from api.batches.bulk_insert import insert_jobs
from core import keys
from core.db import autocommitting, make_db_engine, make_sessionmaker
from core.models import Job, utcnow
from core.settings import Settings
from core.states import JobStatus
from migrations import upgrade
from tests.support.bulk_jobs import job_row, shared_values
from tests.support.roles import MODEL
from worker.fair import Prefixes, fair_order, fairest, skipping
from worker.store import JobStore, prefix_holders, prefixes_held

AGING = 30.0


@pytest.fixture
def store(service_settings: Settings) -> Iterator[JobStore]:
    engine = make_db_engine(service_settings)
    yield JobStore(make_sessionmaker(engine), MODEL, fair_aging=AGING)
    engine.dispose()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[JobStore]:
    """The embedded mode's database: the plain ordered query, and step 5 without the index."""
    settings = Settings(database_url=f"sqlite:///{tmp_path}/pagedq.db", data_dir=tmp_path)
    upgrade(settings)
    engine = make_db_engine(settings)
    yield JobStore(make_sessionmaker(engine), MODEL, fair_aging=AGING)
    engine.dispose()


def fill(store: JobStore, rng: random.Random, lines: int) -> list[int]:
    """Queued jobs of three keys and no key: batches (lines sharing queued_at and deadline, a few prefix
    keys among them) and online jobs over the last few minutes, some cancelled, some running; returns the
    prefix keys used."""
    now, prefixes = utcnow(), [rng.getrandbits(62) for _ in range(12)]
    with store.sessions.begin() as session:
        owners: list[str | None] = [keys.create(session, f"k{i}")[0].id for i in range(3)]
        session.flush()
        owners.append(None)
        rows: list[Job] = []
        while len(rows) < lines:
            owner, priority = rng.choice(owners), rng.choice((0, 0, 3, 10))
            if rng.random() < 0.4:  # a batch
                queued = now - timedelta(seconds=rng.uniform(0, 600))
                deadline = queued + timedelta(hours=rng.choice((1, 24)))
                mine = rng.sample(prefixes, 3)
                rows += [job(owner, priority, queued, deadline, rng.choice([*mine, None])) for _ in range(20)]
            else:
                queued = now - timedelta(seconds=rng.uniform(0, 600))
                deadline = queued + timedelta(hours=1) if rng.random() < 0.3 else None
                rows.append(job(owner, priority, queued, deadline, rng.choice(prefixes)))
        for row in rng.sample(rows, len(rows) // 10):
            row.status = rng.choice((JobStatus.RUNNING, JobStatus.SUCCEEDED))
        for row in rng.sample(rows, len(rows) // 20):
            row.cancel_requested = True
        session.add_all(rows)
    return prefixes


def job(owner: str | None, priority: int, queued: object, deadline: object, prefix: int | None) -> Job:
    return Job(
        model=MODEL,
        key_id=owner,
        priority=priority,
        queued_at=queued,
        deadline_at=deadline,
        prefix_key=prefix,
        prompt_token_ids=[1],
        params={"max_tokens": 4},
    )


def reference(store: JobStore, skip: set[str], prefixes: Prefixes | None) -> str | None:
    """Every queued row, ordered: the rule as written."""
    with store.sessions() as session:
        held_here = or_(Job.status == JobStatus.RUNNING, Job.id.in_(skip))
        held = Counter(session.scalars(select(Job.key_id).where(Job.model == MODEL, held_here)))
        queued = (Job.model == MODEL, Job.status == JobStatus.QUEUED, Job.cancel_requested.is_(False))
        statement = (
            select(Job.id).where(*queued, Job.id.not_in(skip)).order_by(*fair_order(held, AGING, prefixes))
        )
        return session.scalar(statement.limit(1))


def held_prefixes(store: JobStore, skip: set[str]) -> Prefixes:
    """What the pick takes as held: this worker's jobs' prefix keys (``skip``), and the others' running."""
    with store.sessions() as session:
        has_key = Job.prefix_key.is_not(None)
        running = session.execute(
            select(Job.id, Job.prefix_key).where(Job.status == JobStatus.RUNNING, has_key)
        )
        mine = session.scalars(select(Job.prefix_key).where(Job.id.in_(skip), has_key))
        return Prefixes(frozenset(mine), frozenset(key for job_id, key in running if job_id not in skip))


def claim_all(store: JobStore, rng: random.Random, prefix_aware: bool) -> int:
    """Claim one by one, each pick against the reference, with some claimed jobs held as this worker's."""
    store.prefix_aware = prefix_aware
    picks, skip = 0, set[str]()
    while True:
        prefixes = held_prefixes(store, skip) if prefix_aware else None
        expected = reference(store, skip, prefixes)
        assert store.pick("any", skip) == expected
        if expected is None:
            return picks
        picks += 1
        assert store.claim(expected, "w-here" if rng.random() < 0.5 else "w-other") is not None
        if rng.random() < 0.3:
            skip.add(expected)  # held here: its key's count and its prefix are this worker's


@pytest.mark.parametrize("prefix_aware", [False, True])
def test_the_pick_is_the_fairest_queued_job_as_every_row_ordered_would_say(store, prefix_aware):
    rng = random.Random(31 + prefix_aware)
    fill(store, rng, 160)
    assert claim_all(store, rng, prefix_aware) > 100


def test_on_sqlite_too(sqlite_store):
    rng = random.Random(7)
    fill(sqlite_store, rng, 80)
    assert claim_all(sqlite_store, rng, prefix_aware=True) > 50


def test_a_batch_runs_prefix_by_prefix_those_held_here_first(store):
    """One batch: lines of three prefixes, shuffled. Holding one prefix here, its lines come first; then,
    of the two others, the one another worker does not hold, each run through once its first line is
    claimed here; then the one the other worker holds."""
    store.prefix_aware = True
    now = utcnow()
    low, middle, high = 1, 2, 3
    with store.sessions.begin() as session:
        lines = [job(None, 10, now, now + timedelta(hours=1), key) for key in [low, middle, high] * 4]
        random.Random(5).shuffle(lines)
        held = [job(None, 10, now, None, middle), job(None, 10, now, None, high)]  # running: here, elsewhere
        for running, worker in zip(held, ("w", "w-other"), strict=True):
            running.status, running.worker_id = JobStatus.RUNNING, worker
        session.add_all(lines + held)
    order = []
    # Runs of this worker are its own by their rows, not passed with each pick (that cost grew with them).
    while (picked := store.pick("any", set(), "w")) is not None:
        order.append(next(line.prefix_key for line in lines if line.id == picked))
        assert store.claim(picked, "w") is not None  # running here: its prefix is this worker's
    assert order == [middle] * 4 + [low] * 4 + [high] * 4


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_a_job_submitted_alone_is_picked_in_one_statement_lines_submitted_together_read_the_prefixes(
    request, dialect
):
    """Step 5 chooses among the jobs submitted with the fairest one: a job submitted alone (or whose
    fellows are being claimed here) leaves it nothing to choose, and its pick reads no prefixes held (a
    statement of each claim, most online jobs'); lines submitted together still read them, and the line
    whose prefix this worker holds comes first."""
    store = request.getfixturevalue("store" if dialect == "postgresql" else "sqlite_store")
    store.prefix_aware = True
    statements: list[str] = []
    event.listen(store.sessions.kw["bind"], "before_cursor_execute", lambda *args: statements.append(args[2]))
    now, held_key = utcnow(), 5
    with store.sessions.begin() as session:
        alone = job(None, 0, now - timedelta(minutes=2), None, held_key)
        lines = [job(None, 0, now - timedelta(minutes=1), None, key) for key in (1, 2, held_key)]
        running = job(None, 0, now, None, held_key)
        running.status, running.worker_id = JobStatus.RUNNING, "w"
        session.add_all([alone, *lines, running])

    def pick(skip: set[str]) -> tuple[str | None, int]:
        statements.clear()
        picked = store.pick("any", skip, "w")
        return picked, len(statements)

    assert pick(set()) == (alone.id, 1)
    assert store.claim(alone.id, "w") is not None
    picked, reads = pick(set())
    assert picked == lines[2].id and reads > 1  # the fairest, the prefixes held (and a probe of mine)
    assert pick({lines[0].id, lines[2].id}) == (lines[1].id, 1)  # its fellows are being claimed here


def test_a_tickets_own_job_is_picked_and_claimed_in_one_statement_when_it_is_the_fairest(store):
    """On PostgreSQL a ticket marks its own job first, and the pick's statement claims it when it is the
    fairest and was submitted alone; a ticket whose job is not the fairest gives its mark back and claims
    the fairest (its pick, then its claim); lines submitted together go through step 5 before a claim."""
    store.prefix_aware = True
    statements: list[str] = []
    event.listen(store.sessions.kw["bind"], "before_cursor_execute", lambda *args: statements.append(args[2]))
    marks: set[str] = set()  # the claimer's: the jobs being claimed here

    def reserve(job_id: str) -> bool:
        if job_id in marks:
            return False
        marks.add(job_id)
        return True

    def take(job_id: str) -> tuple[str | None, int | None, set[str], int]:
        statements.clear()
        picked, claimed = store.take(job_id, set, "w", reserve, marks.remove)
        assert claimed is None or claimed.id == picked
        taken = (picked, None if claimed is None else claimed.attempt, set(marks), len(statements))
        marks.clear()
        return taken

    now = utcnow()
    with store.sessions.begin() as session:
        first, second = (job(None, 0, now - timedelta(minutes=m), None, None) for m in (3, 2))
        lines = [job(None, 0, now - timedelta(minutes=1), None, key) for key in (1, 2)]
        session.add_all([first, second, *lines])
    assert take(first.id) == (first.id, 1, {first.id}, 1)
    with store.sessions() as session:
        row = session.get_one(Job, first.id)
        assert (row.status, row.worker_id, row.attempt) == (JobStatus.RUNNING, "w", 1)
        assert row.runs == [{"attempt": 1, "resumed_from_token": 0}]
    assert take(lines[1].id) == (second.id, 1, {second.id}, 2)  # not the fairest: its mark goes back
    fairest_line = min(lines, key=lambda line: line.id)  # step 6
    assert take(lines[1].id) == (fairest_line.id, 1, {fairest_line.id}, 3)  # and the prefixes held


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_a_prefix_this_worker_ran_before_is_not_held_by_its_ended_job(request, dialect):
    """What a worker ran and ended is its history, not a run holding a prefix (its engine's cache says
    what it still holds): the batch's first line comes first."""
    store = request.getfixturevalue("store" if dialect == "postgresql" else "sqlite_store")
    store.prefix_aware = True
    now = utcnow()
    with store.sessions.begin() as session:
        ended = job(None, 10, now - timedelta(minutes=5), None, 2)
        ended.status, ended.worker_id = JobStatus.SUCCEEDED, "w"
        session.add(ended)
        session.flush()
        lines = [job(None, 10, now, now + timedelta(hours=1), key) for key in (1, 2, 2)]
        for number, line in enumerate(lines):
            line.id = f"job_{number}"  # by id: the line of the prefix not held first
        session.add_all(lines)
    assert store.pick("any", set(), "w") == lines[0].id


def test_the_pick_reads_a_few_rows_per_group_not_every_queued_row(store):
    """5,000 queued lines in 4 groups (2 keys x 2 windows): the plan walks the index, never the table."""
    now = utcnow()
    with store.sessions.begin() as session:
        owner = keys.create(session, "one")[0].id
        session.flush()
        for key, hours in ((owner, 1), (owner, 24), (None, 1), (None, 24)):
            at = now - timedelta(minutes=hours)
            session.add_all(job(key, 10, at, at + timedelta(hours=hours), i % 7) for i in range(1250))
    with store.sessions() as session:
        session.execute(text("ANALYZE jobs"))
        statement = fairest(MODEL, AGING, "postgresql").params(skipping({"job_none"}))
        sql = str(statement.compile(session.get_bind(), compile_kwargs={"literal_binds": True}))
        plan = session.execute(text("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.replace("%", "%%"))).scalar()
    nodes = list(walk((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]))
    scans = [node for node in nodes if node.get("Relation Name") == "jobs"]
    assert all(node["Node Type"] != "Seq Scan" for node in scans), [n["Node Type"] for n in scans]
    assert sum(node["Actual Rows"] * node["Actual Loops"] for node in scans) < 50


def test_on_sqlite_the_pick_walks_the_groups_not_every_queued_row(sqlite_store):
    """The embedded mode's pick (``ix_jobs_fair_heads_lite``, step 5 probing a batch in id order) does
    about the same work (SQLite VM steps) with 10x the queued lines in the same 4 groups; ordering every
    queued row, it did 10x."""
    store, now, steps = sqlite_store, utcnow(), Counter[str]()
    store.prefix_aware = True
    event.listen(
        store.sessions.kw["bind"],
        "checkout",
        lambda dbapi, *_: dbapi.set_progress_handler(lambda: steps.update(["vm"]), 100),
    )
    with store.sessions.begin() as session:
        owner = keys.create(session, "one")[0].id
        running = job(owner, 10, now, None, 3)  # its prefix is held here: step 5 probes for its lines
        running.status, running.worker_id = JobStatus.RUNNING, "w"
        session.add(running)
    work = []
    for lines in (125, 1250):
        with store.sessions.begin() as session:
            for key, hours in ((owner, 1), (owner, 24), (None, 1), (None, 24)):
                at = now - timedelta(minutes=hours, seconds=lines)
                session.add_all(job(key, 10, at, at + timedelta(hours=hours), i % 7) for i in range(lines))
        steps.clear()
        picked = store.pick("any", set(), "w")
        work.append(steps["vm"])
        assert picked == reference(store, set(), Prefixes(frozenset({3})))
    assert work[1] < 2 * work[0], work


def walk(node: dict) -> Iterator[dict]:
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_the_prefixes_held_are_read_once_per_key_not_once_per_running_job(request, dialect):
    """A claim reads who holds which prefix: 200 running lines of three keys (and some of none), here and
    on another worker, come back as each key once per side, with the other worker's published keys."""
    store = request.getfixturevalue("store" if dialect == "postgresql" else "sqlite_store")
    now = utcnow()
    with store.sessions.begin() as session:
        running = [job(None, 10, now, None, (1, 2, 3, None)[i % 4]) for i in range(200)]
        for i, line in enumerate(running):
            line.status, line.worker_id = JobStatus.RUNNING, "w-here" if i % 3 else "w-other"
        session.add_all(running)
    store.heartbeat("w-other", {}, prefix_keys=[7])
    with store.sessions() as session:
        params = skipping(set()) | {"worker_id": "w-here"}
        rows = session.execute(prefix_holders(MODEL), params).all()
        held = prefixes_held(session.connection(), MODEL, set(), "w-here", frozenset({9}))
    assert len(rows) == 3 + 3 + 1, rows  # keys 1-3 here, 1-3 elsewhere, the other worker's heartbeat
    assert held == Prefixes(frozenset({1, 2, 3, 9}), frozenset({7}))


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_a_prefix_another_worker_published_goes_last_but_not_this_worker_s_own(request, dialect):
    """Step 5 reads the other workers' heartbeats with the runs: a line whose prefix another worker's engine
    published waits for the others; what this worker published itself (its own row) is not another's."""
    store = request.getfixturevalue("store" if dialect == "postgresql" else "sqlite_store")
    store.prefix_aware = True
    now, elsewhere, here, free = utcnow(), 1, 2, 3
    with store.sessions.begin() as session:
        lines = [job(None, 10, now, now + timedelta(hours=1), key) for key in (elsewhere, here, free)]
        for number, line in enumerate(lines):
            line.id = f"job_{number}"  # by id: the line held elsewhere first
        session.add_all(lines)
    store.heartbeat("w-other", {}, prefix_keys=[elsewhere])
    store.heartbeat("w-here", {}, prefix_keys=[here])
    order = []
    while (picked := store.pick("any", set(), "w-here")) is not None:
        order.append(next(line.prefix_key for line in lines if line.id == picked))
        assert store.claim(picked, "w-here") is not None
    assert order == [here, free, elsewhere]


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
@pytest.mark.parametrize("skip", [False, True])
def test_a_key_s_count_is_its_running_jobs_and_the_ones_being_claimed_not_its_queued(request, dialect, skip):
    """Step 2's count is read in the fairest statement: one key has a running job (or one being claimed
    here, ``skip``) and a queued one; the other, three queued jobs and nothing running: the other key's
    first job (by id: all were submitted at once) is the fairest, with ``skip`` empty or not."""
    store = request.getfixturevalue("store" if dialect == "postgresql" else "sqlite_store")
    now = utcnow()
    with store.sessions.begin() as session:
        owners = [keys.create(session, name)[0].id for name in ("busy", "idle")]
        session.flush()
        held, busy = job(owners[0], 10, now, None, None), job(owners[0], 10, now, None, None)
        held.status = JobStatus.QUEUED if skip else JobStatus.RUNNING
        idle = [job(owners[1], 10, now, None, None) for _ in range(3)]
        session.add_all([held, busy, *idle])
    assert store.pick("any", {held.id} if skip else set()) == min(line.id for line in idle)


def test_a_plain_vacuum_takes_the_entries_of_jobs_that_left_the_queue_out_of_the_picks_walk(store):
    """A batch's 1,000 lines claimed and done behind a lone queued job, beside 60,000 jobs kept: until a
    vacuum the pick's walk past the lone job's group reads the lines' entries (~16 index pages), still in
    the index; after a plain ``VACUUM`` (autovacuum's) about what it read before the batch (the index
    kept the level the lines added), though the dead rows sit on under 2% of the table's pages, where
    PostgreSQL would skip the indexes but for the table's ``vacuum_index_cleanup``."""
    now, window = utcnow(), utcnow() + timedelta(hours=24)
    shared = shared_values(MODEL, priority=10)
    with store.sessions.begin() as session:
        insert_jobs(session, shared, (row(JobStatus.SUCCEEDED, now, None) for _ in range(60_000)))
        session.add(job(None, 0, now, None, None))
    before_the_batch = fair_heads_pages_read(store)
    with store.sessions.begin() as session:
        insert_jobs(session, shared, (row(JobStatus.QUEUED, now, window) for _ in range(1000)))
    with store.sessions.begin() as session:
        session.execute(text("UPDATE jobs SET status = 'succeeded' WHERE deadline_at IS NOT NULL"))
    assert fair_heads_pages_read(store) > before_the_batch + 8
    with store.sessions() as session:
        autocommitting(session).execute(text("VACUUM jobs"))
    assert fair_heads_pages_read(store) < before_the_batch + 8


def row(status: JobStatus, queued: object, deadline: object) -> dict[str, object]:
    return job_row(status=status.value, queued_at=queued, deadline_at=deadline)


def fair_heads_pages_read(store: JobStore) -> int:
    """Index pages the pick reads of ``ix_jobs_fair_heads``."""
    with store.sessions() as session:
        statement = fairest(MODEL, AGING, "postgresql").params(skipping({"job_none"}))
        sql = str(statement.compile(session.get_bind(), compile_kwargs={"literal_binds": True}))
        plan = session.execute(
            text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.replace("%", "%%"))
        ).scalar()
    nodes = walk((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])
    heads = [node for node in nodes if node.get("Index Name") == "ix_jobs_fair_heads"]
    return sum(node["Shared Hit Blocks"] + node["Shared Read Blocks"] for node in heads)
