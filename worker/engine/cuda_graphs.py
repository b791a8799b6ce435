"""CUDA graphs of decode-only steps: one captured forward pass per padded batch size.

A decode step of a small model is dominated by kernel launches; replaying a graph launches the
whole forward pass at once. Each graph reads its inputs from static buffers: a batch of n decodes
is copied into the first n rows and padded to the next captured size, the padding rows writing no
KV (slot -1) and attending one token of whatever block their stale table row names.

Written without a GPU at hand: not yet run on one (the capture and replay paths are untested).
"""

from collections.abc import Sequence

import torch

from kernels import AttentionMetadata
from worker.engine.model.llama import KVCache, LlamaForCausalLM

MAX_GRAPH_BATCH = 512


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, up to max_num_seqs (capped at MAX_GRAPH_BATCH)."""
    top = min(max_num_seqs, MAX_GRAPH_BATCH)
    sizes = [s for s in (1, 2, 4, 8) if s < top] + list(range(16, top, 16))
    return [*sizes, top]


class DecodeGraphs:
    def __init__(
        self, model: LlamaForCausalLM, kv_caches: Sequence[KVCache], max_num_seqs: int, max_model_len: int
    ) -> None:
        self.sizes = graph_batch_sizes(max_num_seqs)
        block_size, device = kv_caches[0][0].shape[1], kv_caches[0][0].device
        self.max_model_len, self.block_size = max_model_len, block_size
        top, width = self.sizes[-1], -(-max_model_len // block_size) + 1
        self.input_ids = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(top, width, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(top, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(top + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture(model, kv_caches)

    def _meta(self, batch: int) -> AttentionMetadata:
        # The host lengths only steer launch choices: the longest context picks the split-K
        # count, which stays valid for any shorter context (splits are sized on the device).
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch],
            block_tables=self.block_tables[:batch],
            query_start_loc=self.query_start_loc[: batch + 1],
            seq_lens=self.seq_lens[:batch],
            query_lens_cpu=[1] * batch,
            seq_lens_cpu=[self.max_model_len] * batch,
            block_size=self.block_size,
        )

    @torch.inference_mode()
    def _capture(self, model: LlamaForCausalLM, kv_caches: Sequence[KVCache]) -> None:
        pool = None
        for batch in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            args = (self.input_ids[:batch], self.positions[:batch], list(kv_caches), self._meta(batch))
            model(*args)  # compiles the Triton kernels for this shape outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                hidden = model(*args)
            pool = graph.pool()
            self.graphs[batch] = (graph, hidden)
        torch.cuda.synchronize()

    def fits(self, meta: AttentionMetadata) -> bool:
        return (
            meta.max_query_len == 1
            and meta.num_seqs <= self.sizes[-1]
            and meta.block_tables.shape[1] <= self.block_tables.shape[1]
        )

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states ``[n, hidden]`` of a decode-only batch of n (valid until the next replay)."""
        n = meta.num_seqs
        batch = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:batch].fill_(-1)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.seq_lens[n:batch].fill_(1)
        self.block_tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        graph, hidden = self.graphs[batch]
        graph.replay()
        return hidden[:n]
