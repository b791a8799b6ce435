"""The block pool: prefix hits, LRU eviction of cached blocks, copy-on-write, no leaks."""

import pytest

from contract.sampling import SamplingParams
from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Request, Sequence

pytestmark = pytest.mark.fast

BS = 4


def sequence(tokens: list[int]) -> Sequence:
    request = Request("r", None, list(tokens), SamplingParams())
    return Sequence(request, 0, list(tokens))


def compute(bm: BlockManager, seq: Sequence) -> None:
    """Admit ``seq``, give it its blocks and mark its tokens computed, as a step would."""
    bm.match_prefix(seq)
    before, todo = seq.num_computed_tokens, seq.num_uncomputed_tokens
    assert bm.can_grow(seq, todo)
    bm.grow(seq, todo)
    seq.num_computed_tokens += todo
    bm.register_full_blocks(seq, before)


def test_shared_prefix_reuses_full_blocks_but_computes_the_last_token() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    first = sequence(list(range(10)))
    compute(bm, first)
    second = sequence([*range(8), 99, 98, 97])
    compute(bm, second)
    assert second.num_cached_tokens == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert bm.blocks[first.block_table[0]].ref_count == 2
    exact = sequence(list(range(8)))  # fully cached prompt: the last block is recomputed for its logits
    bm.match_prefix(exact)
    assert exact.num_cached_tokens == 4
    for seq in (first, second, exact):
        bm.free(seq)
    assert bm.num_free_blocks == 16


def test_prefix_caching_off_shares_nothing() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    first, second = sequence(list(range(10))), sequence(list(range(10)))
    compute(bm, first)
    compute(bm, second)
    assert second.num_cached_tokens == 0
    assert not set(first.block_table) & set(second.block_table)


def test_freed_blocks_stay_cached_until_the_pool_needs_them_least_recent_first() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    old, new = sequence(list(range(9))), sequence(list(range(100, 109)))
    compute(bm, old)  # 3 blocks: 2 full (cached), 1 partial
    bm.free(old)
    compute(bm, new)  # 2 uncached free blocks + 1 evicted: old's second block, released first
    bm.free(new)
    assert len(bm.cached) == 3
    again_new = sequence(list(range(100, 109)))
    bm.match_prefix(again_new)
    assert again_new.num_cached_tokens == 8  # the most recent prefix survived
    bm.free(again_new)
    again_old = sequence(list(range(9)))
    bm.match_prefix(again_old)
    assert again_old.num_cached_tokens == 4  # its first block survived, its second was evicted
    bm.free(again_old)
    assert bm.num_free_blocks == 4


def test_a_hash_hit_with_different_tokens_is_not_shared() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    first = sequence(list(range(9)))
    compute(bm, first)
    block = bm.blocks[first.block_table[0]]
    block.token_ids = (7, 7, 7, 7)  # as if another prefix had collided on the same hash
    second = sequence(list(range(9)))
    bm.match_prefix(second)
    assert second.num_cached_tokens == 0


def test_fork_shares_blocks_and_copies_the_partial_one_on_write() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    parent = sequence(list(range(6)))  # one full block, one half-filled
    compute(bm, parent)
    child = sequence(list(range(6)))
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert bm.new_blocks_needed(child, 1) == 1  # the shared partial block must be copied first
    bm.grow(child, 1)
    assert child.block_table[0] == parent.block_table[0]
    assert child.block_table[1] != parent.block_table[1]
    assert bm.pending_copies == [(parent.block_table[1], child.block_table[1])]
    assert bm.new_blocks_needed(parent, 1) == 0  # now the parent owns its partial block alone
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 8 and all(b.ref_count == 0 for b in bm.blocks)
