"""The batched sampler: greedy, filters, penalties, min_tokens, seeding, frequencies and logprobs."""

import bisect
import itertools
import math
from collections import Counter

import pytest
import torch

from contract.sampling import SamplingParams
from worker.engine.draws import uniform
from worker.engine.sampler import Sampler, SamplingRow, apply_min_tokens, apply_penalties

pytestmark = pytest.mark.fast

sampler = Sampler()
_seeds = itertools.count(10_000)


def make_row(
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    eos: list[int] | None = None,
    **params: object,
) -> SamplingRow:
    p = SamplingParams(**params)  # type: ignore[arg-type]
    seed = next(_seeds) if p.seed is None else p.seed  # as the engine does: a seed for every row
    return SamplingRow(p, seed, prompt or [], output or [], eos or [])


def support(
    logits: list[float], n: int = 1500, extra: list[SamplingRow] | None = None, **params: object
) -> set[int]:
    """Tokens drawn over ``n`` identical rows (plus ``extra`` rows appended to the batch)."""
    torch.manual_seed(0)
    rows = [make_row(**params) for _ in range(n)] + (extra or [])
    x = torch.tensor(logits).expand(len(rows), -1).contiguous()
    return set(sampler(x, rows).token_ids[:n])


def test_greedy_equals_argmax_in_a_mixed_batch() -> None:
    torch.manual_seed(0)
    x = torch.randn(12, 50)
    rows = [make_row(temperature=0.0) if i % 3 else make_row(temperature=1.0, top_p=0.9) for i in range(12)]
    out = sampler(x, rows)
    expected = x.argmax(-1).tolist()
    assert [out.token_ids[i] for i in range(12) if i % 3] == [expected[i] for i in range(12) if i % 3]
    half = x.bfloat16()
    assert sampler(half, [make_row(temperature=0.0)] * 12).token_ids == half.argmax(-1).tolist()


@pytest.mark.parametrize("sort_path", [False, True])
def test_top_k_keeps_only_the_k_best(sort_path: bool) -> None:
    logits = torch.linspace(1.0, 0.0, 10).tolist()  # nearly flat: without top_k every token shows up
    extra = [make_row(top_p=0.9)] if sort_path else None  # a top_p row forces the sort-based path
    assert support(logits, top_k=2, extra=extra) == {0, 1}
    assert support(logits, top_k=0, extra=extra) == set(range(10))


@pytest.mark.parametrize(
    ("top_p", "top_k", "nucleus"),
    [
        (0.45, 0, {0}),
        (0.7, 0, {0, 1}),
        (0.9, 0, {0, 1, 2}),
        (1.0, 0, {0, 1, 2, 3}),
        (0.6, 2, {0}),  # top_p applies to the top_k-renormalised distribution: 0.5 / 0.8 >= 0.6
    ],
)
def test_top_p_keeps_the_smallest_nucleus(top_p: float, top_k: int, nucleus: set[int]) -> None:
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().tolist()
    assert support(logits, top_p=top_p, top_k=top_k) == nucleus


@pytest.mark.parametrize(
    ("min_p", "kept"), [(0.0, {0, 1, 2, 3}), (0.3, {0, 1, 2}), (0.6, {0, 1}), (1.0, {0})]
)
def test_min_p_drops_tokens_below_min_p_times_p_max(min_p: float, kept: set[int]) -> None:
    logits = torch.tensor([0.4, 0.3, 0.2, 0.1]).log().tolist()
    assert support(logits, min_p=min_p, temperature=1.0) == kept


def reference_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    out = logits.clone()
    for i, r in enumerate(rows):
        p = r.params
        for t in set(r.prompt_token_ids + r.output_token_ids):
            v = out[i, t].item()
            out[i, t] = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
        for t, c in Counter(r.output_token_ids).items():
            out[i, t] -= p.presence_penalty + p.frequency_penalty * c
    return out


def test_penalties_match_a_per_row_reference() -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 30) * 3
    rows = [
        make_row([1, 2, 3], [3, 4, 4], repetition_penalty=1.3),
        make_row([5], [6, 6, 6, 7], presence_penalty=0.5, frequency_penalty=0.3),
        make_row([8, 9], [9, 10, 10], repetition_penalty=1.5, presence_penalty=-0.4, frequency_penalty=1.2),
        make_row([1, 2], [2, 3]),  # no penalties: untouched
        make_row([11, 12], [], repetition_penalty=0.8),
        make_row([], [13], frequency_penalty=2.0),
    ]
    got = x.clone()
    apply_penalties(got, rows)
    expected = reference_penalties(x, rows)
    assert not torch.equal(expected, x)
    torch.testing.assert_close(got, expected)
    # ...and the sampler uses them, without editing the caller's logits
    x = torch.tensor([[5.0, 4.0, 1.0]])
    before = x.clone()
    assert sampler(x, [make_row([], [0], temperature=0.0, repetition_penalty=2.0)]).token_ids == [1]
    assert torch.equal(x, before)


