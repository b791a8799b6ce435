"""The scheduler's after-step interface (advance, fork, finish) and its preemptions, without a model."""

import itertools

import pytest

from contract.engine import EngineConfig
from contract.sampling import SamplingParams
from worker.engine.block_manager import BlockManager
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Request, Sequence, SequenceStatus

pytestmark = pytest.mark.fast

BS = 4


def scheduler(num_blocks: int, context_keys: int | None = None, **config: int) -> Scheduler:
    config.setdefault("max_num_batched_tokens", 2048)  # the engine resolves the device's default first
    return Scheduler(EngineConfig(block_size=BS, **config), BlockManager(num_blocks, BS), context_keys)


def sequence(request_id: str, tokens: range, priority: int = 0, **params: object) -> Sequence:
    request = Request(request_id, None, list(tokens), SamplingParams(**params), priority)
    request.sequences.append(Sequence(request, 0, list(tokens)))
    return request.sequences[0]


def sample(*seqs: Sequence) -> None:
    """Append a token to each, as the engine does with the step's samples."""
    for seq in seqs:
        seq.token_ids.append(1)


def step(s: Scheduler) -> list[Sequence]:
    """A step as the engine runs it, less the model: schedule, then report what was computed."""
    return s.advance(s.schedule())


def blocks_in_use(s: Scheduler) -> int:
    return s.block_manager.num_blocks - s.block_manager.num_free_blocks


def test_advance_counts_a_chunked_prefill_and_reports_a_sequence_due_once_its_prompt_is_computed() -> None:
    s = scheduler(16, max_num_batched_tokens=6)
    seq = sequence("r", range(10))
    s.add(seq)
    assert step(s) == [] and seq.num_computed_tokens == 6 and seq.status is SequenceStatus.RUNNING
    assert step(s) == [seq] and seq.num_computed_tokens == 10
    assert len(s.block_manager.cached) == 2  # both full blocks are findable by later prompts


def test_fork_shares_the_parents_blocks_and_finish_frees_each_sequences_claim() -> None:
    s = scheduler(16)
    parent = sequence("r", range(6), n=2)  # one full block, one half-filled
    s.add(parent)
    assert step(s) == [parent]
    child = Sequence(parent.request, 1, list(parent.token_ids))
    s.fork(parent, child)
    assert child.status is SequenceStatus.RUNNING and child in s.running
    assert child.block_table == parent.block_table and child.num_computed_tokens == 6
    assert blocks_in_use(s) == 2
    sample(parent, child)
    batch = s.schedule()
    assert batch.sequences == [parent, child]
    assert batch.blocks_to_copy == [(child.block_table[1], parent.block_table[1])]  # first writer copies
    assert s.advance(batch) == [parent, child]
    s.finish(parent)
    assert parent.status is SequenceStatus.FINISHED and parent not in s.running and parent.block_table == []
    assert blocks_in_use(s) == 2  # the child's: the shared full block and the half-filled one
    s.finish(child)
    assert blocks_in_use(s) == 0 and not s.running and s.waiting == []


def test_a_full_pool_preempts_the_lowest_priority_sequence_which_resumes_from_the_prefix_cache() -> None:
    s = scheduler(4)
    urgent, late = sequence("urgent", range(7)), sequence("late", range(50, 57), priority=1)
    s.add(late)
    s.add(urgent)
    for _ in range(2):  # prefill, then a decode that fills each second block
        assert step(s) == [urgent, late]
        sample(urgent, late)
    batch = s.schedule()  # urgent needs a third block and none is free
    assert batch.sequences == [urgent] and s.num_preemptions == 1
    assert late.status is SequenceStatus.WAITING and s.waiting == [late] and late.block_table == []
    s.advance(batch)
    s.finish(urgent)
    assert step(s) == [late] and late.num_cached_tokens == BS  # its first block survived in the cache
    s.finish(late)
    assert blocks_in_use(s) == 0


def test_a_preempted_beam_resumes_from_the_prefix_cache_while_its_sibling_waits_idle() -> None:
    s = scheduler(5)
    urgent = sequence("urgent", range(7))
    first = sequence("beams", range(50, 56), priority=1, use_beam_search=True, n=2, temperature=0.0)
    request = first.request
    s.add(urgent)
    s.add(first)
    assert step(s) == [urgent, first]
    second = Sequence(request, 1, list(first.token_ids))  # as the beam searcher forks a beam
    s.fork(first, second)
    request.sequences, request.forked = [first, second], True
    sample(urgent, first, second)
    assert step(s) == [urgent, first, second]  # the first beam's copy on write takes the last free block
    sample(urgent, first, second)
    batch = s.schedule()  # urgent needs a block: the latest beam is the victim, alone
    assert batch.sequences == [urgent, first] and s.num_preemptions == 1
    assert second.status is SequenceStatus.WAITING and second.block_table == [] and s.waiting == [second]
    assert second.token_ids == [*range(50, 56), 1, 1]  # it keeps its tokens and is recomputed later
    assert s.advance(batch) == [urgent, first]
    s.finish(urgent)
    assert step(s) == [second] and second.num_cached_tokens == BS  # its prompt block from the cache
    assert first.num_uncomputed_tokens == 0  # computed, and idle until the search moves on
    s.finish(first)
    s.finish(second)
    assert blocks_in_use(s) == 0 and not s.running and s.waiting == []


