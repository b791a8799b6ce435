"""Hugging Face transformers as the oracle: greedy tokens and their log-probabilities."""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from worker.engine import LLM, CompletionOutput


class HFReference:
    def __init__(self, path: Path, dtype: torch.dtype = torch.float32) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()

    @torch.inference_mode()
    def greedy(
        self, prompt_ids: list[int], max_new_tokens: int, stop_at_eos: bool
    ) -> tuple[list[int], list[float]]:
        """Greedy continuation, one request at a time (no padding), and each chosen token's logprob."""
        config = self.model.generation_config
        out = self.model.generate(
            torch.tensor([prompt_ids]),
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
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "KV blocks leaked"
    assert all(b.ref_count == 0 for b in bm.blocks)
