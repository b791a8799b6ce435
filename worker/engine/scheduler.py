"""Iteration-level scheduling: which sequences run this step, and how many tokens each.

Every step fills a token budget and a sequence limit: running sequences first (decodes, and
prefills still in progress), then waiting ones in priority order. Long prompts are prefilled
in chunks. When the KV pool runs dry, the lowest-priority, latest-arrived running sequence is
preempted: its blocks are freed and it is recomputed later.

After the step the engine calls ``advance`` (tokens computed), ``fork`` (a sample or beam sharing its
parent's blocks) and ``finish``; it never touches the queues or the block pool itself.
"""

import bisect
import logging
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
    waiting: list[Sequence] = field(default_factory=list)  # kept sorted by sort_key
    running: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=lambda s: s.sort_key)

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
        for seq in sorted(self.running, key=lambda s: (s.num_uncomputed_tokens > 1, s.sort_key)):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if not self._beams_fit(seq, budget, batch):
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._make_room(seq, num_new, batch):
                continue
            self.block_manager.grow(seq, num_new)
            batch.sequences.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        return budget

    @staticmethod
    def _beams_fit(seq: Sequence, budget: int, batch: ScheduledBatch) -> bool:
        """The beams of a search advance together: all of them this step, or none."""
        request = seq.request
        if not request.params.use_beam_search or not request.forked:
            return True
        return sum(s.num_uncomputed_tokens for s in request.sequences if s not in batch.sequences) <= budget

    def _make_room(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> bool:
        """Preempt the lowest-priority, latest-arrived unscheduled sequence until ``seq`` fits.

        Returns False when ``seq`` itself was preempted.
        """
        while not self.block_manager.can_grow(seq, num_new):
            victim = max((s for s in self.running if s not in batch.sequences), key=lambda s: s.sort_key)
            if victim.request.params.use_beam_search:
                self._restart_beam_search(victim, batch)
            else:
                self._preempt(victim)
            if seq.status is not SequenceStatus.RUNNING:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        self.num_preemptions += 1
        self.add(seq)

    def _restart_beam_search(self, victim: Sequence, batch: ScheduledBatch) -> None:
        """Beams advance in lockstep, so a beam search is preempted whole and starts over from its prompt
        (mostly from the prefix cache), unforked: its first step then starts a fresh search, which, being
        greedy, finds the same beams again."""
        request = victim.request
        for seq in request.sequences:
            if seq in batch.sequences:
                index = batch.sequences.index(seq)
                del batch.sequences[index], batch.num_new_tokens[index]
            self.finish(seq)
        first = request.sequences[0]
        first.token_ids, first.cumulative_logprob = list(request.prompt_token_ids), 0.0
        request.sequences, request.forked = [first], False
        self.num_preemptions += 1
        self.add(first)

    def _schedule_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        """Admit waiting sequences in order while budget, seats and blocks last.

        A sequence whose next prompt block another sequence is computing right now waits a step:
        then it finds that block in the prefix cache instead of computing it a second time.
        """
        upcoming = self._blocks_being_computed()
        index = 0
        while index < len(self.waiting) and budget > 0:
            seq = self.waiting[index]
            if len(self.running) + self._seats(seq) > self.config.max_num_seqs:
                break
            self.block_manager.match_prefix(seq)
            num_new = min(seq.num_uncomputed_tokens, budget)
            if set(self.block_manager.uncomputed_block_hashes(seq, limit=1)) & upcoming:
                self.block_manager.free(seq)
                index += 1
                continue
            if not self.block_manager.can_grow(seq, num_new):
                self.block_manager.free(seq)
                break
            self.block_manager.grow(seq, num_new)
            self.waiting.pop(index)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.sequences.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
            upcoming.update(self.block_manager.uncomputed_block_hashes(seq))

    def _blocks_being_computed(self) -> set[int]:
        if not self.config.enable_prefix_caching:
            return set()
        hashes: set[int] = set()
        for seq in self.running:
            if seq.num_uncomputed_tokens > 1:
                hashes.update(self.block_manager.uncomputed_block_hashes(seq))
        return hashes

    def _seats(self, seq: Sequence) -> int:
        """A request not yet forked will need a seat for each of its samples."""
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
                due.append(seq)
        return due

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Run ``child`` beside ``parent`` on its blocks (a partly filled last one is copied on write)."""
        self.block_manager.fork(parent, child)
        child.status = SequenceStatus.RUNNING
        self.running.append(child)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues and free its blocks at once."""
        seq.status = SequenceStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
