"""Per-step attention metadata, built once by the model runner and shared by every layer."""

from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

# Decode sequences are attended in chunks of at most this many padded context tokens (or one
# sequence, when longer): sorted by length, neighbours pad little, and a chunk's gathered K/V
# (1.5 KiB a token for 3 kv heads x 64 in float32) stays in the CPU caches up to SDPA.
# 2k-16k measured alike (bench/attention_cpu.py); one chunk for all was slower.
DECODE_CHUNK_TOKENS = 8192


@dataclass(frozen=True, eq=False)
class DecodeChunk:
    """Decode sequences (one new token each) attended together in one SDPA call."""

    token_index: Tensor  # [C] int64: rows of the flattened query
    block_index: Tensor  # [C * num_blocks] int64: cache blocks to gather, sequence-major
    key_mask: Tensor  # [C, 1, 1, num_blocks * block_size] bool: True where a key exists
    num_blocks: int


@dataclass(frozen=True, eq=False)
class PrefillSeq:
    """One sequence with several new tokens: a whole prompt or a chunk after a cached prefix."""

    start: int  # its rows of the flattened query are [start, end)
    end: int
    seq_len: int
    block_ids: Tensor  # [ceil(seq_len / block_size)]
    mask: Tensor | None  # [query_len, seq_len] bool; None when plain causal (no cached prefix)


@dataclass(frozen=True, eq=False)
class AttentionMetadata:
    """Where this step's tokens live in the paged KV cache.

    T flattened new tokens from B sequences. Sequence b has ``query_lens_cpu[b]`` new tokens
    (rows ``query_start_loc[b]:query_start_loc[b + 1]``) and ``seq_lens_cpu[b]`` tokens of
    context, new ones included. Tensors are on the model's device. The Triton kernels read the
    tensors and the host ints below as they are; the torch reference's plans are derived once,
    cached, so they are computed by the first layer of a step and reused by the others.
    """

    slot_mapping: Tensor  # [T] int64: block_id * block_size + offset of each new token
    block_tables: Tensor  # [B, max_blocks] int32 (int64 works too), padded with 0
    query_start_loc: Tensor  # [B + 1] int32 (or int64)
    seq_lens: Tensor  # [B] int32 (or int64)
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    block_size: int
    # every query row attends in the same code, however many new tokens its sequence has this step, so
    # its output is the same in a prefill chunk or a decode step (the CPU kernels' batch invariance)
    batch_invariant: bool = False
    _buffers: dict[tuple, Tensor] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        num_seqs = len(self.seq_lens_cpu)
        if len(self.query_lens_cpu) != num_seqs:
            raise ValueError(f"{len(self.query_lens_cpu)} query lengths for {num_seqs} sequences")
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        for b, (q, s) in enumerate(zip(self.query_lens_cpu, self.seq_lens_cpu, strict=True)):
            if not 1 <= q <= s:
                raise ValueError(f"sequence {b}: need 1 <= query_len <= seq_len, got {q} and {s}")
        shapes = {
            "slot_mapping": (self.slot_mapping.shape, (self.num_tokens,)),
            "query_start_loc": (self.query_start_loc.shape, (num_seqs + 1,)),
            "seq_lens": (self.seq_lens.shape, (num_seqs,)),
            "block_tables rows": (self.block_tables.shape[:1], (num_seqs,)),
        }
        for name, (got, want) in shapes.items():
            if tuple(got) != want:
                raise ValueError(f"{name}: expected shape {want}, got {tuple(got)}")
        need = self._num_blocks(self.max_seq_len)
        if self.block_tables.dim() != 2 or self.block_tables.shape[1] < need:
            raise ValueError(f"block_tables {tuple(self.block_tables.shape)} needs >= {need} columns")

    @cached_property
    def num_tokens(self) -> int:
        return sum(self.query_lens_cpu)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @cached_property
    def max_query_len(self) -> int:
        return max(self.query_lens_cpu, default=0)

    @cached_property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)

    def _num_blocks(self, seq_len: int) -> int:
        return -(-seq_len // self.block_size)

    @cached_property
    def query_starts_cpu(self) -> list[int]:
        starts = [0]
        for q in self.query_lens_cpu:
            starts.append(starts[-1] + q)
        return starts

    @cached_property
    def decode_chunks(self) -> list[DecodeChunk]:
        """Sequences with one new token, longest first, grouped by DECODE_CHUNK_TOKENS."""
        decodes = [b for b, q in enumerate(self.query_lens_cpu) if q == 1]
        if not decodes:
            return []
        decodes.sort(key=lambda b: self.seq_lens_cpu[b], reverse=True)
        order = torch.tensor(decodes, dtype=torch.int64, device=self.seq_lens.device)
        chunks, i = [], 0
        while i < len(decodes):
            num_blocks = self._num_blocks(self.seq_lens_cpu[decodes[i]])
            size = max(1, DECODE_CHUNK_TOKENS // (num_blocks * self.block_size))
            chunks.append(self._decode_chunk(order[i : i + size], num_blocks))
            i += size
        return chunks

    def _decode_chunk(self, seqs: Tensor, num_blocks: int) -> DecodeChunk:
        positions = torch.arange(num_blocks * self.block_size, device=seqs.device)
        key_mask = positions < self.seq_lens[seqs].unsqueeze(1)
        return DecodeChunk(
            token_index=self.query_start_loc[seqs].long(),
            block_index=self.block_tables[seqs, :num_blocks].reshape(-1).long(),
            key_mask=key_mask[:, None, None, :],
            num_blocks=num_blocks,
        )

    @cached_property
    def prefills(self) -> list[PrefillSeq]:
        """Sequences with several new tokens, each attended on its own."""
        device = self.block_tables.device
        out = []
        for b, (q, s) in enumerate(zip(self.query_lens_cpu, self.seq_lens_cpu, strict=True)):
            if q == 1:
                continue
            # Query i sits at position s - q + i and sees keys 0..s - q + i.
            mask = None if q == s else torch.ones(q, s, dtype=torch.bool, device=device).tril(s - q)
            start = self.query_starts_cpu[b]
            block_ids = self.block_tables[b, : self._num_blocks(s)]
            out.append(PrefillSeq(start, start + q, s, block_ids, mask))
        return out

    @cached_property
    def max_gather_blocks(self) -> int:
        """The most cache blocks that one attention call (a decode chunk or a prefill) gathers."""
        sizes = [c.block_index.shape[0] for c in self.decode_chunks]
        return max(sizes + [p.block_ids.shape[0] for p in self.prefills], default=0)

    def gather_buffer(self, cache: Tensor) -> Tensor:
        """Scratch ``[2, max_gather_blocks, *cache.shape[1:]]`` for gathered K and V, shared by the
        step's layers: on CPU, page-faulting a fresh multi-MB tensor in every layer can cost more
        than the attention itself."""
        key = (cache.dtype, cache.device, cache.shape[1:])
        if key not in self._buffers:
            self._buffers[key] = cache.new_empty((2, self.max_gather_blocks, *cache.shape[1:]))
        return self._buffers[key]
