"""Structured outputs in the engine: constraints compiled into matchers, and each step's token bitmask.

The library (llguidance) sits behind three things: ``Grammars.compile`` (a constraint -> a future of
a ``Matcher``), ``Matcher`` (fork, accept a token, whether it errored) and ``fill_bitmask`` (one row of
allowed tokens per constrained sequence, 32 tokens to an int32 word, filled on the CPU in parallel).
Another library (xgrammar) would replace this file only; the sampler applies the bitmask it is given.
"""

import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from threading import Lock

import torch
from transformers import PreTrainedTokenizerBase

from contract.structured import StructuredOutput, grammar_text

logger = logging.getLogger("pagedq.engine")
CACHED_GRAMMARS = 1024


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, matcher: object) -> None:
        self.matcher = matcher

    def fork(self) -> "Matcher":
        return Matcher(self.matcher.deep_copy())  # type: ignore[attr-defined]

    def accept(self, token: int) -> str | None:
        """Advance by ``token``; returns why the grammar cannot go on (its sequence must fail), or None."""
        self.matcher.consume_token(token)  # type: ignore[attr-defined]
        return self.error

    @property
    def error(self) -> str | None:
        """Why the grammar failed (the library's first line), or None."""
        if not self.matcher.is_error():  # type: ignore[attr-defined]
            return None
        text = self.matcher.get_error().strip()  # type: ignore[attr-defined]
        return f"the structured-output constraint failed: {text.splitlines()[0] if text else 'unknown error'}"


class Grammars:
    """Compiles constraints off the step loop, each distinct one once (keyed by the constraint)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.tokenizer, self.vocab_size, self.eos_token_ids = tokenizer, vocab_size, eos_token_ids
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="pagedq-grammar")
        self.compiled: OrderedDict[str, Future[Matcher]] = OrderedDict()
        self.lock = Lock()
        self._library_tokenizer: object | None = None
        self._executor: object | None = None

    def compile(self, constraint: StructuredOutput) -> "Future[Matcher]":
        """A future of the constraint's fresh matcher (``fork`` it per sequence); raises ``ValueError``
        through the future if the library refuses it."""
        key = constraint.key
        if (future := self.compiled.get(key)) is None or (future.done() and future.exception() is not None):
            future = self.compiled[key] = self.pool.submit(self._compile, constraint)
            while len(self.compiled) > CACHED_GRAMMARS:
                self.compiled.popitem(last=False)
        self.compiled.move_to_end(key)
        return future

    def _compile(self, constraint: StructuredOutput) -> Matcher:
        from llguidance import LLMatcher

        matcher = LLMatcher(self._tokenizer(), grammar_text(constraint), log_level=0)
        if matcher.is_error():
            raise ValueError(f"the constraint does not compile: {matcher.get_error()}")
        return Matcher(matcher)

    def _tokenizer(self) -> object:
        """The library's view of the tokenizer: about a second to build, so built once, on first use."""
        with self.lock:
            if self._library_tokenizer is None:
                from llguidance.hf import from_tokenizer

                self._library_tokenizer = from_tokenizer(
                    self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_ids
                )
            return self._library_tokenizer

    def fill_bitmask(self, matchers: list[Matcher]) -> torch.Tensor:
        """``[len(matchers), words]`` int32 on the CPU: each matcher's allowed next tokens (EOS only where
        its grammar accepts), computed in parallel by the library's threads."""
        from llguidance import LLExecutor

        bitmask = torch.empty((len(matchers), bitmask_words(self.vocab_size)), dtype=torch.int32)
        if self._executor is None:
            self._executor = LLExecutor()
        self._executor.unsafe_compute_mask_ptr(  # type: ignore[attr-defined]
            [(m.matcher, i) for i, m in enumerate(matchers)],
            bitmask.data_ptr(),
            bitmask.shape[1] * 4,
            len(matchers),
        )
        return bitmask
