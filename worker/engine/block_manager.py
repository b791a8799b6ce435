"""The KV block pool: reference counts, copy-on-write, and the prefix cache.

A full block is keyed by a chained hash of (parent block's hash, its token ids), so two
requests with the same prefix map to the same blocks. Freed blocks keep their key and stay
findable until the pool needs them; then the least recently used one is evicted.
"""

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from contract.prefix import NO_HASH, chain_hash
from worker.engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int = NO_HASH
    token_ids: tuple[int, ...] = ()  # kept to confirm a hash hit is not a collision


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    blocks: list[Block] = field(init=False)
    free_ids: list[int] = field(init=False)  # free and holding nothing worth keeping
    evictable: OrderedDict[int, None] = field(init=False)  # free but cached, oldest first
    cached: dict[int, int] = field(init=False)  # hash -> block id
    pending_copies: list[tuple[int, int]] = field(init=False)  # (src, dst) block copies to run

    def __post_init__(self) -> None:
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_ids = list(range(self.num_blocks - 1, -1, -1))
        self.evictable = OrderedDict()
        self.cached = {}
        self.pending_copies = []

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- admission: find the cached prefix ---

    def match_prefix(self, seq: Sequence) -> None:
        """Point a fresh sequence at the cached blocks of its longest cached prefix.

        The last token is always left to compute: its logits are needed to sample.
        """
        if not self.enable_prefix_caching:
            return
        for _, tokens, key in self._chained(seq, 0, (seq.num_tokens - 1) // self.block_size):
            block_id = self.cached.get(key)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            self._take(block_id)
            seq.block_table.append(block_id)
        seq.num_computed_tokens = seq.num_cached_tokens = len(seq.block_table) * self.block_size

    def uncomputed_block_hashes(self, seq: Sequence, limit: int | None = None) -> list[int]:
        """Prefix-cache keys of the full blocks ``seq`` has yet to compute, in order (at most ``limit``)."""
        if not self.enable_prefix_caching:
            return []
        first, last = seq.num_computed_tokens // self.block_size, seq.num_tokens // self.block_size
        return [key for _, _, key in self._chained(seq, first, min(last, first + (limit or last)))]

    def _chained(self, seq: Sequence, first: int, last: int) -> Iterator[tuple[int, tuple[int, ...], int]]:
        """(index, tokens, prefix-cache key) of blocks ``first..last-1``; blocks before are hashed."""
        parent = self.blocks[seq.block_table[first - 1]].hash if first else NO_HASH
        for index in range(first, last):
            tokens = tuple(seq.token_ids[index * self.block_size : (index + 1) * self.block_size])
            parent = chain_hash(parent, tokens)
            yield index, tokens, parent

    # --- growing a sequence ---

    def new_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        needed = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return max(needed, 0) + int(self._needs_copy_on_write(seq))

    def can_grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.new_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def grow(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give ``seq`` the slots for its next ``num_new_tokens`` tokens (call ``can_grow`` first)."""
        if self._needs_copy_on_write(seq):
            shared = seq.block_table[-1]
            copy = self._allocate()
            self.pending_copies.append((shared, copy))
            self._release(shared)
            seq.block_table[-1] = copy
        while len(seq.block_table) < self.blocks_needed(seq.num_computed_tokens + num_new_tokens):
            seq.block_table.append(self._allocate())

    def _needs_copy_on_write(self, seq: Sequence) -> bool:
        """A partly filled last block shared with a sibling sample must be copied before writing."""
        if not seq.block_table or seq.num_computed_tokens % self.block_size == 0:
            return False
        return self.blocks[seq.block_table[-1]].ref_count > 1

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let ``child`` share every block of ``parent``."""
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies ``grow`` asked for since the last call, for the next step to run."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def register_full_blocks(self, seq: Sequence, num_computed_before: int) -> None:
        """Make the blocks that became full of computed tokens findable by later requests."""
        if not self.enable_prefix_caching:
            return
        first, last = num_computed_before // self.block_size, seq.num_computed_tokens // self.block_size
        for index, tokens, key in self._chained(seq, first, last):
            block = self.blocks[seq.block_table[index]]
            if block.hash == NO_HASH:
                block.hash, block.token_ids = key, tokens
                self.cached.setdefault(key, block.block_id)

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's claim on its blocks; the last blocks freed are the first evicted."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    # --- the pool ---

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self.evictable.pop(block_id)
        block.ref_count += 1

    def _allocate(self) -> int:
        if self.free_ids:
            block_id = self.free_ids.pop()
        elif self.evictable:
            block_id, _ = self.evictable.popitem(last=False)
            self._forget(self.blocks[block_id])
        else:
            raise RuntimeError("KV cache pool exhausted; the scheduler should have checked can_grow")
        self.blocks[block_id].ref_count = 1
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        if block.hash != NO_HASH and self.cached.get(block.hash) == block_id:
            self.evictable[block_id] = None
        else:
            self._forget(block)
            self.free_ids.append(block_id)

    def _forget(self, block: Block) -> None:
        if block.hash != NO_HASH and self.cached.get(block.hash) == block.block_id:
            del self.cached[block.hash]
        block.hash, block.token_ids = NO_HASH, ()
