"""Chats tokenized piece by piece: a batch file repeats its instruction and the chat template's
scaffolding on every line, so each distinct piece of text between added tokens is encoded once.

A fast tokenizer cuts its input at its added tokens (``<|im_start|>``, …) before anything else and
encodes the pieces between them on their own, so the ids of the pieces, joined, are the ids of the
whole text. That holds when no normalizer runs (it could see across a cut) and no added token strips
the whitespace beside it. Where it does not hold, or where the first texts encoded both ways disagree
(a pre-tokenizer may treat a text's first piece apart, as Metaspace can), whole texts are encoded.
"""

import itertools
import logging
import re

from tokenizers import Tokenizer

logger = logging.getLogger(__name__)
CHECKED_TEXTS = 16  # texts encoded both ways before the pieces are trusted
# Texts of at most this many characters in all are encoded holding the GIL: a short prompt is tokenized on
# the API's event loop (api/prompts/encoder.py's INLINE_CHARS, and a chat template's scaffolding), and a
# batch encode lets the GIL go; taking it back from a thread that runs Python then waits out the switch
# interval, 5 ms, the loop stalled that long for ~20 µs of tokenizing (bench/RESULTS.md, 2026-11-29,
# twenty-fifth session). More goes without it, so that other threads run meanwhile.
HELD_GIL_CHARS = 4096


def encode_ids(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    """Each text's ids from the Rust tokenizer, a little work holding the GIL (``HELD_GIL_CHARS``)."""
    if sum(map(len, texts)) <= HELD_GIL_CHARS:
        return [tokenizer.encode(text, add_special_tokens=add_special_tokens).ids for text in texts]
    return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]


class PieceEncoder:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        tokens = tokenizer.get_added_tokens_decoder()
        self._added = {token.content: [token_id] for token_id, token in tokens.items()}
        # Longest first: where one added token begins another, the tokenizer takes the longer.
        alternatives = "|".join(re.escape(text) for text in sorted(self._added, key=len, reverse=True))
        self._cut = re.compile(f"({alternatives})")
        strips = any(token.lstrip or token.rstrip or token.single_word for token in tokens.values())
        self._trusted: bool | None = False if not tokens or strips or tokenizer.normalizer else None

    @property
    def by_pieces(self) -> bool:
        """Whether texts are encoded by pieces (settled by the first encode)."""
        return bool(self._trusted)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, without the post-processor's special tokens."""
        if self._trusted is None and texts:
            sample = texts[:CHECKED_TEXTS]
            self._trusted = self._by_pieces(sample) == self._whole(sample)
            if not self._trusted:
                logger.info(
                    "this tokenizer's pieces do not join into its whole encodes: encoding whole texts"
                )
        return self._by_pieces(texts) if self._trusted else self._whole(texts)

    def _by_pieces(self, texts: list[str]) -> list[list[int]]:
        split = [[piece for piece in self._cut.split(text) if piece] for text in texts]
        distinct = list(dict.fromkeys(p for pieces in split for p in pieces if p not in self._added))
        ids = dict(zip(distinct, self._whole(distinct), strict=True)) | self._added
        return [list(itertools.chain.from_iterable(ids[p] for p in pieces)) for pieces in split]

    def _whole(self, texts: list[str]) -> list[list[int]]:
        return encode_ids(self.tokenizer, texts, add_special_tokens=False)
