"""A job's prompt as the token ids the engine will run, and the check that it fits the context."""

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from api.piece_encoding import PieceEncoder
from contract import context
from core.spec import ChatMessage, JobSpec


class PromptError(ValueError):
    """A prompt this model cannot take; ``field`` names the part of the request body at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ContextExceeded(PromptError):
    """The prompt and its max_tokens do not fit the model's context."""


ENCODE_CHUNK = 2048  # texts per batch encode: the lock is released between chunks


class PromptEncoder:
    """Tokenizes once, at submission: the worker runs the stored ids and never sees the text again."""

    def __init__(self, model_dir: Path, max_model_len: int | None) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        config = AutoConfig.from_pretrained(model_dir).to_dict()
        self.context_length = context.max_model_len(config, max_model_len)  # prompt + output, as the engine
        fast = self.tokenizer.is_fast
        self._chats = PieceEncoder(self.tokenizer.backend_tokenizer) if fast else None
        # A fast tokenizer's Rust state must not be borrowed by two threads at once.
        self._lock = threading.Lock()

    def encode(self, spec: JobSpec) -> list[int]:
        token_ids = self._chat(spec.messages) if spec.messages is not None else self._text(spec.prompt or "")
        result = self._checked(spec, token_ids)
        if isinstance(result, PromptError):
            raise result
        return result

    def encode_many(self, specs: list[JobSpec]) -> list[list[int] | PromptError]:
        """``encode`` for many specs at once, each answered by its ids or its error, a chunk at a time:
        this thread renders a chunk's chat templates while another has the previous chunk tokenized
        (the Rust tokenizer runs without the GIL)."""
        chunks = [specs[start : start + ENCODE_CHUNK] for start in range(0, len(specs), ENCODE_CHUNK)]
        with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as tokenizing:
            done = [
                tokenizing.submit(self._encode_chunk, chunk, self._render_many(chunk)) for chunk in chunks
            ]
            return [result for chunk in done for result in chunk.result()]

    def _render_many(self, specs: list[JobSpec]) -> list[str | PromptError]:
        """Prompts as they are; chats through the template in one call (one by one if it rejects any)."""
        chats = [[message.model_dump() for message in spec.messages] for spec in specs if spec.messages]
        try:
            rendered = iter(
                self.tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
                if chats
                else []
            )
        except Exception:  # find which chat the template rejects, and why
            return [self._render(spec) for spec in specs]
        return [next(rendered) if spec.messages else spec.prompt or "" for spec in specs]

    def _render(self, spec: JobSpec) -> str | PromptError:
        if spec.messages is None:
            return spec.prompt or ""
        try:
            return self._template([message.model_dump() for message in spec.messages])
        except PromptError as error:
            return error

    def _encode_chunk(
        self, specs: list[JobSpec], texts: list[str | PromptError]
    ) -> list[list[int] | PromptError]:
        results: list[list[int] | PromptError] = [t if isinstance(t, PromptError) else [] for t in texts]
        # A raw prompt gets the tokenizer's special tokens (BOS); a rendered chat has its own.
        for is_chat in (False, True):
            todo = [
                i
                for i, t in enumerate(texts)
                if isinstance(t, str) and (specs[i].messages is not None) == is_chat
            ]
            encoded = self._encode_texts([str(texts[i]) for i in todo], add_special_tokens=not is_chat)
            for i, token_ids in zip(todo, encoded, strict=True):
                results[i] = self._checked(specs[i], token_ids)
        return results

    def _encode_texts(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        """Straight through the Rust tokenizer where there is one: its Python wrapper costs more than
        the encoding of a short prompt. A rendered chat has its special tokens: those go by pieces."""
        with self._lock:
            if self._chats is None:  # a slow (Python) tokenizer
                return [self.tokenizer.encode(text, add_special_tokens=add_special_tokens) for text in texts]
            if not add_special_tokens:
                return self._chats.encode(texts)
            encodings = self.tokenizer.backend_tokenizer.encode_batch_fast(
                texts, add_special_tokens=add_special_tokens
            )
        return [encoding.ids for encoding in encodings]

    def _checked(self, spec: JobSpec, token_ids: list[int]) -> list[int] | PromptError:
        """The ids, or why they cannot run: no tokens, or more than the context with max_tokens."""
        field = "messages" if spec.messages is not None else "prompt"
        if not token_ids:
            return PromptError(field, "the prompt encodes to no tokens")
        if problem := context.context_problem(len(token_ids), spec.max_tokens, self.context_length):
            return ContextExceeded(field, problem)
        return token_ids

    def _text(self, prompt: str) -> list[int]:
        return self._encode_texts([prompt], add_special_tokens=True)[0]

    def _chat(self, messages: list[ChatMessage]) -> list[int]:
        text = self._template([message.model_dump() for message in messages])
        return self._encode_texts([text], add_special_tokens=False)[0]

    def _template(self, chat: list[dict[str, str]]) -> str:
        """The chat as text (jinja alone: no tokenizer state, so no lock)."""
        try:
            return self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        except Exception as error:  # no template, or the template rejects the chat (jinja raise)
            message = f"the model's chat template rejects these messages: {error}"
            raise PromptError("messages", message) from error
