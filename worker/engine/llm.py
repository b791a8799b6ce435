"""The offline entry point: ``LLM(...).generate(prompts)`` and ``.chat(conversations)``, or, for a model
served with ``kind="embed"``, ``LLM(model, kind="embed").embed(texts)``."""

import itertools
import time
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from contract.engine import (
    DEFAULT_EMBED_MODEL,
    EMBED_MAX_NUM_BATCHED_TOKENS,
    EngineConfig,
    default_quantization,
)
from contract.heap import heap_frozen
from contract.pooling import EmbeddingParams
from contract.sampling import SamplingParams
from contract.sampling_defaults import generation_defaults, with_model_defaults
from worker.engine.default_model import DEFAULT_MODEL
from worker.engine.embedding_engine import EmbeddingEngine
from worker.engine.llm_engine import LLMEngine
from worker.engine.outputs import EmbeddingOutput, RequestOutput

Prompt = str | list[int]
Message = dict[str, str]
KINDS = ("generate", "embed")


class LLM:
    """Generate for a whole list of prompts at once, continuously batched.

    Takes every ``EngineConfig`` field as a keyword, e.g.
    ``LLM("/models/Llama-3.1-8B-Instruct", dtype="bfloat16")``. A ``.gguf`` file serves its weights in their
    GGUF types (``quantization="gguf"``, its default): ``LLM("/models/model.Q4_K_M.gguf")``.
    ``kind="embed"`` serves the model for embeddings instead (default: the built-in all-MiniLM-L6-v2):
    ``LLM(kind="embed").embed(texts)``.
    """

    def __init__(self, model: str | None = None, kind: str = "generate", **engine_args: object) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.engine: LLMEngine | EmbeddingEngine
        if kind == "embed":
            engine_args.setdefault("max_num_batched_tokens", EMBED_MAX_NUM_BATCHED_TOKENS)
            self.engine = EmbeddingEngine(EngineConfig(model=model or DEFAULT_EMBED_MODEL, **engine_args))  # type: ignore[arg-type]
            self.sampling_defaults: dict[str, Any] = {}
        else:
            model = model or DEFAULT_MODEL
            engine_args.setdefault("quantization", default_quantization(model))
            self.engine = LLMEngine(EngineConfig(model=model, **engine_args))  # type: ignore[arg-type]
            self.sampling_defaults = generation_defaults(self.engine.model_path)
        self.tokenizer = self.engine.tokenizer
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
        engine = self._engine(LLMEngine)
        prompts = _as_prompt_list(prompts)
        params = _per_prompt(sampling_params or self.sampling_params(), len(prompts))
        request_ids = [str(next(self._ids)) for _ in prompts]
        for i, (request_id, prompt) in enumerate(zip(request_ids, prompts, strict=True)):
            engine.add_request(request_id, prompt, params[i], priority[i] if priority else 0)
        with heap_frozen():  # else a full collection of torch's heap stalls a step every few dozen
            results = self._run(engine, len(prompts), use_tqdm)
        return [results[request_id] for request_id in request_ids]

    def embed(
        self, inputs: Prompt | Sequence[Prompt], params: EmbeddingParams | None = None, use_tqdm: bool = False
    ) -> list[EmbeddingOutput]:
        """One vector per input (a text, or token ids embedded as they are), in the order of ``inputs``,
        each with the number of tokens it embedded. Texts are tokenized together, in parallel."""
        engine = self._engine(EmbeddingEngine)
        inputs = _as_prompt_list(inputs)
        if not inputs:
            raise ValueError("no inputs to embed")
        request_ids = self._add_inputs(engine, inputs, params)
        results: dict[str, EmbeddingOutput] = {}
        with heap_frozen(), tqdm(total=len(inputs), desc="inputs", unit="in", disable=not use_tqdm) as bar:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    results[output.request_id] = output
                    bar.update(1)
        return [results[request_id] for request_id in request_ids]

    def _add_inputs(
        self, engine: EmbeddingEngine, inputs: list[Prompt], params: EmbeddingParams | None
    ) -> list[str]:
        """Queues every input, or none: one refused input leaves nothing behind."""
        texts = [i for i, prompt in enumerate(inputs) if isinstance(prompt, str)]
        encoded = (
            dict(zip(texts, engine.encode([inputs[i] for i in texts], params), strict=True)) if texts else {}
        )  # type: ignore[misc]
        token_ids = [encoded.get(i, prompt) for i, prompt in enumerate(inputs)]
        request_ids = [str(next(self._ids)) for _ in inputs]
        # Longest first: a step then holds inputs of near-equal lengths, which share attention calls. An
        # input's vector does not depend on its batch, so the order changes nothing but the speed.
        order = sorted(range(len(inputs)), key=lambda i: len(token_ids[i]), reverse=True)
        try:
            for i in order:
                engine.add_request(request_ids[i], token_ids[i], params)  # type: ignore[arg-type]
        except ValueError:
            for request_id in request_ids:
                engine.abort(request_id)
            engine.step()  # hands out the aborted ones
            raise
        return request_ids

    def _engine(self, wanted: type) -> "LLMEngine | EmbeddingEngine":
        if not isinstance(self.engine, wanted):
            does = "embed" if wanted is EmbeddingEngine else "generate or chat"
            raise ValueError(
                f"this LLM serves {self.engine.config.model!r} with kind={self.kind!r}: it does not {does}"
            )
        return self.engine

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

    def _run(self, engine: LLMEngine, total: int, use_tqdm: bool) -> dict[str, RequestOutput]:
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=total, desc="requests", unit="req", disable=not use_tqdm, dynamic_ncols=True)
        start, tokens = time.monotonic(), 0
        while engine.has_unfinished_requests():
            for delta in engine.step():
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
