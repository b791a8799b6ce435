"""A prompt's prefix key: the hash of its leading full blocks of token ids, chained as the engine's prefix
cache keys its blocks (``BlockManager``), so the key of a prompt is the cache's key of its last leading
block. The API stores it on the job (``jobs.prefix_key``); the claim runs jobs of one key together and
prefers those whose block a worker's cache still holds (worker/fair.py).

Which blocks: half the prompt's full blocks, at most ``MAX_PREFIX_BLOCKS``. A batch that asks many
questions of each document then keys each line by its document (the question is past the half), and a
long shared system prompt by that prompt; a prompt of fewer than two full blocks has none. Python's
``hash`` of a tuple of ints is the same in every process (no hash randomization for ints), so the API's
key and the engine's agree wherever both run one Python and one ``PAGEDQ_BLOCK_SIZE``.
"""

NO_HASH = -1  # the parent of a prompt's first block
MAX_PREFIX_BLOCKS = 32


def chain_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """A full block's key: its parent's key and its own token ids."""
    return hash((parent_hash, token_ids))


def prefix_key(token_ids: list[int], block_size: int) -> int | None:
    """The chained hash of the prompt's leading half of full blocks (at most ``MAX_PREFIX_BLOCKS``)."""
    blocks = min(len(token_ids) // block_size // 2, MAX_PREFIX_BLOCKS)
    if blocks == 0:
        return None
    key = NO_HASH
    for start in range(0, blocks * block_size, block_size):
        key = chain_hash(key, tuple(token_ids[start : start + block_size]))
    return key