def test_a_waiting_sequence_takes_an_idle_sequences_blocks_when_nothing_else_can_run() -> None:
    s = scheduler(3)
    idle, late = sequence("idle", range(8)), sequence("late", range(50, 54), priority=1)
    s.add(idle)
    s.add(late)
    assert step(s) == [idle, late]  # the pool is full; idle is left without a token, as a computed beam
    sample(late)  # whose siblings are not computed yet: it has nothing to compute
    assert step(s) == [] and late.status is SequenceStatus.WAITING  # late needs a block: preempted
    batch = s.schedule()  # only idle holds blocks: without yielding them, no step would ever run again
    assert batch.sequences == [late] and s.num_preemptions == 2
    assert idle.status is SequenceStatus.WAITING and s.waiting == [idle] and idle.block_table == []
    s.advance(batch)
    s.finish(late)
    assert step(s) == [] and s.waiting == [idle]  # reported due already: it waits for its next token
    sample(idle)
    assert step(s) == [idle] and idle.num_cached_tokens == BS  # back from the prefix cache
    s.finish(idle)
    assert blocks_in_use(s) == 0 and not s.running and s.waiting == []


def test_seats_held_for_the_samples_of_an_unforked_request_are_counted_before_admitting_another() -> None:
    s = scheduler(16, max_num_seqs=4)
    first, second = sequence("first", range(5), n=3), sequence("second", range(10, 15), n=3)
    s.add(first)
    s.add(second)
    assert step(s) == [first]  # its three samples need three of the four seats
    assert s.waiting == [second]


def test_finish_takes_out_of_waiting_exactly_the_sequence_among_equal_sort_keys() -> None:
    s = scheduler(16)
    first = sequence("r", range(5), n=2)
    twin = Sequence(first.request, 0, list(first.token_ids))  # same request and index: the same sort key
    later = sequence("later", range(5))
    for seq in (first, twin, later):
        s.add(seq)
    s.finish(twin)
    assert s.waiting == [first, later] and twin.status is SequenceStatus.FINISHED
    s.finish(Sequence(later.request, 1, [1]))  # never queued: nothing to take out
    assert s.waiting == [first, later]


def test_a_chunk_deep_in_a_long_prompt_is_smaller_and_decodes_still_count_one_token_each() -> None:
    s = scheduler(200, context_keys=100, max_num_batched_tokens=100)
    decode, long = sequence("d", range(3)), sequence("p", range(600))
    s.add(decode)
    step(s)
    sample(decode)
    s.add(long)
    chunks = []
    while long.num_computed_tokens < long.num_tokens:
        batch = s.schedule()
        assert batch.num_new_tokens[0] == 1  # the decode, first, at one token
        chunks.append(batch.num_new_tokens[1])
        s.advance(batch)
        sample(decode)
    # 99 tokens at context 0 (weight 1), then 99 / (1 + context / 100) at each chunk's context
    assert chunks[:4] == [99, 49, 39, 34] and sum(chunks) == 600
    assert all(later <= earlier for earlier, later in itertools.pairwise(chunks))


def test_a_deep_prefill_takes_its_cost_from_the_budget_of_the_prompts_admitted_after_it() -> None:
    s = scheduler(200, context_keys=100, max_num_batched_tokens=100)
    first = sequence("a", range(170))
    s.add(first)
    for _ in range(2):
        step(s)
    assert first.num_computed_tokens == 100 + 50
    s.add(sequence("b", range(1000, 1080)))
    batch = s.schedule()  # the first's last 20 tokens at weight 2.5 take 50 of 100: 50 left for the second
    assert batch.num_new_tokens == [20, 50]


def test_without_context_keys_a_chunk_counts_its_tokens_only() -> None:
    s = scheduler(200, max_num_batched_tokens=100)
    seq = sequence("p", range(350))
    s.add(seq)
    computed = []
    for _ in range(4):
        step(s)
        computed.append(seq.num_computed_tokens)
    assert computed == [100, 200, 300, 350]
