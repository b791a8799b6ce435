"""The BERT-family encoder (BERT, MiniLM, the sentence-transformers models built on them) over a packed
batch: the tokens of every input of a step concatenated, no padding.

Word + absolute position + token-type embeddings, then post-LayerNorm blocks (bidirectional attention,
GELU MLP). The linears run on the whole packed batch at once (oneDNN, with the GELU and the residual adds
fused in where it runs: ``cpu_linears.py``); only attention keeps the inputs apart
(``kernels.encoder_attention``: on CPU one C++ call per layer reading q, k and v in place), since no input
sees another's tokens. There is no KV cache.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernels import encoder_attention
from worker.engine.model.cpu_linears import linear_add, linear_gelu
from worker.engine.model.llama import empty_param


@dataclass(frozen=True)
class PackedBatch:
    """The inputs of a step, their tokens concatenated: input b is the ``lens[b]`` rows after those of
    the inputs before it."""

    lens: list[int]

    @classmethod
    def of(cls, lens: list[int]) -> "PackedBatch":
        if not lens or min(lens) < 1:
            raise ValueError(f"a packed batch needs inputs of at least one token, got lengths {lens}")
        return cls(list(lens))

    @property
    def num_tokens(self) -> int:
        return sum(self.lens)


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = empty_param(size), empty_param(size), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class BertEmbeddings(nn.Module):
    def __init__(self, config: "BertConfig") -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token type 0 throughout: one text per input, as sentence-transformers embeds it."""
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(x + self.token_type_embeddings.weight[0])


class BertLayer(nn.Module):
    def __init__(self, config: "BertConfig") -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.attention_out = nn.Linear(hidden, hidden)
        self.attention_norm = LayerNorm(hidden, config.layer_norm_eps)
        self.intermediate = nn.Linear(hidden, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, hidden)
        self.output_norm = LayerNorm(hidden, config.layer_norm_eps)

    def forward(self, x: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        attention = encoder_attention(self.qkv(x), batch.lens, self.num_heads)
        x = self.attention_norm(linear_add(self.attention_out, attention, x))
        return self.output_norm(linear_add(self.output, linear_gelu(self.intermediate, x), x))


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face ``BertConfig`` that the encoder reads."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_hf(cls, hf: dict) -> "BertConfig":
        if hf.get("model_type") != "bert":
            raise ValueError(f"model_type {hf.get('model_type')!r} is not a BERT encoder")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported")
        if hf.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (BERT's is gelu)")
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            intermediate_size=hf["intermediate_size"],
            max_position_embeddings=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        )


class BertModel(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_layers))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """The last hidden states of every token, ``[T, hidden]``."""
        x = self.embeddings(input_ids, positions)
        for layer in self.layers:
            x = layer(x, batch)
        return x
