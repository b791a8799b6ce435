"""Iteration-level scheduling: which sequences run this step, and how many tokens each.

Every step fills a token budget and a sequence limit: running sequences first (decodes, and
prefills still in progress), then waiting ones in priority order. Long prompts are prefilled
in chunks. When the KV pool runs dry, the lowest-priority, latest-arrived running sequence is
preempted: its blocks are freed and it is recomputed later. A running sequence with nothing to
compute (a beam whose siblings are not computed yet) is left idle; when nothing else can run, a
waiting sequence may take an idle one's blocks and seat.

After the step the engine calls ``advance`` (tokens computed), ``fork`` (a sample or beam sharing its
parent's blocks) and ``finish``; it never touches the queues or the block pool itself.
"""

import bisect
import logging
import math
from dataclasses import dataclass, field

from contract.engine import EngineConfig
from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Sequence, SequenceStatus

logger = logging.getLogger("pagedq.engine")


@dataclass
class ScheduledBatch:
    sequences: list[Sequence]
    num_new_tokens: list[int]  # per sequence, tokens computed this step
    blocks_to_copy: list[tuple[int, int]]


@dataclass
class Scheduler:
    config: EngineConfig
    block_manager: BlockManager
    # A prefill token after this many keys of context counts twice against the budget (None: once, always):
    # deep in a long prompt a chunk's attention, not its token count, sets the step's time.
    context_keys: int | None = None
    waiting: list[Sequence] = field(default_factory=list)  # kept sorted by sort_key
    running: dict[Sequence, None] = field(default_factory=dict)  # in admission order, O(1) removal
    num_preemptions: int = 0

    def __post_init__(self) -> None:
        if self.config.max_num_batched_tokens is None:  # the engine resolves it (EngineConfig.step_budget)
            raise ValueError("the scheduler needs a step budget: max_num_batched_tokens is unresolved")

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_sort_key)

    @property
    def kv_cache_usage(self) -> float:
        return self.block_manager.usage

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch([], [], [])
        preemptions_before = self.num_preemptions
        budget = self._schedule_running(batch, self.config.max_num_batched_tokens)
        preempted = self.num_preemptions - preemptions_before
        if preempted:
            logger.info("preempted %d sequence(s): KV cache full", preempted)
        else:
            self._schedule_waiting(batch, budget)
        batch.blocks_to_copy = self.block_manager.take_pending_copies()
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        """Decodes first, then prefills in progress; each in priority order."""
        scheduled: set[Sequence] = set()
        for seq in sorted(self.running, key=lambda s: (s.num_uncomputed_tokens > 1, s.sort_key)):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or seq.num_uncomputed_tokens == 0:
                continue  # preempted earlier in this loop, or idle
            num_new, cost = self._chunk(seq, budget)
            if not self._make_room(seq, num_new, scheduled):
                continue
            self.block_manager.grow(seq, num_new)
            scheduled.add(seq)
            batch.sequences.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= cost
        return budget

    def _chunk(self, seq: Sequence, budget: int) -> tuple[int, int]:
        """How many of ``seq``'s uncomputed tokens fit ``budget`` (at least one), and the budget they take:
        a token each, times ``1 + context / context_keys`` for a prefill's tokens after a computed context."""
        num_new = min(seq.num_uncomputed_tokens, budget)
        if self.context_keys is None or seq.num_uncomputed_tokens == 1:
            return num_new, num_new
        weight = 1 + seq.num_computed_tokens / self.context_keys
        num_new = max(1, min(num_new, int(budget / weight)))
        return num_new, min(budget, math.ceil(num_new * weight))

    def _make_room(self, seq: Sequence, num_new: int, scheduled: set[Sequence]) -> bool:
        """Preempt the lowest-priority, latest-arrived unscheduled sequence until ``seq`` fits.

        Returns False when ``seq`` itself was preempted.
        """
        while not self.block_manager.can_grow(seq, num_new):
            victim = max((s for s in self.running if s not in scheduled), key=_sort_key)
            self._preempt(victim)
            self.add(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks; the caller queues it again."""
        del self.running[seq]
        self.block_manager.free(seq)
        self.num_preemptions += 1

    def _schedule_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        """Admit waiting sequences in order while budget, seats and blocks last.

        A sequence whose next prompt block another sequence is computing right now waits a step:
        then it finds that block in the prefix cache instead of computing it a second time. One that was
        reported due and preempted before its next token came waits for that token.
        """
        upcoming = self._blocks_being_computed()
        yielded: list[Sequence] = []  # idle sequences preempted for a waiting one, queued after the loop
        seats = sum(self._seats(seq) for seq in self.running)
        index = 0
        while index < len(self.waiting) and budget > 0:
            seq = self.waiting[index]
            if seq.num_tokens == seq.num_tokens_reported or self._waits_for_prefix(seq, upcoming):
                index += 1
                continue
            num_new, cost = self._chunk(seq, budget)
            while not (fits := self._fits(seq, num_new, seats)) and (freed := self._yield(batch, yielded)):
                seats -= freed
            if not fits:
                self.block_manager.free(seq)
                break
            self._admit(self.waiting.pop(index), num_new, batch)
            seats += self._seats(seq)
            budget -= cost
            upcoming.update(self.block_manager.uncomputed_block_hashes(seq))
        for seq in yielded:
            self.add(seq)

    def _waits_for_prefix(self, seq: Sequence, upcoming: set[int]) -> bool:
        """Map the cached prefix of ``seq``; when its next block is among ``upcoming``, let it go again."""
        self.block_manager.match_prefix(seq)
        if set(self.block_manager.uncomputed_block_hashes(seq, limit=1)) & upcoming:
            self.block_manager.free(seq)
            return True
        return False

    def _fits(self, seq: Sequence, num_new: int, seats: int) -> bool:
        has_seats = seats + self._seats(seq) <= self.config.max_num_seqs
        return has_seats and self.block_manager.can_grow(seq, num_new)

    def _admit(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> None:
        self.block_manager.grow(seq, num_new)
        seq.status = SequenceStatus.RUNNING
        self.running[seq] = None
        batch.sequences.append(seq)
        batch.num_new_tokens.append(num_new)

    def _yield(self, batch: ScheduledBatch, yielded: list[Sequence]) -> int:
        """When this step runs nothing else, preempt the lowest-priority idle running sequence for a waiting
        one and return the seats it held (0: none). Idle sequences were reported due and wait for their next
        token (beams for their siblings); without this, they could hold the pool or the seats forever."""
        idle = [seq for seq in self.running if seq.num_uncomputed_tokens == 0]
        if batch.sequences or not idle:
            return 0
        victim = max(idle, key=_sort_key)
        self._preempt(victim)
        yielded.append(victim)
        return self._seats(victim)

    def _blocks_being_computed(self) -> set[int]:
        if not self.config.enable_prefix_caching:
            return set()
        hashes: set[int] = set()
        for seq in self.running:
            if seq.num_uncomputed_tokens > 1:
                hashes.update(self.block_manager.uncomputed_block_hashes(seq))
        return hashes

    def _seats(self, seq: Sequence) -> int:
        """A request not yet forked holds (or will need) a seat for each of its samples."""
        return 1 if seq.request.forked else seq.request.params.num_sequences

    # --- after a step ---

    def advance(self, batch: ScheduledBatch) -> list[Sequence]:
        """Count the tokens the step computed and cache the blocks they filled. Returns the sequences whose
        next token is due, in the order of the step's logits rows."""
        due = []
        for seq, num_new in zip(batch.sequences, batch.num_new_tokens, strict=True):
            before = seq.num_computed_tokens
            seq.num_computed_tokens += num_new
            self.block_manager.register_full_blocks(seq, before)
            if seq.num_computed_tokens == seq.num_tokens:
                seq.num_tokens_reported = seq.num_tokens
                due.append(seq)
        return due

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Run ``child`` beside ``parent`` on its blocks (a partly filled last one is copied on write). The
        child of a preempted parent waits, as its parent does, to be computed from the prefix cache."""
        if parent.status is SequenceStatus.WAITING:
            self.add(child)
            return
        self.block_manager.fork(parent, child)
        child.status = SequenceStatus.RUNNING
        self.running[child] = None

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues and free its blocks at once."""
        if seq in self.running:
            del self.running[seq]
        elif seq.status is SequenceStatus.WAITING:
            self._drop_waiting(seq)
        seq.status = SequenceStatus.FINISHED
        self.block_manager.free(seq)

    def _drop_waiting(self, seq: Sequence) -> None:
        """Remove ``seq`` from ``waiting`` if it is there (found by bisection on its sort key)."""
        index = bisect.bisect_left(self.waiting, seq.sort_key, key=_sort_key)
        while index < len(self.waiting) and self.waiting[index].sort_key == seq.sort_key:
            if self.waiting[index] is seq:
                del self.waiting[index]
                return
            index += 1


def _sort_key(seq: Sequence) -> tuple[int, int, int]:
    return seq.sort_key
