"""An embedding model's inputs as the token ids its worker embeds: tokenized once, at submission, with the
model's own tokenizer, and cut to what is embedded as sentence-transformers cuts them (special tokens
included, to ``max_seq_length`` or a request's ``truncate_prompt_tokens``); token ids are checked against
the vocabulary. So the job's ``usage.prompt_tokens`` is known when it is accepted, and what could never be
embedded is refused then, never a failed job later. One encoder per embedding model, made on its first
request and kept (``api/served_models.py``).
"""

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from transformers import AutoTokenizer

from contract.pooling import EmbeddingParams, token_limit
from contract.pooling_files import model_pooling
from contract.sampling import ContractError

T = TypeVar("T")
Inputs = list[str] | list[list[int]]


class EmbeddingInputError(ValueError):
    """Inputs or parameters this model cannot embed; ``param`` names the request's field at fault."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class EmbeddingEncoder:
    def __init__(self, model_dir: Path) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.pooling = model_pooling(model_dir)
        self.vocab_size: int = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        self._lock = threading.Lock()  # a fast tokenizer's Rust state must not be borrowed by two threads
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="embed-tokenize")

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the encoder's thread, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, function, *args)

    def close(self) -> None:
        self._thread.shutdown(cancel_futures=True)

    def encode(self, inputs: Inputs, params: EmbeddingParams) -> list[list[int]]:
        """Each input's ids as embedded: texts tokenized with special tokens, ids as they are; both cut to
        the limit. Raises ``EmbeddingInputError``."""
        try:
            params.check(self.pooling)
        except ContractError as error:
            problem = error.problems[0]
            raise EmbeddingInputError(problem.field, problem.message) from None
        limit = token_limit(params, self.pooling)
        if isinstance(inputs[0], str):
            return self._tokenize([str(text) for text in inputs], limit)
        for i, token_ids in enumerate(inputs):
            if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in token_ids):
                message = f"input {i}: token ids must be integers in [0, {self.vocab_size}) (the vocabulary)"
                raise EmbeddingInputError("input", message)
        return [list(token_ids)[:limit] for token_ids in inputs]  # type: ignore[arg-type]

    def _tokenize(self, texts: list[str], limit: int) -> list[list[int]]:
        """As ``EmbeddingEngine.encode``: sentence-transformers' tokenization, truncated to ``limit``."""
        with self._lock:
            if limit <= self.tokenizer.num_special_tokens_to_add():  # too short to truncate by the tokenizer
                return [ids[:limit] for ids in self.tokenizer(texts)["input_ids"]]
            return self.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
