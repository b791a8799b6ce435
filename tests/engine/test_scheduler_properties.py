"""Scheduler + BlockManager under random add / step / abort / fork / preemption / prefix hits.

A shadow KV cache records which token each step writes into each slot (block copies first, as the
model runner runs them). After every rule: the pool adds up, every block's reference count is the
number of block tables holding it, the prefix-cache index points at the blocks it names, and every
computed token of every live sequence reads back from its block table. Requests come in three kinds,
as the engine runs them: one sample, n samples forked off the prompt, and beams that advance together
(each beam's logits kept until its siblings have theirs, as the beam searcher does).
"""

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from contract.engine import EngineConfig
from contract.sampling import SamplingParams
from worker.engine.block_manager import NO_HASH, BlockManager
from worker.engine.scheduler import ScheduledBatch, Scheduler
from worker.engine.sequence import Request, Sequence, SequenceStatus

pytestmark = pytest.mark.fast

BS = 4
NUM_BLOCKS = 5
MAX_NEW = 5
PREFIXES = [(1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 9, 9, 9), (20, 21, 22, 23)]  # for prefix hits


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        config = EngineConfig(block_size=BS, max_num_seqs=4, max_num_batched_tokens=10)
        self.sched = Scheduler(config, BlockManager(NUM_BLOCKS, BS))
        self.live: dict[str, Request] = {}
        self.kinds: dict[str, str] = {}  # request id -> one | samples | beams
        self.rows: dict[str, set[Sequence]] = {}  # beams computed this search step, by request id
        self.kv: dict[int, dict[int, int]] = {}  # block id -> slot -> token written there
        self.next_id = 0

    # --- rules ---

    @rule(
        prefix=st.sampled_from([(), *PREFIXES]),
        suffix=st.lists(st.integers(0, 30), min_size=1, max_size=6),
        kind=st.sampled_from(["one", "samples", "beams"]),
        priority=st.integers(0, 2),
    )
    def add_request(self, prefix: tuple[int, ...], suffix: list[int], kind: str, priority: int) -> None:
        prompt = [*prefix, *suffix]
        n = 1 if kind == "one" else 2 + len(suffix) % 2
        params = SamplingParams(n=n, temperature=0.0, max_tokens=MAX_NEW)
        if kind == "beams":
            params = SamplingParams(use_beam_search=True, n=n, temperature=0.0, max_tokens=MAX_NEW)
        request_id, self.next_id = f"r{self.next_id}", self.next_id + 1
        request = Request(request_id, None, prompt, params, priority)
        request.sequences.append(Sequence(request, 0, list(prompt)))
        self.live[request_id], self.kinds[request_id], self.rows[request_id] = request, kind, set()
        self.sched.add(request.sequences[0])

    @rule(data=st.data())
    def run_step(self, data: st.DataObject) -> None:
        self._step(data)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def abort_request(self, data: st.DataObject) -> None:
        request = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        for seq in request.sequences:
            self.sched.finish(seq)

    @rule()
    def drain(self) -> None:
        """Every request ends within a bounded number of steps: nothing starves or deadlocks."""
        for _ in range(400):
            if not self.live:
                break
            self._step(None)
        assert not self.live, f"stuck: {[(s.status, s.num_uncomputed_tokens) for s in self._seqs()]}"
        self._check_nothing_leaks()

    def teardown(self) -> None:
        self.drain()

    def _step(self, data: st.DataObject | None) -> None:
        """One engine step less the model; with no ``data``, beams continue in a fixed pattern."""
        preemptions = self.sched.num_preemptions
        batch = self.sched.schedule()
        self._check_batch(batch)
        self._write_kv(batch)
        event("preempted" if self.sched.num_preemptions > preemptions else "no preemption")
        event("prefix hit" if any(seq.num_cached_tokens for seq in batch.sequences) else "no prefix hit")
        event("copy on write" if batch.blocks_to_copy else "no copy")
        for seq in self.sched.advance(batch):
            self._on_due(seq, data)

    # --- what the engine does with a due sequence ---

    def _on_due(self, seq: Sequence, data: st.DataObject | None) -> None:
        request = seq.request
        if request.request_id not in self.live or seq.is_finished:
            return
        kind = self.kinds[request.request_id]
        if kind == "beams":
            self._beam_due(seq, data)
            return
        if kind == "samples" and not request.forked:
            request.forked = True
            for index in range(1, request.params.n):
                child = Sequence(request, index, list(seq.token_ids))
                self.sched.fork(seq, child)
                request.sequences.append(child)
                self._sample(child)
        request.forked = True
        self._sample(seq)

    def _sample(self, seq: Sequence) -> None:
        seq.token_ids.append((seq.num_tokens + seq.index) % 31)  # samples of one request differ
        if len(seq.output_token_ids) >= MAX_NEW:
            self.sched.finish(seq)
        request = seq.request
        if request.is_finished:
            del self.live[request.request_id]

    def _beam_due(self, seq: Sequence, data: st.DataObject | None) -> None:
        """Keep the beam's row until all beams have theirs, then continue each chosen beam (a beam chosen
        twice is forked, one not chosen is finished), as the beam searcher does."""
        request, rows = seq.request, self.rows[seq.request.request_id]
        rows.add(seq)
        if not all(s in rows for s in request.sequences):
            return
        rows.clear()
        beams, width = request.sequences, request.params.num_sequences
        if len(beams[0].output_token_ids) + 1 >= MAX_NEW:
            for beam in beams:
                self.sched.finish(beam)
            del self.live[request.request_id]
            return
        picks = st.lists(st.integers(0, len(beams) - 1), min_size=width, max_size=width)
        chosen = data.draw(picks) if data is not None else [i % len(beams) for i in range(width)]
        self._rebeam(request, beams, chosen)

    def _rebeam(self, request: Request, beams: list[Sequence], chosen: list[int]) -> None:
        continued: set[int] = set()
        next_beams = []
        for pick in chosen:
            parent = beams[pick]
            if pick in continued:
                child = Sequence(request, self.next_id, list(parent.token_ids))
                self.next_id += 1
                self.sched.fork(parent, child)
            else:
                continued.add(pick)
                child = parent
            next_beams.append(child)
        for index, beam in enumerate(beams):
            if index not in continued:
                self.sched.finish(beam)
        for rank, beam in enumerate(next_beams):  # a beam and its forks continue with different tokens
            beam.token_ids.append((beam.num_tokens + rank) % 31)
        request.sequences, request.forked = next_beams, True

    # --- the shadow KV cache ---

    def _write_kv(self, batch: ScheduledBatch) -> None:
        for src, dst in batch.blocks_to_copy:
            self.kv[dst] = dict(self.kv.get(src, {}))
        for seq, num_new in zip(batch.sequences, batch.num_new_tokens, strict=True):
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + num_new):
                self.kv.setdefault(seq.block_table[pos // BS], {})[pos % BS] = seq.token_ids[pos]

    # --- checks ---

    def _check_batch(self, batch: ScheduledBatch) -> None:
        config = self.sched.config
        assert len(set(batch.sequences)) == len(batch.sequences)
        assert all(seq.status is SequenceStatus.RUNNING for seq in batch.sequences)
        assert all(n > 0 for n in batch.num_new_tokens)
        assert sum(batch.num_new_tokens) <= config.max_num_batched_tokens
        for src, dst in batch.blocks_to_copy:
            assert src != dst and self.sched.block_manager.blocks[dst].ref_count == 1

    def _seqs(self) -> list[Sequence]:
        return [seq for request in self.live.values() for seq in request.sequences if not seq.is_finished]

    @invariant()
    def pool_adds_up(self) -> None:
        bm = self.sched.block_manager
        used = [b for b in bm.blocks if b.ref_count > 0]
        assert all(b.ref_count >= 0 for b in bm.blocks)
        assert len(bm.free_ids) + len(bm.evictable) + len(used) == bm.num_blocks
        assert len(set(bm.free_ids)) == len(bm.free_ids) and not set(bm.free_ids) & set(bm.evictable)
        assert all(bm.blocks[i].ref_count == 0 and bm.blocks[i].hash == NO_HASH for i in bm.free_ids)
        assert all(bm.blocks[i].ref_count == 0 and bm.cached[bm.blocks[i].hash] == i for i in bm.evictable)
        assert all(bm.blocks[i].hash == key for key, i in bm.cached.items())

    @invariant()
    def references_are_block_tables(self) -> None:
        """A block's reference count is the number of tables holding it: in two tables only if shared."""
        holders: dict[int, int] = {}
        for seq in self._seqs():
            assert len(set(seq.block_table)) == len(seq.block_table)
            for block_id in seq.block_table:
                holders[block_id] = holders.get(block_id, 0) + 1
        for block in self.sched.block_manager.blocks:
            assert block.ref_count == holders.get(block.block_id, 0)

    @invariant()
    def queues_hold_the_live_sequences(self) -> None:
        seqs = self._seqs()
        running, waiting = self.sched.running, self.sched.waiting
        assert waiting == sorted(waiting, key=lambda s: s.sort_key)
        assert len(running) <= self.sched.config.max_num_seqs
        assert len(running) + len(waiting) == len(seqs) and set(running) | set(waiting) == set(seqs)
        assert all(seq.status is SequenceStatus.RUNNING for seq in running)
        assert all(seq.status is SequenceStatus.WAITING and not seq.block_table for seq in waiting)

    @invariant()
    def computed_tokens_read_back(self) -> None:
        for seq in self.sched.running:
            assert seq.num_computed_tokens <= seq.num_tokens
            assert len(seq.block_table) * BS >= seq.num_computed_tokens
            for pos in range(seq.num_computed_tokens):
                assert self.kv[seq.block_table[pos // BS]][pos % BS] == seq.token_ids[pos], (seq, pos)

    def _check_nothing_leaks(self) -> None:
        bm = self.sched.block_manager
        assert not self.sched.running and not self.sched.waiting
        assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)


SchedulerMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_scheduler_and_block_manager_keep_their_invariants = SchedulerMachine.TestCase
