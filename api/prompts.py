"""A job's prompt as the token ids the engine will run, and the check that it fits the context."""

import math
import threading
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from core.spec import ChatMessage, JobSpec


class PromptError(ValueError):
    """A prompt this model cannot take; ``field`` names the part of the request body at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def context_length(model_dir: Path, max_model_len: int | None) -> int:
    """The tokens a job may span (prompt + output), the way the engine computes it."""
    config = AutoConfig.from_pretrained(model_dir)
    limit = getattr(config, "max_position_embeddings", None) or math.inf
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        limit = min(limit, window)  # the engine's attention is full: it stays where full equals windowed
    limit = min(limit, max_model_len or math.inf)
    if limit == math.inf:
        raise ValueError(f"{model_dir}: config.json has no max_position_embeddings; set PAGEDQ_MAX_MODEL_LEN")
    return int(limit)


class PromptEncoder:
    """Tokenizes once, at submission: the worker runs the stored ids and never sees the text again."""

    def __init__(self, model_dir: Path, max_model_len: int | None) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.context_length = context_length(model_dir, max_model_len)
        # A fast tokenizer's Rust state must not be borrowed by two threads at once.
        self._lock = threading.Lock()

    def encode(self, spec: JobSpec) -> list[int]:
        if spec.messages is not None:
            field, token_ids = "messages", self._chat(spec.messages)
        else:
            field, token_ids = "prompt", self._text(spec.prompt or "")
        if not token_ids:
            raise PromptError(field, "the prompt encodes to no tokens")
        self._check_fits(field, len(token_ids), spec.max_tokens)
        return token_ids

    def _text(self, prompt: str) -> list[int]:
        with self._lock:
            return self.tokenizer.encode(prompt)

    def _chat(self, messages: list[ChatMessage]) -> list[int]:
        chat = [message.model_dump() for message in messages]
        with self._lock:
            try:
                text = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            except Exception as error:  # no template, or the template rejects the chat (jinja raise)
                message = f"the model's chat template rejects these messages: {error}"
                raise PromptError("messages", message) from error
            return self.tokenizer.encode(text, add_special_tokens=False)

    def _check_fits(self, field: str, prompt_tokens: int, max_tokens: int) -> None:
        total = prompt_tokens + max_tokens
        if total > self.context_length:
            raise PromptError(
                field,
                f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} tokens "
                f"exceeds the model's context of {self.context_length} tokens",
            )