def test_min_tokens_blocks_eos_and_stop_ids() -> None:
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]).expand(6, -1).contiguous()  # 5 > 4 > 3 > ...
    rows = [
        make_row(output=[], eos=[5], temperature=0.0, min_tokens=2),  # EOS blocked
        make_row(output=[1, 1], eos=[5], temperature=0.0, min_tokens=2),  # reached min_tokens
        make_row(output=[1], eos=[5, 4], temperature=0.0, min_tokens=2),  # several EOS ids
        make_row(output=[1], eos=[5], temperature=0.0, min_tokens=2, stop_token_ids=[4]),
        make_row(output=[1], eos=[5], temperature=0.0, min_tokens=2, ignore_eos=True),  # EOS allowed
        make_row(output=[1], eos=[3], temperature=0.0, min_tokens=2, ignore_eos=True, stop_token_ids=[5]),
    ]
    assert sampler(x, rows).token_ids == [4, 5, 3, 3, 5, 4]
    masked = x.clone()
    apply_min_tokens(masked, rows)
    assert masked[3].tolist() == [0.0, 1.0, 2.0, 3.0, float("-inf"), float("-inf")]


def seeded_tokens(seed: int, position: int, others: list[SamplingRow], logits: torch.Tensor) -> list[int]:
    """Ten steps of one seeded row at ``position`` among ``others`` (whose logits are random)."""
    torch.manual_seed(position)
    tokens: list[int] = []
    for _ in range(10):
        target = make_row([5, 6], list(tokens), seed=seed, temperature=0.9, top_p=0.95)
        rows = [*others[:position], target, *others[position:]]
        x = torch.randn(len(rows), logits.shape[0]) * 2
        x[position] = logits
        tokens.append(sampler(x, rows).token_ids[position])
    return tokens


def test_seeded_row_is_independent_of_batch_and_position() -> None:
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(7))
    others = [
        make_row(),
        make_row(temperature=0.0),
        make_row(seed=99, top_k=5),
        make_row(min_p=0.1),
        make_row(temperature=1.3, frequency_penalty=0.5, output=[1, 2]),
    ]
    alone = seeded_tokens(1234, 0, [], logits)
    assert seeded_tokens(1234, 3, others, logits) == alone
    assert seeded_tokens(1234, 0, others[:2], logits) == alone
    assert seeded_tokens(4321, 0, [], logits) != alone
    assert len(set(alone)) > 1  # the draws move with the position


def test_draws_depend_only_on_seed_choice_and_position() -> None:
    draws = {(s, c, p): uniform(s, c, p) for s in (0, 1, 2**63 - 1) for c in (0, 1, 15) for p in (0, 1, 4096)}
    assert all(0.0 <= u < 1.0 for u in draws.values())
    assert len(set(draws.values())) == len(draws)  # every coordinate moves the draw
    assert all(uniform(*key) == u for key, u in draws.items())  # and nothing else does
    # pinned: a replay on a later version must draw what the first run drew
    assert (uniform(7, 0, 3), uniform(7, 1, 3)) == (0.4059499273594408, 0.6922777923197253)


def test_a_row_samples_from_its_draw_by_inverse_cdf() -> None:
    """Probabilities 0.5, 0.3, 0.2: a draw below 0.5 picks token 0, then 1 up to 0.8, then 2; the choice and
    the position pick the draw."""
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    for choice in range(3):
        for position in range(3, 40):
            row = make_row([1, 2, 3], [4] * (position - 3), seed=11, temperature=1.0)
            row.choice = choice
            u = uniform(11, choice, position)
            if min(abs(u - 0.5), abs(u - 0.8)) > 1e-6:  # not a rounding away from the other token
                assert sampler(logits.unsqueeze(0), [row]).token_ids == [bisect.bisect([0.5, 0.8], u)]


@pytest.mark.parametrize("seeded", [False, True])
def test_frequencies_match_the_tempered_softmax(seeded: bool) -> None:
    torch.manual_seed(0)
    logits, temperature, n = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0]), 0.8, 6000
    rows = [make_row(temperature=temperature, seed=i if seeded else None) for i in range(n)]
    tokens = sampler(logits.expand(n, -1).contiguous(), rows).token_ids
    counts = torch.bincount(torch.tensor(tokens), minlength=6)
    expected = (logits / temperature).softmax(-1) * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 25.0  # 5 degrees of freedom: p ~ 1e-4; temperature 1 instead of 0.8 gives chi2 > 100


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_come_from_the_raw_distribution(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 40) * 2
    x[4, 7] = 20.0  # still the greedy pick once penalised, so its raw logprob differs from the penalised one
    x = x.to(dtype)
    rows = [
        make_row([1], [2, 2], temperature=0.5, repetition_penalty=1.5, presence_penalty=1.0, logprobs=3),
        make_row(temperature=0.0, logprobs=0),
        make_row(temperature=2.0),
        make_row(temperature=1.5, top_k=30, logprobs=20),
        make_row([7], [7], temperature=0.0, repetition_penalty=1.5, frequency_penalty=1.0, logprobs=1),
    ]
    out = sampler(x, rows)
    raw = torch.log_softmax(x.float(), -1)
    for i, tok in enumerate(out.token_ids):
        if i == 2:  # this row did not ask for logprobs: none are computed
            assert out.logprobs[i] is None
        else:
            assert math.isclose(out.logprobs[i], raw[i, tok].item(), abs_tol=1e-5)
    assert out.top_logprobs[2] is None
    assert out.top_logprobs[1] == {out.token_ids[1]: pytest.approx(out.logprobs[1])}
    assert out.token_ids[4] == 7
    for i, k in ((0, 3), (3, 20), (4, 1)):
        top = out.top_logprobs[i]
        assert top is not None
        best = raw[i].topk(k).indices.tolist()
        assert set(top) == {*best, out.token_ids[i]}
        for tok, lp in top.items():
            assert math.isclose(lp, raw[i, tok].item(), abs_tol=1e-5)
