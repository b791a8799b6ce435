"""The engine's greedy output equals transformers' on the same weights, however it is batched."""

import random
from pathlib import Path

import pytest
import torch

from kernels import dispatch
from tests.support.reference import HFReference, assert_pool_empty, chosen_logprobs
from tests.support.tiny_models import CORPUS
from worker.engine import LLM, SamplingParams

MAX_NEW = 24


def prompts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    text = " ".join(CORPUS[:5])
    return [text[(s := rng.randrange(len(text) // 2)) : s + rng.randrange(5, 200)] for _ in range(count)]


def greedy(logprobs: int | None = 0) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=logprobs)


@pytest.mark.parametrize(
    ("model", "backend"),
    [(name, "auto") for name in ("tiny_llama", "tiny_qwen2", "tiny_llama3", "tiny_mistral")]
    + [("tiny_llama3", "torch")],  # auto is the C++ kernels on CPU; the torch reference, end to end
)
def test_greedy_matches_transformers(
    model: str, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(dispatch.BACKEND_ENV, backend)
    assert dispatch.backend_for(torch.device("cpu")) == ("cpu" if backend == "auto" else backend), (
        "the CPU kernels did not build"
    )
    path: Path = request.getfixturevalue(model)
    llm = LLM(str(path), kv_cache_bytes=8 << 20)
    reference = HFReference(path)
    texts = prompts(8)
    outputs = llm.generate(texts, greedy())
    for text, out in zip(texts, outputs, strict=True):
        ids = llm.tokenizer.encode(text)
        want_tokens, want_logprobs = reference.greedy(ids, MAX_NEW, stop_at_eos=False)
        got = out.outputs[0]
        assert got.token_ids == want_tokens
        assert chosen_logprobs(got) == pytest.approx(want_logprobs, abs=1e-4)
        assert got.text == llm.tokenizer.decode(want_tokens, skip_special_tokens=True)
        assert got.finish_reason == "length"
    assert_pool_empty(llm)


@pytest.fixture(scope="module")
def expected(tiny_llama: Path) -> dict[str, list[int]]:
    reference, llm = HFReference(tiny_llama), LLM(str(tiny_llama), kv_cache_bytes=8 << 20)
    return {
        t: reference.greedy(llm.tokenizer.encode(t), MAX_NEW, stop_at_eos=False)[0] for t in prompts(32, 1)
    }


PREEMPTING_POOL = 24 * 16 * 512  # 24 blocks of 16 tokens at 512 bytes/token: a few requests at a time


@pytest.mark.parametrize(
    ("engine_args", "expect_preemption"),
    [
        pytest.param({"enable_prefix_caching": True}, False, id="prefix-caching-on"),
        pytest.param({"enable_prefix_caching": False}, False, id="prefix-caching-off"),
        pytest.param({"max_num_batched_tokens": 19}, False, id="chunked-prefill"),
        pytest.param({"kv_cache_bytes": PREEMPTING_POOL}, True, id="preemption"),
        pytest.param({"max_num_seqs": 3, "block_size": 32}, False, id="few-seats"),
    ],
)
def test_batching_modes_give_the_same_tokens(
    tiny_llama: Path, expected: dict[str, list[int]], engine_args: dict, expect_preemption: bool
) -> None:
    llm = LLM(str(tiny_llama), **{"kv_cache_bytes": 8 << 20, **engine_args})
    texts = list(expected)
    shared_prefix = [texts[0] + t for t in texts[:4]]  # exercises the prefix cache
    outputs = llm.generate(texts + shared_prefix, greedy(None))
    for text, out in zip(texts, outputs, strict=False):
        assert out.outputs[0].token_ids == expected[text], text
    assert (llm.engine.scheduler.num_preemptions > 0) == expect_preemption
    assert_pool_empty(llm)


def test_alone_equals_inside_a_batch_of_32(tiny_llama: Path, expected: dict[str, list[int]]) -> None:
    llm = LLM(str(tiny_llama), kv_cache_bytes=8 << 20)
    texts = list(expected)
    alone = llm.generate(texts[5], greedy(0))[0].outputs[0]
    batched = llm.generate(texts, greedy(0))[5].outputs[0]
    assert alone.token_ids == batched.token_ids == expected[texts[5]]
    assert chosen_logprobs(alone) == pytest.approx(chosen_logprobs(batched), abs=1e-5)
    assert_pool_empty(llm)


def test_prefix_cache_serves_a_repeated_prompt(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), kv_cache_bytes=8 << 20, block_size=16)
    text = prompts(1, 3)[0] * 3
    first = llm.generate(text, greedy(None))[0]
    second = llm.generate(text, greedy(None))[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == (len(first.prompt_token_ids) - 1) // 16 * 16 > 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_bfloat16_stays_close_to_transformers_in_bfloat16(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), kv_cache_bytes=8 << 20, dtype="bfloat16")
    reference = HFReference(tiny_llama, torch.bfloat16)
    texts = prompts(8, 2)
    agreeing = 0
    for text, out in zip(texts, llm.generate(texts, greedy(0)), strict=True):
        want_tokens, want_logprobs = reference.greedy(llm.tokenizer.encode(text), 4, stop_at_eos=False)
        got = out.outputs[0]
        if got.token_ids[:4] == want_tokens:
            agreeing += 1
            assert chosen_logprobs(got)[:4] == pytest.approx(want_logprobs, abs=0.15)
    assert agreeing >= 6  # bfloat16 rounding may flip a near-tie, not most choices


def test_cpu_float32_linears_run_on_packed_weights(tiny_llama: Path) -> None:
    """The parity tests above run on oneDNN-packed weights, not on nn.Linear."""
    model = LLM(str(tiny_llama), kv_cache_bytes=8 << 20).engine.runner.model
    kinds = {type(m).__name__ for m in model.modules() if not list(m.children())}
    assert "OneDNNLinear" in kinds and "Linear" not in kinds, kinds
    assert model.embed_tokens.weight.dtype == torch.float32


def test_fp16_weights_stay_close_to_transformers_in_float32(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), kv_cache_bytes=8 << 20, quantization="fp16")
    linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == [], "every linear, the tied lm_head too, runs on float16 weights"
    reference = HFReference(tiny_llama)
    texts = prompts(8, 2)
    for text, out in zip(texts, llm.generate(texts, greedy(0)), strict=True):
        want_tokens, want_logprobs = reference.greedy(llm.tokenizer.encode(text), 4, stop_at_eos=False)
        got = out.outputs[0]
        assert got.token_ids[:4] == want_tokens
        assert chosen_logprobs(got)[:4] == pytest.approx(want_logprobs, abs=0.01)


def test_fp16_weights_need_float32_weights_on_cpu(tiny_llama: Path) -> None:
    with pytest.raises(ValueError, match=r"packs float32 weights on CPU, not torch\.bfloat16 on cpu"):
        LLM(str(tiny_llama), kv_cache_bytes=8 << 20, quantization="fp16", dtype="bfloat16")
    with pytest.raises(ValueError, match="quantization must be 'none', 'fp16' or 'gguf', got 'int8'"):
        LLM(str(tiny_llama), quantization="int8")


def test_dummy_weights_need_only_a_config(tiny_llama: Path, tmp_path: Path) -> None:
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_llama / name).read_bytes())
    llm = LLM(str(tmp_path), load_format="dummy", kv_cache_bytes=8 << 20)
    out = llm.generate("Hello there", greedy(None))[0].outputs[0]
    assert len(out.token_ids) == MAX_NEW
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors weights"):
        LLM(str(tmp_path), kv_cache_bytes=8 << 20)


def test_requests_arriving_together_compute_a_shared_prefix_once(tiny_llama: Path) -> None:
    shared = prompts(1, 4)[0] * 2
    docs = [shared + text for text in prompts(6, 5)]
    cached = LLM(str(tiny_llama), kv_cache_bytes=8 << 20, block_size=16)
    outputs = cached.generate(docs, greedy(None))
    prefix_blocks = len(cached.tokenizer.encode(shared)) // 16
    assert all(out.num_cached_tokens >= prefix_blocks * 16 for out in outputs[1:])
    plain = LLM(str(tiny_llama), kv_cache_bytes=8 << 20, block_size=16, enable_prefix_caching=False)
    assert [o.outputs[0].token_ids for o in plain.generate(docs, greedy(None))] == [
        o.outputs[0].token_ids for o in outputs
    ]
