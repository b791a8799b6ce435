"""The batched sampler: one call per engine step turns the last-position logits into next tokens.

Every stage works on the whole batch at once with per-row parameter tensors, and a stage no row needs is
skipped. The only host synchronisation is the final ``.tolist()`` that brings back tokens and logprobs.
Every stage is row by row, so a row's token depends on its own logits, parameters and draw only: a
sampled row draws by inverse CDF from ``draws.uniform(seed, choice, position)``, not from a shared stream.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import torch

from contract.sampling import SamplingParams
from worker.engine.draws import uniform
from worker.engine.outputs import TokenLogprobs

_MIN_TEMPERATURE = 1e-5  # keeps logits / temperature finite for tiny non-zero temperatures


@dataclass
class SamplingRow:
    """One row of the logits: the sequence to sample a token for."""

    params: SamplingParams
    seed: int  # the request's (params.seed, or the one the engine chose)
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_ids: list[int]
    choice: int = 0  # which of the request's n samples

    @property
    def draw(self) -> float:
        """This row's uniform draw: a function of the seed, the choice and the position sampled."""
        return uniform(self.seed, self.choice, len(self.prompt_token_ids) + len(self.output_token_ids))


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[float | None]  # of each sampled token under the raw distribution; None unless asked for
    top_logprobs: list[TokenLogprobs | None]  # sampled token plus the top params.logprobs tokens, or None


def _to_device(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a device tensor, copied without making the host wait for the GPU."""
    t = torch.tensor(data, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def _flat_index(lists: Sequence[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token) index pairs for ragged per-row token lists, so no padding is needed."""
    rows = list(chain.from_iterable([i] * len(t) for i, t in enumerate(lists)))
    pairs = _to_device([rows, list(chain.from_iterable(lists))], torch.long, device)
    return pairs[0], pairs[1]


def apply_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """Structured outputs: in place on float32 ``logits``, -inf for each token a constrained row's grammar
    refuses. ``bitmask[j]`` (int32 words, bit ``t % 32`` of word ``t // 32`` set = token t allowed) is the
    grammar's for row ``rows[j]``; tokens past the bitmask's end are refused."""
    dev, vocab = logits.device, logits.shape[1]
    words = bitmask.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else bitmask
    bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32, device=dev)) & 1
    allowed = bits.flatten(1)[:, :vocab].bool()
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    if len(rows) == logits.shape[0]:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        idx = _to_device(rows, torch.long, dev)
        logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """Repetition (HF), presence and frequency (OpenAI) penalties, in place on float32 ``logits``."""
    idx = [i for i, r in enumerate(rows) if r.params.needs_penalties]
    if not idx:
        return
    dev = logits.device
    sub_rows = [rows[i] for i in idx]
    whole = len(idx) == len(rows)
    idx_t = _to_device(idx, torch.long, dev)
    x = logits if whole else logits[idx_t]
    pen = _to_device(
        [
            [r.params.repetition_penalty, r.params.presence_penalty, r.params.frequency_penalty]
            for r in sub_rows
        ],
        torch.float32,
        dev,
    )
    if any(r.params.repetition_penalty != 1.0 for r in sub_rows):
        seen = torch.zeros_like(x, dtype=torch.bool)
        seen[_flat_index([r.prompt_token_ids + r.output_token_ids for r in sub_rows], dev)] = True
        rep = pen[:, :1]
        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    if any(r.params.presence_penalty != 0.0 or r.params.frequency_penalty != 0.0 for r in sub_rows):
        counts = torch.zeros(x.shape, device=dev)
        r_t, t_t = _flat_index([r.output_token_ids for r in sub_rows], dev)
        counts.view(-1).index_add_(0, r_t * x.shape[1] + t_t, torch.ones_like(t_t, dtype=counts.dtype))
        x = x - (pen[:, 1:2] * (counts > 0) + pen[:, 2:3] * counts)
    if whole:
        logits.copy_(x)
    else:
        logits[idx_t] = x


def apply_min_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """While a row is below min_tokens, forbid its stop token ids and (unless ignore_eos) its EOS ids."""
    vocab = logits.shape[1]
    banned: list[list[int]] = []
    for r in rows:
        ids: list[int] = []
        if len(r.output_token_ids) < r.params.min_tokens:
            ids = r.params.stop_token_ids + ([] if r.params.ignore_eos else r.eos_token_ids)
        banned.append([t for t in ids if 0 <= t < vocab])
    if any(banned):
        logits[_flat_index(banned, logits.device)] = float("-inf")


