"""A job's prompt as the token ids the engine will run, and the check that it fits the context."""

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from tokenizers import Tokenizer
from transformers import AutoConfig, AutoTokenizer

from api.prompts.piece_encoding import PieceEncoder, encode_ids
from contract import context
from contract.engine import EngineConfig
from contract.prefix import prefix_key
from contract.sampling_defaults import generation_defaults
from core.settings import Settings
from core.spec import JobSpec


def job_prefix_key(settings: Settings, token_ids: list[int]) -> int | None:
    """The key a job's prompt prefix is run together by (contract/prefix.py); None with prefix-aware
    order off (``PAGEDQ_PREFIX_AWARE_ORDER``)."""
    return prefix_key(token_ids, settings.block_size) if settings.prefix_aware_order else None


class PromptError(ValueError):
    """A prompt this model cannot take; ``field`` names the part of the request body at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ContextExceeded(PromptError):
    """The prompt and its max_tokens do not fit the model's context."""


T = TypeVar("T")
ENCODE_CHUNK = 2048  # texts per batch encode: the lock is released between chunks
# A prompt of at most this many characters is tokenized on the event loop: handing it to the encoder's
# thread and back costs ~100-150 µs of CPU, tokenizing a short prompt ~25 µs (a short chat's template ~200).
INLINE_CHARS = 2000
MESSAGE_CHARS = 100  # what a chat message counts for besides its content: the template renders each one
# Pre-tokenizers that drop characters (whitespace, delimiters): under them a token may stand for any length.
DROPPING = frozenset({"Whitespace", "WhitespaceSplit", "BertPreTokenizer", "CharDelimiterSplit"})


def max_chars_per_token(tokenizer: Tokenizer) -> int | None:
    """The most characters of (normalized) text one token can stand for, where that is bounded: a
    byte-pair model covers every character of its input with tokens from its vocabulary, each token at
    most as many characters long as its string (a byte-level token's string has one character per byte,
    and a character is at least a byte). Not so where the pre-tokenizer drops characters or unknown
    characters fuse into one token: None."""
    config = json.loads(tokenizer.to_str())
    model = config["model"]
    if model["type"] != "BPE" or (model.get("unk_token") and model.get("fuse_unk")):
        return None
    if _drops_characters(config.get("pre_tokenizer")):
        return None
    return max(map(len, tokenizer.get_vocab(with_added_tokens=True)))


def _drops_characters(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer["type"] == "Sequence":
        return any(_drops_characters(part) for part in pre_tokenizer["pretokenizers"])
    return pre_tokenizer["type"] in DROPPING or pre_tokenizer.get("behavior") == "Removed"


class PromptEncoder:
    """Tokenizes once, at submission: the worker runs the stored ids and never sees the text again.

    The API's event loop tokenizes only short prompts, when the tokenizer is free; it hands the rest of
    the work to ``run``, the encoder's own thread."""

    def __init__(self, model_dir: Path, engine: EngineConfig) -> None:
        self.engine = engine  # the worker's knobs: a request is checked as its engine will check it
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        config = AutoConfig.from_pretrained(model_dir).to_dict()
        self.context_length = context.max_model_len(config, engine.max_model_len)  # prompt + output
        self.sampling_defaults = generation_defaults(model_dir)
        fast = self.tokenizer.is_fast
        self._chats = PieceEncoder(self.tokenizer.backend_tokenizer) if fast else None
        per_token = max_chars_per_token(self.tokenizer.backend_tokenizer) if fast else None
        # No text longer than this (normalized) can fit the context, whatever its tokens.
        self.max_chars = per_token * self.context_length if per_token else None
        # A fast tokenizer's Rust state must not be borrowed by two threads at once.
        self._lock = threading.RLock()  # reentrant: ``encode_soon`` holds it around ``encode``
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="tokenize")

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in the encoder's thread: tokenizing, or waiting for the lock, blocks
        neither the event loop nor the threads that serve other requests."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, function, *args)

    async def encode_soon(self, spec: JobSpec) -> list[int]:
        """``encode(spec)``, here when the prompt is short and no other thread tokenizes (the loop never
        waits for the lock), else in the encoder's thread."""
        if _chars(spec) <= INLINE_CHARS and self._lock.acquire(blocking=False):
            try:
                return self.encode(spec)
            finally:
                self._lock.release()
        return await self.run(self.encode, spec)

    def close(self) -> None:
        self._thread.shutdown(cancel_futures=True)

    def encode(self, spec: JobSpec) -> list[int]:
        """The prompt's ids; raises ``PromptError`` if they cannot run (a text far too long for the
        context is refused before it is tokenized)."""
        result = self._encode_chunk([spec], [self._render(spec)])[0]
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
        texts = [self._too_long(spec, text) or text for spec, text in zip(specs, texts, strict=True)]
        results: list[list[int] | PromptError] = [t if isinstance(t, PromptError) else [] for t in texts]
        # A raw prompt gets the tokenizer's special tokens (BOS); a rendered chat has its own.
        for is_chat in (False, True):
            todo = [
                i
                for i, t in enumerate(texts)
                if isinstance(t, str) and (specs[i].messages is not None) == is_chat
            ]
            if not todo:
                continue
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
            return encode_ids(self.tokenizer.backend_tokenizer, texts, add_special_tokens=True)

    def _too_long(self, spec: JobSpec, text: str | PromptError) -> ContextExceeded | None:
        """Refused without tokenizing: more characters than the context could hold in any tokens."""
        if self.max_chars is None or isinstance(text, PromptError) or len(text) <= self.max_chars:
            return None
        normalizer = self.tokenizer.backend_tokenizer.normalizer  # it may shorten the text (NFC)
        chars = len(normalizer.normalize_str(text)) if normalizer else len(text)
        if chars <= self.max_chars:
            return None
        return ContextExceeded(
            "messages" if spec.messages is not None else "prompt",
            f"the prompt is {chars} characters long; the model's context of {self.context_length} "
            f"tokens holds at most {self.max_chars} characters of any text",
        )

    def _checked(self, spec: JobSpec, token_ids: list[int]) -> list[int] | PromptError:
        """The ids, or why they cannot run: no tokens, more than the context with max_tokens, or
        more sequences than the engine could ever schedule at once."""
        field = "messages" if spec.messages is not None else "prompt"
        sequences = (spec.best_of or spec.n) if spec.use_beam_search else spec.n
        if step := context.step_problem(sequences, spec.use_beam_search, self.engine):
            return PromptError("best_of" if spec.use_beam_search and spec.best_of else "n", step)
        if not token_ids:
            return PromptError(field, "the prompt encodes to no tokens")
        if problem := context.context_problem(len(token_ids), spec.max_tokens, self.context_length):
            return ContextExceeded(field, problem)
        return token_ids

    def _template(self, chat: list[dict[str, str]]) -> str:
        """The chat as text (jinja alone: no tokenizer state, so no lock)."""
        try:
            return self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        except Exception as error:  # no template, or the template rejects the chat (jinja raise)
            message = f"the model's chat template rejects these messages: {error}"
            raise PromptError("messages", message) from error


def _chars(spec: JobSpec) -> int:
    """The prompt's size against ``INLINE_CHARS``: a chat of many empty messages is no quick render."""
    messages = spec.messages or ()
    return len(spec.prompt or "") + sum(len(message.content) + MESSAGE_CHARS for message in messages)
