"""Build the model from a GGUF file with its weights in their block formats (``quantization="gguf"``).

The model's skeleton is made on the meta device (no float32 weights are ever allocated); its linears
and embedding become ``GGUFLinear`` / ``GGUFEmbedding`` over the file's memory-mapped tensors, and
only the norms (a few KB of F32) are copied. The config and tokenizer come from the model directory's
``config.json`` as for safetensors; the file's own architecture and shapes are checked against it.

llama.cpp's converter stores a Llama's q and k projections with the rows of each head interleaved
(its rotary pairs neighbouring values); their rows are put back in Hugging Face's order here, a copy of
those two tensors' blocks, as transformers does when it reads a GGUF.
"""

import logging
from pathlib import Path

import torch
from torch import nn

from worker.engine.model.gguf_file import GGUFError, GGUFFile, GGUFTensor
from worker.engine.model.gguf_layers import FusedGGUFLayer, GGUFEmbedding, GGUFLinear, float_rows
from worker.engine.model.llama import LlamaForCausalLM
from worker.engine.model.model_config import ModelConfig
from worker.engine.model.rotary import RotaryEmbedding

logger = logging.getLogger("pagedq.engine")

ARCHITECTURES = {"llama", "qwen2"}  # what GGUF files call the families pagedq runs
PERMUTED_ARCHITECTURES = {"llama"}  # q/k rows interleaved by llama.cpp's converter


def find_gguf(model_dir: Path) -> Path:
    """The one ``*.gguf`` file in ``model_dir``."""
    files = sorted(Path(model_dir).glob("*.gguf"))
    if len(files) != 1:
        found = ", ".join(f.name for f in files) or "none"
        raise FileNotFoundError(
            f"quantization='gguf' serves the one .gguf file in {model_dir}, next to its config.json and "
            f"tokenizer; found {found}"
        )
    return files[0]


def load_gguf_model(
    config: ModelConfig, max_positions: int, path: Path, int8: bool = False
) -> LlamaForCausalLM:
    """``int8``: the linears run the kernels' integer path (``GGUFLinear``), else their float one."""
    file = GGUFFile.open(path)
    if file.architecture not in ARCHITECTURES:
        raise GGUFError(
            f"{path}: architecture {file.architecture!r} is not supported; pagedq serves GGUF files of "
            f"{sorted(ARCHITECTURES)}"
        )
    with torch.device("meta"):
        model = LlamaForCausalLM(config, max_positions, torch.float32)
    model.rotary = RotaryEmbedding(config.hf_config, config.head_dim, max_positions, torch.float32)
    Weights(file, config, int8).fill(model)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise GGUFError(f"{path}: no weights for {left[:3]}")
    logger.info("loaded %d GGUF tensors from %s", len(file.tensors), path)  # the runner describes them
    return model.eval().requires_grad_(False)


class Weights:
    """The file's tensors by their role, checked against the config's shapes."""

    def __init__(self, file: GGUFFile, config: ModelConfig, int8: bool = False) -> None:
        self.file, self.config, self.int8 = file, config, int8
        self.used: set[str] = set()

    def get(self, name: str, shape: tuple[int, ...]) -> GGUFTensor:
        tensor = self.file.tensors.get(name)
        if tensor is None:
            raise GGUFError(f"{self.file.path}: no tensor {name!r}")
        if tensor.shape != shape:
            raise GGUFError(
                f"{self.file.path}: tensor {name!r} ({tensor.type.name}) is {list(tensor.shape)}, but "
                f"{self.config.path}/config.json makes it {list(shape)}"
            )
        self.used.add(name)
        return tensor

    def norm(self, name: str) -> nn.Parameter:
        return nn.Parameter(float_rows(self.get(name, (self.config.hidden_size,))), requires_grad=False)

    def fill(self, model: LlamaForCausalLM) -> None:
        c = self.config
        embedding = self.get("token_embd.weight", (c.vocab_size, c.hidden_size))
        model.embed_tokens = GGUFEmbedding(embedding)
        output = "token_embd.weight" if c.tie_word_embeddings else "output.weight"
        if "output.weight" in self.file.tensors:
            output = "output.weight"  # a file may untie what the config ties
        model.lm_head = self.linear([self.get(output, (c.vocab_size, c.hidden_size))])
        model.norm.weight = self.norm("output_norm.weight")
        for i, layer in enumerate(model.layers):
            self.fill_layer(i, layer)

    def fill_layer(self, i: int, layer: nn.Module) -> None:
        c, blk = self.config, f"blk.{i}"
        hidden, q, kv = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        attn, mlp = layer.self_attn, layer.mlp
        parts = [
            self.rows(f"{blk}.attn_q.weight", (q, hidden), c.num_heads),
            self.rows(f"{blk}.attn_k.weight", (kv, hidden), c.num_kv_heads),
            self.get(f"{blk}.attn_v.weight", (kv, hidden)),
        ]
        attn.qkv_proj = self.linear(parts, self.qkv_bias(blk, q, kv) if c.qkv_bias else None)
        attn.o_proj = self.linear([self.get(f"{blk}.attn_output.weight", (hidden, q))])
        inter = c.intermediate_size
        gate_up = [self.get(f"{blk}.ffn_{part}.weight", (inter, hidden)) for part in ("gate", "up")]
        mlp.gate_up_proj = self.linear(gate_up)
        mlp.down_proj = self.linear([self.get(f"{blk}.ffn_down.weight", (hidden, inter))])
        layer.input_layernorm.weight = self.norm(f"{blk}.attn_norm.weight")
        layer.post_attention_layernorm.weight = self.norm(f"{blk}.ffn_norm.weight")
        layer.fused = FusedGGUFLayer.of(layer, c)

    def linear(self, parts: list[GGUFTensor], bias: torch.Tensor | None = None) -> GGUFLinear:
        return GGUFLinear(parts, bias, self.int8)

    def rows(self, name: str, shape: tuple[int, ...], heads: int) -> GGUFTensor:
        """A q or k projection with its rows in Hugging Face's order (see the module's docstring)."""
        tensor = self.get(name, shape)
        if self.file.architecture not in PERMUTED_ARCHITECTURES:
            return tensor
        order = torch.arange(shape[0]).view(heads, -1, 2).transpose(1, 2).reshape(-1)
        return GGUFTensor(tensor.name, tensor.type, tensor.shape, tensor.data.index_select(0, order))

    def qkv_bias(self, blk: str, q: int, kv: int) -> torch.Tensor:
        sizes = {"q": q, "k": kv, "v": kv}
        return torch.cat([float_rows(self.get(f"{blk}.attn_{p}.bias", (n,))) for p, n in sizes.items()])
