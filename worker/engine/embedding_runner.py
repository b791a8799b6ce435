"""Runs an embedding model over a packed batch of inputs and returns their token states.

A BERT encoder (``model/bert.py``) takes the packed tokens as they are. A causal decoder served for
embeddings (``kind="embed"``: Qwen3-Embedding's shape, pooling its last token) runs the generation
model over a scratch KV cache of the step's own blocks, which lives for that step only: no prefix
cache, no decode, so no block manager.
"""

import itertools
from typing import Protocol

import torch

from contract.engine import EngineConfig
from kernels import AttentionMetadata, backend_for
from worker.engine.model.bert import PackedBatch
from worker.engine.model.bert_loader import load_bert
from worker.engine.model.loader import load_model
from worker.engine.model.model_config import ModelConfig
from worker.engine.model.weights import LoadedWeights, describe
from worker.engine.model_runner import resolve_device, resolve_dtype

SCRATCH_BLOCK_SIZE = 16


class EmbeddingRunner(Protocol):
    device: torch.device
    dtype: torch.dtype
    weights: LoadedWeights

    def run(self, inputs: list[list[int]]) -> torch.Tensor:
        """Final hidden states ``[tokens, hidden]`` of ``inputs``' tokens, packed in their order."""
        ...


def make_runner(config: EngineConfig, model_config: ModelConfig) -> EmbeddingRunner:
    if model_config.hf_config.model_type == "bert":
        return EncoderRunner(config, model_config)
    return DecoderRunner(config, model_config)


class EncoderRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, model_config, self.device)
        if config.load_format != "safetensors" or model_config.path is None:
            raise ValueError(f"an encoder loads its safetensors weights; load_format={config.load_format!r}")
        self.model = load_bert(model_config.path, self.dtype, self.device, config.quantization)
        self.weights = describe(self.model, backend_for(self.device))

    @torch.inference_mode()
    def run(self, inputs: list[list[int]]) -> torch.Tensor:
        batch = PackedBatch.of([len(ids) for ids in inputs])
        ids = torch.tensor(list(itertools.chain.from_iterable(inputs)), device=self.device)
        positions = torch.tensor([p for n in batch.lens for p in range(n)], device=self.device)
        return self.model(ids, positions, batch)


class DecoderRunner:
    def __init__(self, config: EngineConfig, model_config: ModelConfig) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, model_config, self.device)
        backend = backend_for(self.device)  # builds the CPU kernels now, before the engine is ready
        max_positions = model_config.hf_config.max_position_embeddings
        self.model_config = model_config
        self.model = load_model(
            model_config, max_positions, self.dtype, self.device, config.load_format, config.quantization
        )
        self.weights = describe(self.model, backend)

    @torch.inference_mode()
    def run(self, inputs: list[list[int]]) -> torch.Tensor:
        lens = [len(ids) for ids in inputs]
        bs, cfg = SCRATCH_BLOCK_SIZE, self.model_config
        blocks = [-(-n // bs) for n in lens]
        first_block = list(itertools.accumulate(blocks, initial=0))
        tables = [
            [first_block[b] + i for i in range(blocks[b])] + [0] * (max(blocks) - blocks[b])
            for b in range(len(lens))
        ]
        shape = (2, cfg.num_layers, first_block[-1], bs, cfg.num_kv_heads, cfg.head_dim)
        cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        meta = AttentionMetadata(
            slot_mapping=self._tensor(
                [first_block[b] * bs + p for b, n in enumerate(lens) for p in range(n)]
            ),
            block_tables=self._tensor(tables, torch.int32),
            query_start_loc=self._tensor([0, *itertools.accumulate(lens)], torch.int32),
            seq_lens=self._tensor(lens, torch.int32),
            query_lens_cpu=lens,
            seq_lens_cpu=lens,
            block_size=bs,
        )
        ids = self._tensor(list(itertools.chain.from_iterable(inputs)))
        positions = self._tensor([p for n in lens for p in range(n)])
        kv = [(cache[0, i], cache[1, i]) for i in range(cfg.num_layers)]
        return self.model.norm(self.model(ids, positions, kv, meta))

    def _tensor(self, values: list, dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)
