"""Tiny random-weight Hugging Face models (with a real byte-level BPE tokenizer) for fast tests, and tiny
BERT encoders (a WordPiece tokenizer) laid out as sentence-transformers directories."""

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Continuous batching refills a slot as soon as a request finishes.",
    "héllo wörld — 日本語 🙂 ça va? ¿qué tal? Grüße!",
    "def add(a, b):\n    return a + b\n",
] * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def make_tiny_model(path: Path, arch: str = "llama", seed: int = 0, **overrides: object) -> Path:
    """Save a random model and its tokenizer as a Hugging Face directory with safetensors weights."""
    tokenizer = build_tokenizer()
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=0.2,  # peaky logits: greedy choices are not near-ties
    )
    common.update(overrides)
    torch.manual_seed(seed)
    config_class, model_class = ARCHITECTURES[arch]
    model = model_class(config_class(**common))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_wordpiece_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """BERT's uncased WordPiece pipeline ([CLS] text [SEP]), trained on the corpus."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(
        CORPUS, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=BERT_SPECIAL)
    )
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def write_sentence_transformers_files(
    path: Path, pooling: str, normalize: bool, hidden_size: int, max_seq_length: int | None
) -> None:
    """modules.json (Transformer -> Pooling -> Normalize if ``normalize``), the Pooling module's config and
    sentence_bert_config.json, as sentence-transformers saves them."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    modules.append(
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
    )
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    keys = {
        "mean": "pooling_mode_mean_tokens",
        "cls": "pooling_mode_cls_token",
        "last": "pooling_mode_lasttoken",
    }
    config = {"word_embedding_dimension": hidden_size} | {key: key == keys[pooling] for key in keys.values()}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(config))
    bert_config = {"do_lower_case": False} | ({"max_seq_length": max_seq_length} if max_seq_length else {})
    (path / "sentence_bert_config.json").write_text(json.dumps(bert_config))


def make_tiny_bert(
    path: Path, pooling: str = "mean", normalize: bool = True, max_seq_length: int | None = 48, seed: int = 0
) -> Path:
    """A random BertModel (2 layers, hidden 64) with a WordPiece tokenizer, as a sentence-transformers
    directory."""
    tokenizer = build_wordpiece_tokenizer()
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        initializer_range=0.2,  # states far from zero: pooling and normalization are exercised
    )
    torch.manual_seed(seed)
    BertModel(config, add_pooling_layer=False).save_pretrained(path)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(path)
    write_sentence_transformers_files(path, pooling, normalize, config.hidden_size, max_seq_length)
    return path
