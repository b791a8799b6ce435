"""Hugging Face transformers as the oracle: greedy tokens and their log-probabilities."""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from worker.engine import LLM, CompletionOutput


class HFReference:
    def __init__(self, path: Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()

    @torch.inference_mode()
    def greedy(
        self, prompt_ids: list[int], max_new_tokens: int, stop_at_eos: bool
    ) -> tuple[list[int], list[float]]:
        """Greedy continuation, one request at a time (no padding), and each chosen token's logprob."""
        config = self.model.generation_config
        out = self.model.generate(
            torch.tensor([prompt_ids], device=self.model.device),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=config.eos_token_id if stop_at_eos else None,
            pad_token_id=config.pad_token_id if config.pad_token_id is not None else 0,
            output_logits=True,
            return_dict_in_generate=True,
            temperature=None,
            top_p=None,
            top_k=None,
        )
        tokens = out.sequences[0, len(prompt_ids) :].tolist()
        logprobs = [
            torch.log_softmax(step[0].float(), -1)[t].item()
            for step, t in zip(out.logits, tokens, strict=True)
        ]
        return tokens, logprobs


def chosen_logprobs(sample: CompletionOutput) -> list[float]:
    return [lp[t] for lp, t in zip(sample.logprobs, sample.token_ids, strict=True)]


def assert_pool_empty(llm: LLM) -> None:
    bm = llm.engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "KV blocks leaked"
    assert all(b.ref_count == 0 for b in bm.blocks)


@torch.inference_mode()
def hf_beam_search(
    model: AutoModelForCausalLM,
    prompt_ids: list[int],
    num_beams: int,
    max_new_tokens: int,
    eos_token_ids: list[int],
    **options: object,
) -> list[list[int]]:
    """transformers' beam search: the ``num_beams`` best hypotheses, best first, each cut after its EOS."""
    config = model.generation_config
    out = model.generate(
        torch.tensor([prompt_ids]),
        do_sample=False,
        num_beams=num_beams,
        num_return_sequences=num_beams,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_ids,
        pad_token_id=config.pad_token_id if config.pad_token_id is not None else 0,
        temperature=None,
        top_p=None,
        top_k=None,
        **options,
    )
    hypotheses = []
    for row in out[:, len(prompt_ids) :].tolist():
        ends = [i for i, t in enumerate(row) if t in eos_token_ids]
        hypotheses.append(row[: ends[0] + 1] if ends else row)
    return hypotheses
