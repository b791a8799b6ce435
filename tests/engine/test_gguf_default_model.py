"""The default model served from its own Q4_1 GGUF file (``quantization="gguf"``) against the float32
engine on the same weights de-quantized (the default path's ``model.safetensors`` is that file
de-quantized by transformers): issue 29's fidelity bars, on 24 chat prompts.

- Greedy, 48 tokens each: at least 18 of 24 share their first 16 tokens, and the mean common prefix is
  at least 32.
- Teacher-forced top-1 agreement over 24 x 64 positions (each prompt followed by float32's own 64 greedy
  tokens, run as one prefill through each model): at least 98%.

Both run the kernels' float path (``gguf_kernel="float"``, the default: the weights de-quantized in
registers, float32 activations), which differs from float32 by summation order only: measured 24 of 24
sharing all 48 tokens, and 1536 of 1536 positions agreeing. The int8 path
(activations quantized per 32 values) missed the first bar: 14 of 24, mean 23.8 (bench/RESULTS.md), its
partings all at near-ties of float32's own; what is held for it here is that every parting is such a
near-tie."""

import pytest
import torch

from kernels import AttentionMetadata
from tests.engine.test_smollm2_parity import QUESTIONS
from worker.engine import LLM, SamplingParams
from worker.engine.default_model import DEFAULT_MODEL
from worker.engine.model.llama import LlamaForCausalLM

pytestmark = pytest.mark.slow

PROMPTS = [
    *QUESTIONS,
    "Name a colour of the rainbow.",
    "What is the boiling point of water in Celsius?",
    "Suggest a title for a short story about a lighthouse keeper.",
    "How many legs does a spider have?",
    "Write one sentence about autumn.",
    "What is the opposite of 'ancient'?",
    "Give an example of a mammal that can fly.",
    "What language is spoken in Brazil?",
][:24]
MAX_NEW = 48
FORCED = 64
NEAR_TIE = 0.5  # nats: the int8 activations move these logprobs by up to ~0.35
BLOCK = 16


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@torch.inference_mode()
def top1_at_every_position(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """The model's argmax after each prefix of ``ids``: one prefill into a KV pool of its own."""
    n, blocks = len(ids), -(-len(ids) // BLOCK)
    config = model.config
    shape = (blocks + 1, BLOCK, config.num_kv_heads, config.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in model.layers]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n) + BLOCK,
        block_tables=torch.arange(1, blocks + 1, dtype=torch.int32).view(1, -1),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        query_lens_cpu=[n],
        seq_lens_cpu=[n],
        block_size=BLOCK,
    )
    hidden = model(torch.tensor(ids), torch.arange(n), caches, meta)
    return model.compute_logits(hidden).argmax(-1)


def chats(llm: LLM, params: SamplingParams) -> list:
    return llm.chat([[{"role": "user", "content": p}] for p in PROMPTS], params)


@pytest.fixture(scope="module")
def dense() -> LLM:
    return LLM(DEFAULT_MODEL, max_num_batched_tokens=1024, kv_cache_bytes=256 << 20)


@pytest.fixture(scope="module")
def want(dense: LLM) -> list:
    """float32's own FORCED greedy tokens of each prompt, with their top-5 logprobs: both tests compare
    with them (asking for logprobs samples the same tokens), so float32 generates once."""
    return chats(dense, SamplingParams(temperature=0.0, max_tokens=FORCED, ignore_eos=True, logprobs=5))


def gguf(kernel: str) -> LLM:
    llm = LLM(
        DEFAULT_MODEL,
        quantization="gguf",
        gguf_kernel=kernel,
        max_num_batched_tokens=1024,
        kv_cache_bytes=256 << 20,
    )
    types = llm.engine.runner.weights.types
    assert "Q4_1" in types and set(types) <= {"Q4_1", "Q8_0", "Q6_K", "F16", "F32"}
    return llm


@pytest.mark.timeout(3600)  # 24 x 64 + 24 x 48 tokens and 2 x 24 prefills: minutes on a busy 2-core box
def test_default_model_gguf_meets_the_fidelity_bars(dense: LLM, want: list) -> None:
    quantized = gguf("float")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in chats(quantized, params)]
    prefixes = [common_prefix(a, b.outputs[0].token_ids[:MAX_NEW]) for a, b in zip(got, want, strict=True)]
    agree = total = 0
    for request in want:
        ids = request.prompt_token_ids + request.outputs[0].token_ids
        rows = slice(len(request.prompt_token_ids) - 1, len(ids) - 1)  # predicting the 64 forced tokens
        ours = top1_at_every_position(quantized.engine.runner.model, ids)[rows]
        theirs = top1_at_every_position(dense.engine.runner.model, ids)[rows]
        agree, total = agree + int((ours == theirs).sum()), total + FORCED
    shared, mean = sum(p >= 16 for p in prefixes), sum(prefixes) / len(prefixes)
    print(f"common prefixes {prefixes}: {shared} of 24 share 16 tokens, mean {mean:.1f}")
    print(f"teacher-forced top-1 agreement {agree} of {total} ({agree / total:.2%})")
    assert shared >= 18 and mean >= 32, prefixes
    assert agree >= 0.98 * total


@pytest.mark.timeout(3600)
def test_int8_kernels_part_from_float32_only_at_near_ties(want: list) -> None:
    quantized = gguf("int8")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=5)
    got = [o.outputs[0] for o in chats(quantized, params)]
    dense = [o.outputs[0] for o in want]
    prefixes = [common_prefix(a.token_ids, b.token_ids[:MAX_NEW]) for a, b in zip(got, dense, strict=True)]
    for k, a, b in zip(prefixes, got, dense, strict=True):
        if k < MAX_NEW:  # float32 ranked the kernels' choice within NEAR_TIE of its own
            top = b.logprobs[k]
            assert top.get(a.token_ids[k], -float("inf")) >= top[b.token_ids[k]] - NEAR_TIE, (k, top)
    print(f"int8: common prefixes {prefixes}: {sum(p >= 16 for p in prefixes)} of 24 share 16 tokens")
    assert sum(p >= 16 for p in prefixes) >= 12, prefixes
