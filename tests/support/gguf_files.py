"""Small GGUF files written on the spot with the ``gguf`` package: weights quantized by its own
quantizers (Q8_0, Q4_0, Q4_1) or, for the types it cannot quantize (the K-quants), random block bytes
with sane float16 scales, which are valid weights of that type."""

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants
from safetensors.torch import load_file, save_file

from kernels.quant_reference import TYPES

QUANTIZABLE = ("Q8_0", "Q4_0", "Q4_1", "F16", "BF16", "F32")
# Byte offsets of each K-quant block's float16 scales (d, dmin), and about the value they get: with the
# random 4-6 bit values and 6/8-bit sub-block scales, weights spread about 0.1-0.2 around zero (dmin
# times the random mins cancels d times the mean value).
K_SCALES = {"Q4_K": {0: 8e-4, 2: 6e-3}, "Q5_K": {0: 4e-4, 2: 6e-3}, "Q6_K": {208: 1.5e-4}}


def ggml_type(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name]


def encode(values: np.ndarray, type_name: str, rng: np.random.Generator) -> np.ndarray:
    """``values`` (float32 [rows, cols]) as the type stores them: quantized bytes or float values. The
    K-quants ignore ``values``: their blocks are random."""
    if type_name == "F32":
        return values.astype(np.float32)
    if type_name in QUANTIZABLE:
        return quants.quantize(values.astype(np.float32), ggml_type(type_name))
    kind = TYPES[type_name]
    rows, cols = values.shape
    blocks = rng.integers(0, 256, size=(rows * cols // kind.block, kind.block_bytes), dtype=np.uint8)
    for at, scale in K_SCALES[type_name].items():
        d = (rng.uniform(0.5, 1.5, size=blocks.shape[0]) * scale).astype(np.float16)
        blocks[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def decode(stored: np.ndarray, type_name: str) -> np.ndarray:
    """The ``gguf`` package's de-quantization: the reference our torch one must equal."""
    if type_name == "F32":
        return stored
    return quants.dequantize(stored, ggml_type(type_name)).astype(np.float32)


def write_gguf(
    path: Path,
    tensors: dict[str, tuple[str, np.ndarray]],
    arch: str = "llama",
    model: Path | None = None,
    **metadata: int | float,
) -> Path:
    """Write ``{name: (type, stored)}`` (``encode``'s output, or any GGML type's bytes) with
    ``general.architecture = arch`` and ``metadata`` as ``{arch}.{key}`` fields; with ``model`` (a Hugging
    Face directory), its hyperparameters and tokenizer too, as llama.cpp's converter writes them."""
    writer = GGUFWriter(path, arch)
    if model is not None:
        add_model_metadata(writer, model)
    for key, value in metadata.items():
        add = writer.add_float32 if isinstance(value, float) else writer.add_uint32
        add(f"{arch}.{key}", value)
    for name, (type_name, stored) in tensors.items():
        raw = None if type_name in ("F32", "F16") else ggml_type(type_name)
        writer.add_tensor(name, stored, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_model_metadata(writer: GGUFWriter, model: Path) -> None:
    """``model``'s config (sizes, rope, norm, context) and byte-level BPE tokenizer (vocabulary, merges,
    special tokens, chat template) as GGUF metadata: what a ``.gguf`` file served alone carries."""
    config = json.loads((model / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda item: item[1])
    special = {token["id"] for token in tokenizer["added_tokens"] if token["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([token for token, _ in vocab])
    writer.add_token_types([3 if i in special else 1 for _, i in vocab])  # 3: control, 1: normal
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template((model / "chat_template.jinja").read_text())


GGUF_NAMES = {  # Hugging Face's names -> llama.cpp's, per layer where {i} is in them
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.self_attn.q_proj": "blk.{i}.attn_q",
    "model.layers.{i}.self_attn.k_proj": "blk.{i}.attn_k",
    "model.layers.{i}.self_attn.v_proj": "blk.{i}.attn_v",
    "model.layers.{i}.self_attn.o_proj": "blk.{i}.attn_output",
    "model.layers.{i}.mlp.gate_proj": "blk.{i}.ffn_gate",
    "model.layers.{i}.mlp.up_proj": "blk.{i}.ffn_up",
    "model.layers.{i}.mlp.down_proj": "blk.{i}.ffn_down",
    "model.layers.{i}.input_layernorm": "blk.{i}.attn_norm",
    "model.layers.{i}.post_attention_layernorm": "blk.{i}.ffn_norm",
}


def gguf_name(hf_name: str) -> str:
    if hf_name in GGUF_NAMES:
        return GGUF_NAMES[hf_name]
    parts = hf_name.split(".")
    layer, stem, suffix = parts[2], ".".join([*parts[:2], "{i}", *parts[3:-1]]), parts[-1]
    return f"{GGUF_NAMES[stem].format(i=layer)}.{suffix}"


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_order(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of ``llama_cpp_permute``."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_model_dir(
    src: Path, dest: Path, types: list[str], arch: str = "llama", seed: int = 0, metadata: bool = False
) -> Path:
    """``src`` (a Hugging Face directory) as a directory with its config and tokenizer, a ``model.gguf``
    whose matrices take ``types`` in turn, and a ``model.safetensors`` of the GGUF's weights de-quantized
    to float32 in Hugging Face's order: the float32 engine on exactly the GGUF's weights. ``metadata``:
    the ``model.gguf`` carries the model's config and tokenizer too (``add_model_metadata``), so it can be
    served as a file of its own."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((src / "config.json").read_text())
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    rng = np.random.default_rng(seed)
    stored, floats = {}, {}
    for n, (name, value) in enumerate(sorted(load_file(src / "model.safetensors").items())):
        w = value.float().numpy()
        head = next((h for part, h in heads.items() if f".{part}." in name), None)
        permuted = head is not None and arch == "llama" and name.endswith("weight")
        if permuted:
            w = llama_cpp_permute(w, head)
        type_name = "F32" if w.ndim == 1 else types[n % len(types)]
        stored[gguf_name(name)] = (type_name, encode(w, type_name, rng))
        back = decode(stored[gguf_name(name)][1], type_name).reshape(w.shape)
        floats[name] = torch.from_numpy(hf_order(back, head) if permuted else back).contiguous()
    write_gguf(dest / "model.gguf", stored, arch, model=src if metadata else None)
    save_file(floats, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest
