"""Turns a scheduled batch into tensors, runs the model over the paged KV cache, returns logits."""

import itertools
import logging
import math
import mmap
import os
import time
from dataclasses import dataclass

import torch

from contract.engine import EngineConfig
from kernels import AttentionMetadata, backend_for, copy_blocks
from worker.engine.cuda_graphs import DecodeGraphs
from worker.engine.model.llama import KVCache, LlamaForCausalLM
from worker.engine.model.loader import load_model
from worker.engine.model.model_config import ModelConfig
from worker.engine.model.weights import describe
from worker.engine.scheduler import ScheduledBatch

logger = logging.getLogger("pagedq.engine")

DEFAULT_CPU_KV_BYTES = 4 << 30
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, model_config: ModelConfig, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32  # CPUs without bf16 matmul units run float32 fastest
    native = model_config.torch_dtype
    return native if native in (torch.float16, torch.bfloat16) else torch.bfloat16


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero-filled KV pool: attention reads the unwritten tail of a sequence's last block, which must
    hold finite values. On CPU it is anonymous memory, which the kernel hands out as zero pages only when
    first touched, so the pool costs RAM as blocks are used rather than all at once at start."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.frombuffer(mmap.mmap(-1, math.prod(shape) * dtype.itemsize), dtype=dtype).view(shape)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # rows of the flattened batch whose next token is sampled


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, model_config, self.device)
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        # Resolved now, so that a first-time build of the CPU kernels happens before the engine is ready.
        self.kernel_backend = backend_for(self.device)
        logger.info("kernels: %s", self.kernel_backend, extra={"kernel_backend": self.kernel_backend})
        self.model: LlamaForCausalLM = load_model(
            model_config,
            max_model_len,
            self.dtype,
            self.device,
            config.load_format,
            config.quantization,
            config.seed,
            config.batch_invariant,
            config.gguf_kernel,
        )
        self.batch_invariant = self.model.batch_invariant
        self.weights = describe(self.model, self.kernel_backend)
        logger.info("weights: %s", self.weights, extra={"weights": self.weights.as_json()})
        if config.batch_invariant and not self.batch_invariant:
            logger.warning(
                "batch invariance (batch_invariant, on by default) needs float32 or GGUF weights on CPU "
                "with the C++ kernels; it is off here: a request's tokens may depend on its batch"
            )
        self.num_blocks = self._num_kv_blocks(model_config)
        self.kv_caches = self._allocate_kv_cache(model_config)
        self.graphs = self._capture_decode_graphs()

    # --- KV cache ---

    def _num_kv_blocks(self, model_config: ModelConfig) -> int:
        block_bytes = model_config.kv_bytes_per_token(self.dtype) * self.block_size
        budget = self.config.kv_cache_bytes or self._default_kv_budget(block_bytes)
        num_blocks = int(budget // block_bytes)
        if num_blocks < 1:
            raise ValueError(
                f"KV cache budget of {budget} bytes holds no {self.block_size}-token block "
                f"({block_bytes} bytes each); raise kv_cache_bytes or gpu_memory_utilization"
            )
        self.kv_cache_bytes = num_blocks * block_bytes
        logger.info(
            "KV cache: %d blocks of %d tokens (%.2f GiB)",
            num_blocks,
            self.block_size,
            self.kv_cache_bytes / 2**30,
            extra={"kv_cache_blocks": num_blocks, "kv_cache_bytes": self.kv_cache_bytes},
        )
        return num_blocks

    def _default_kv_budget(self, block_bytes: int) -> int:
        """CUDA: the memory left after a profiled step. CPU: every seat's full context, at most
        ``DEFAULT_CPU_KV_BYTES`` and a fifth of RAM."""
        if self.device.type == "cuda":
            return self._profile_free_cuda_memory()
        usable = self.config.max_num_seqs * -(-self.max_model_len // self.block_size) * block_bytes
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return min(usable, DEFAULT_CPU_KV_BYTES, ram // 5)

    @torch.inference_mode()
    def _profile_free_cuda_memory(self) -> int:
        """Memory left for KV blocks after weights and the peak activations of a full-budget step.

        Profiles a prefill of ``max_num_batched_tokens`` tokens (as prompts of at most
        ``max_model_len``, the rotary table's length) into a throwaway cache. Memory that is not
        torch's (the CUDA context, other processes) counts as used. Not profiled: the sampler's
        full-vocabulary temporaries and the decode CUDA graphs, which the utilisation margin covers.
        """
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        num_tokens, bs = self.config.max_num_batched_tokens, self.block_size
        lens = [min(self.max_model_len, num_tokens - i) for i in range(0, num_tokens, self.max_model_len)]
        blocks_per_seq = -(-max(lens) // bs)
        num_blocks = blocks_per_seq * len(lens)
        cfg = self.model.config
        cache = torch.zeros(
            2,
            cfg.num_layers,
            num_blocks,
            bs,
            cfg.num_kv_heads,
            cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        tables = torch.arange(num_blocks, dtype=torch.int32, device=self.device)
        slots = [b * blocks_per_seq * bs + p for b, n in enumerate(lens) for p in range(n)]
        meta = AttentionMetadata(  # sequence b owns blocks [b * blocks_per_seq, (b + 1) * blocks_per_seq)
            slot_mapping=self._tensor(slots),
            block_tables=tables.view(len(lens), blocks_per_seq),
            query_start_loc=self._tensor([0, *itertools.accumulate(lens)], torch.int32),
            seq_lens=self._tensor(lens, torch.int32),
            query_lens_cpu=lens,
            seq_lens_cpu=lens,
            block_size=bs,
        )
        tokens = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        hidden = self.model(
            tokens,
            self._tensor([p for n in lens for p in range(n)]),
            [(cache[0, i], cache[1, i]) for i in range(cfg.num_layers)],
            meta,
        )
        self.model.compute_logits(hidden[: min(num_tokens, self.config.max_num_seqs)])
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - cache.numel() * cache.element_size()
        del cache, hidden
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        not_torch = total - free - torch.cuda.memory_reserved(self.device)
        return int(total * self.config.gpu_memory_utilization - peak - not_torch)

    def _allocate_kv_cache(self, model_config: ModelConfig) -> list[KVCache]:
        shape = (
            2,
            model_config.num_layers,
            self.num_blocks,
            self.block_size,
            model_config.num_kv_heads,
            model_config.head_dim,
        )
        pool = zeroed(shape, self.dtype, self.device)
        return [(pool[0, i], pool[1, i]) for i in range(model_config.num_layers)]

    def _capture_decode_graphs(self) -> DecodeGraphs | None:
        """Graphs need the Triton kernels: the torch reference plans decodes on the host."""
        if self.config.enforce_eager or self.device.type != "cuda" or backend_for(self.device) != "triton":
            return None
        start = time.perf_counter()
        graphs = DecodeGraphs(self.model, self.kv_caches, self.config.max_num_seqs, self.max_model_len)
        logger.info(
            "%d decode CUDA graphs captured in %.1f s", len(graphs.sizes), time.perf_counter() - start
        )
        return graphs

    # --- one step ---

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        logits_indices: list[int] = []
        bs = self.block_size
        for seq, num_new in zip(batch.sequences, batch.num_new_tokens, strict=True):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            table = seq.block_table
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            seq_lens.append(end)
            if end == seq.num_tokens:
                logits_indices.append(len(input_ids) - 1)
        max_blocks = max(len(seq.block_table) for seq in batch.sequences)
        tables = [seq.block_table + [0] * (max_blocks - len(seq.block_table)) for seq in batch.sequences]
        query_start_loc = [0]
        for n in batch.num_new_tokens:
            query_start_loc.append(query_start_loc[-1] + n)
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots),
            block_tables=self._tensor(tables, torch.int32),
            query_start_loc=self._tensor(query_start_loc, torch.int32),
            seq_lens=self._tensor(seq_lens, torch.int32),
            query_lens_cpu=list(batch.num_new_tokens),
            seq_lens_cpu=seq_lens,
            block_size=bs,
            batch_invariant=self.batch_invariant,
        )
        return StepInputs(
            self._tensor(input_ids), self._tensor(positions), meta, self._tensor(logits_indices)
        )

    def _tensor(self, values: list, dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, pin_memory=self.device.type == "cuda").to(
            self.device, non_blocking=True
        )

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits ``[num_sampled, vocab]`` (float32) for the sequences whose next token is due."""
        if batch.blocks_to_copy:
            pairs = self._tensor([list(pair) for pair in batch.blocks_to_copy])
            for k_cache, v_cache in self.kv_caches:
                copy_blocks(k_cache, v_cache, pairs)
        inputs = self.prepare(batch)
        if self.graphs is not None and self.graphs.fits(inputs.meta):
            hidden = self.graphs.run(inputs.input_ids, inputs.positions, inputs.meta)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        return self.model.compute_logits(hidden[inputs.logits_indices])
