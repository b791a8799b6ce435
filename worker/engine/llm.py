"""The offline entry point: ``LLM(...).generate(prompts)`` and ``.chat(conversations)``."""

import itertools
import time
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from contract.engine import EngineConfig
from contract.sampling import SamplingParams
from contract.sampling_defaults import generation_defaults, with_model_defaults
from worker.engine.default_model import DEFAULT_MODEL, resolve_model
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import RequestOutput

Prompt = str | list[int]
Message = dict[str, str]


class LLM:
    """Generate for a whole list of prompts at once, continuously batched.

    Takes every ``EngineConfig`` field as a keyword, e.g.
    ``LLM("/models/Llama-3.1-8B-Instruct", dtype="bfloat16")``.
    """

    def __init__(self, model: str = DEFAULT_MODEL, **engine_args: object) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))  # type: ignore[arg-type]
        self.tokenizer = self.engine.tokenizer
        self.sampling_defaults = generation_defaults(resolve_model(model))
        self._ids = itertools.count()

    def sampling_params(self, **given: Any) -> SamplingParams:
        """``SamplingParams(**given)``, the model's sampling defaults (its generation_config.json) taking
        the place of the contract's for what ``given`` leaves out: what ``generate`` and ``chat`` run
        with when given no ``SamplingParams``."""
        return SamplingParams(**with_model_defaults(given, set(given), self.sampling_defaults))

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in the order of ``prompts``; without ``sampling_params``, ``self.sampling_params()``."""
        prompts = _as_prompt_list(prompts)
        params = _per_prompt(sampling_params or self.sampling_params(), len(prompts))
        request_ids = [str(next(self._ids)) for _ in prompts]
        for i, (request_id, prompt) in enumerate(zip(request_ids, prompts, strict=True)):
            self.engine.add_request(request_id, prompt, params[i], priority[i] if priority else 0)
        results = self._run(len(prompts), use_tqdm)
        return [results[request_id] for request_id in request_ids]

    def chat(
        self,
        conversations: list[Message] | Sequence[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Applies the model's chat template (with the assistant turn opened) to each conversation."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]  # type: ignore[list-item]
        prompts = [self.chat_prompt(messages) for messages in conversations]  # type: ignore[arg-type]
        return self.generate(prompts, sampling_params, use_tqdm)

    def chat_prompt(self, messages: list[Message]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _run(self, total: int, use_tqdm: bool) -> dict[str, RequestOutput]:
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=total, desc="requests", unit="req", disable=not use_tqdm, dynamic_ncols=True)
        start, tokens = time.monotonic(), 0
        while self.engine.has_unfinished_requests():
            for delta in self.engine.step():
                tokens += sum(len(o.token_ids) for o in delta.outputs)
                if delta.request_id in results:
                    results[delta.request_id].extend(delta)
                else:
                    results[delta.request_id] = delta
                if delta.finished:
                    bar.update(1)
            bar.set_postfix_str(f"{tokens / max(time.monotonic() - start, 1e-9):.1f} tok/s", refresh=False)
        bar.close()
        return results


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if prompts and isinstance(prompts[0], int):
        return [list(prompts)]  # type: ignore[arg-type]
    return list(prompts)  # type: ignore[arg-type]


def _per_prompt(params: SamplingParams | Sequence[SamplingParams], count: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * count
    if len(params) != count:
        raise ValueError(f"got {len(params)} SamplingParams for {count} prompts")
    return list(params)