def _kth_mask(x: torch.Tensor, desc: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Mask of values below each row's k-th largest (``desc``: values sorted descending; k=0 keeps all)."""
    kth = desc.gather(1, (k.clamp(1, desc.shape[1]) - 1).unsqueeze(1))
    return (x < kth) & (k > 0).unsqueeze(1)


def _top_k_top_p(x: torch.Tensor, k: torch.Tensor, p: torch.Tensor, max_k: int, use_p: bool) -> torch.Tensor:
    """Keep each row's top_k tokens (ties at the k-th kept), then its smallest nucleus of mass >= top_p."""
    if not use_p:
        # top_k only: a partial top-k is much cheaper than sorting the whole vocabulary
        return x.masked_fill(_kth_mask(x, x.topk(max_k, dim=-1).values, k), float("-inf"))
    desc, order = x.sort(dim=-1, descending=True, stable=True)
    if max_k:
        desc = desc.masked_fill(_kth_mask(desc, desc, k), float("-inf"))
    probs = desc.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
    desc = desc.masked_fill(before >= p.unsqueeze(1), float("-inf"))
    return torch.empty_like(x).scatter_(1, order, desc)


def _sample(x: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Temperature, top_k, top_p, min_p, then one draw per row; ``x`` holds only sampled rows."""
    vocab = x.shape[1]
    params = [r.params for r in rows]
    cfg = _to_device(
        [
            [
                max(p.temperature, _MIN_TEMPERATURE),
                min(p.top_k, vocab),
                p.top_p if p.top_p < 1.0 else float("inf"),
                p.min_p,
            ]
            for p in params
        ],
        torch.float32,
        x.device,
    )
    x = x / cfg[:, :1]
    max_k = max(min(p.top_k, vocab) for p in params)
    use_p = any(p.top_p < 1.0 for p in params)
    if max_k or use_p:
        x = _top_k_top_p(x, cfg[:, 1].long(), cfg[:, 2], max_k, use_p)
    if any(p.min_p > 0.0 for p in params):
        # p < min_p * p_max  <=>  logit < max_logit + log(min_p); log(0) = -inf masks nothing
        x = x.masked_fill(x < x.amax(dim=-1, keepdim=True) + cfg[:, 3:].log(), float("-inf"))
    # Inverse CDF: the first token whose cumulative probability passes the row's draw times the row's
    # total (float64 sums, so the total's rounding cannot push the draw past the last token).
    cdf = x.softmax(dim=-1).double().cumsum(dim=-1)
    draws = _to_device([r.draw for r in rows], torch.float64, x.device).unsqueeze(1) * cdf[:, -1:]
    return torch.searchsorted(cdf, draws, right=True).squeeze(1).clamp_max_(vocab - 1)


class Sampler:
    """Samples one token per row of ``logits`` ``[B, V]``; reports raw-distribution logprobs for the
    rows whose params ask for them (``logprobs`` not None). ``constrained`` (row indices and their
    grammar bitmask, see ``apply_bitmask``) is applied first, before penalties and temperature."""

    def __call__(
        self,
        logits: torch.Tensor,
        rows: list[SamplingRow],
        constrained: tuple[list[int], torch.Tensor] | None = None,
    ) -> SamplerOutput:
        if len(rows) != logits.shape[0]:
            raise ValueError(f"{len(rows)} sampling rows for {logits.shape[0]} logit rows")
        if not rows:
            return SamplerOutput([], [], [])
        x = logits.float()
        if constrained or any(r.params.needs_penalties or r.params.min_tokens for r in rows):
            x = x.clone() if x is logits else x  # never edit the caller's logits
        if constrained:
            apply_bitmask(x, *constrained)
        if any(r.params.needs_penalties or r.params.min_tokens for r in rows):
            apply_penalties(x, rows)
            apply_min_tokens(x, rows)
        tokens = self._choose(x, rows)
        wanted = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        max_lp = min(max((rows[i].params.logprobs or 0 for i in wanted), default=0), logits.shape[1])
        parts = [tokens.double()]
        if wanted:
            parts += self._logprobs(logits, tokens, wanted, max_lp)
        # token ids are exact in float64, so one tensor (one transfer) carries every result
        return self._unpack(torch.cat(parts).tolist(), rows, wanted, max_lp)

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, tokens: torch.Tensor, wanted: list[int], max_lp: int
    ) -> list[torch.Tensor]:
        """Raw-distribution logprobs of the ``wanted`` rows' sampled tokens, then their top ``max_lp``.

        Only rows that asked for logprobs pay for the full-vocabulary logsumexp (a few ms a step on CPU).
        """
        if len(wanted) < logits.shape[0]:
            sel = _to_device(wanted, torch.long, logits.device)
            logits, tokens = logits[sel], tokens[sel]
        raw = logits.float()  # the untouched input: penalties and temperature do not change logprobs
        lse = raw.logsumexp(dim=-1, keepdim=True)
        parts = [(raw.gather(1, tokens.unsqueeze(1)) - lse).double().flatten()]
        if max_lp:
            top_v, top_i = raw.topk(max_lp, dim=-1)
            parts += [top_i.double().flatten(), (top_v - lse).double().flatten()]
        return parts

    @staticmethod
    def _choose(x: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
        if len(sampled) == len(rows):
            return _sample(x, rows)
        tokens = x.argmax(dim=-1)
        if sampled:
            idx = _to_device(sampled, torch.long, x.device)
            tokens[idx] = _sample(x[idx], [rows[i] for i in sampled])
        return tokens

    @staticmethod
    def _unpack(flat: list[float], rows: list[SamplingRow], wanted: list[int], max_lp: int) -> SamplerOutput:
        b, w = len(rows), len(wanted)
        token_ids = [int(t) for t in flat[:b]]
        chosen = flat[b : b + w]
        n = w * max_lp
        ids, vals = flat[b + w : b + w + n], flat[b + w + n : b + w + 2 * n]
        logprobs: list[float | None] = [None] * b
        top: list[TokenLogprobs | None] = [None] * b
        for j, i in enumerate(wanted):
            logprobs[i] = chosen[j]
            k, s = min(rows[i].params.logprobs or 0, max_lp), j * max_lp
            top[i] = {
                token_ids[i]: chosen[j],
                **dict(zip((int(t) for t in ids[s : s + k]), vals[s : s + k], strict=True)),
            }
        return SamplerOutput(token_ids, logprobs, top)
