"""Beam search: the same hypotheses as transformers' ``generate(num_beams=k)``, sharing KV blocks."""

import collections
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.support.reference import assert_pool_empty, hf_beam_search
from worker.engine import LLM, SamplingParams

PROMPTS = ["The quick brown fox", "Paged attention stores", "def add(a, b):", "héllo wörld", "¿qué tal?"]
MAX_NEW = 12


def beam_params(width: int, **options: object) -> SamplingParams:
    return SamplingParams(use_beam_search=True, n=width, temperature=0.0, max_tokens=MAX_NEW, **options)


@pytest.fixture(scope="module")
def setup(tiny_llama: Path) -> tuple[LLM, AutoModelForCausalLM, list[list[int]], int]:
    """The engine, the transformers model, the prompts, and a token the model often emits: used as an
    extra stop token so that hypotheses end at different lengths and the length penalty matters."""
    llm = LLM(str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=32 * 2**20)
    prompts = [AutoTokenizer.from_pretrained(tiny_llama).encode(p) for p in PROMPTS]
    outputs = llm.generate(prompts, beam_params(4))
    common = collections.Counter(t for o in outputs for s in o.outputs for t in s.token_ids[1:8])
    model = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    return llm, model, prompts, common.most_common(1)[0][0]


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize(
    ("length_penalty", "early_stopping"), [(1.0, False), (0.5, True), (2.0, "never"), (-1.0, False)]
)
def test_beams_equal_transformers(
    setup, width: int, length_penalty: float, early_stopping: bool | str
) -> None:
    llm, model, prompts, stop = setup
    options = {"length_penalty": length_penalty, "early_stopping": early_stopping}
    outputs = llm.generate(prompts, beam_params(width, stop_token_ids=[stop], **options))
    eos = [*llm.engine.eos_token_ids, stop]
    for prompt, out in zip(prompts, outputs, strict=True):
        want = hf_beam_search(model, prompt, width, MAX_NEW, eos, **options)
        assert [sample.token_ids for sample in out.outputs] == want
    if length_penalty < 0:  # favours short hypotheses: the stop token must have ended some
        assert any(sample.finish_reason == "stop" for out in outputs for sample in out.outputs)
    assert_pool_empty(llm)


def test_best_of_returns_the_n_best_of_the_wider_search(setup) -> None:
    llm, model, prompts, _ = setup
    [out] = llm.generate(
        prompts[:1], SamplingParams(use_beam_search=True, n=2, best_of=4, temperature=0.0, max_tokens=MAX_NEW)
    )
    want = hf_beam_search(model, prompts[0], 4, MAX_NEW, llm.engine.eos_token_ids)
    assert [s.token_ids for s in out.outputs] == want[:2]
    assert out.outputs[0].text == llm.tokenizer.decode(want[0], skip_special_tokens=True)


def test_beams_share_their_prompt_blocks(tiny_llama: Path) -> None:
    llm = LLM(
        str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=32 * 2**20, enable_prefix_caching=False
    )
    prompt = list(range(3, 3 + 300))  # 19 blocks of 16

    def peak_blocks(params: SamplingParams) -> int:
        engine, peak = llm.engine, 0
        bm = engine.scheduler.block_manager
        engine.add_request("r", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
            peak = max(peak, bm.num_blocks - bm.num_free_blocks)
        return peak

    single = peak_blocks(SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))
    beams = peak_blocks(beam_params(4, ignore_eos=True))
    assert single == 20 and beams <= single + 4 * 2, (single, beams)  # 4 beams: a few tail blocks more
    assert_pool_empty(llm)


def test_preempted_beam_search_starts_over_and_finds_the_same_beams(setup, tiny_llama: Path) -> None:
    llm, _, prompts, _ = setup
    want = [[s.token_ids for s in out.outputs] for out in llm.generate(prompts, beam_params(4))]
    tight = LLM(str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=12 * 2 * 2 * 16 * 32 * 4)
    got = [[s.token_ids for s in out.outputs] for out in tight.generate(prompts, beam_params(4))]
    assert tight.engine.scheduler.num_preemptions > 0
    assert got == want
    assert_pool_empty(tight)


def test_beams_of_a_request_advance_together_under_a_small_token_budget(setup, tiny_llama: Path) -> None:
    llm, _, prompts, _ = setup
    want = [[s.token_ids for s in out.outputs] for out in llm.generate(prompts, beam_params(4))]
    small = LLM(
        str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=32 * 2**20, max_num_batched_tokens=6
    )
    got = [[s.token_ids for s in out.outputs] for out in small.generate(prompts, beam_params(4))]
    assert got == want


def test_samples_batched_beside_a_beam_search_read_their_own_logits(setup) -> None:
    """A beam search's first step and a request forking its n samples in the same step: the samples
    must still be drawn from their own prompt's logits row."""
    llm, _, prompts, _ = setup
    greedy = SamplingParams(n=2, temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    [alone] = llm.generate([prompts[1]], greedy)
    beside = llm.generate(prompts[:2], [beam_params(2), greedy])[1]
    assert [s.token_ids for s in beside.outputs] == [s.token_ids for s in alone.outputs]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": 0.7}, "temperature must be 0"),
        ({"stop": ["x"]}, "does not support stop"),
        ({"n": 1}, "at least 2 beams"),
        ({"n": 3, "best_of": 2}, "must be >= n"),
    ],
)
def test_unsupported_beam_options_are_refused(options: dict, message: str) -> None:
    base = {"use_beam_search": True, "n": 2, "temperature": 0.0} | options
    with pytest.raises(ValueError, match=message):
        SamplingParams(**base)


def test_a_beam_search_wider_than_a_step_is_refused_at_once(tiny_llama: Path) -> None:
    """Its beams advance together, a token each: wider than a step's token budget, it would wait forever."""
    knobs = {"max_num_batched_tokens": 6, "max_num_seqs": 8}
    small = LLM(str(tiny_llama), device="cpu", kv_cache_bytes=4 << 20, **knobs)
    with pytest.raises(ValueError, match=r"8 beams .* at most 6 tokens \(max_num_batched_tokens\)"):
        small.engine.add_request("wide", PROMPTS[0], beam_params(8))
    with pytest.raises(ValueError, match=r"12 samples need a seat each; the engine has 8 \(max_num_seqs\)"):
        small.engine.add_request("many", PROMPTS[0], SamplingParams(n=12))
    assert not small.engine.has_unfinished_requests()
    assert small.generate(PROMPTS[0], beam_params(6))[0].outputs[0].token_ids  # as wide as a step: it runs
