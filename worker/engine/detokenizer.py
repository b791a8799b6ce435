"""Incremental detokenization with stop strings.

``tokenizers``' DecodeStream buffers tokens until they form whole UTF-8 characters, so byte-fallback
tokens and characters split across tokens come out right. Text that could still turn out to be
the start of a stop string is held back until it cannot.
"""

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from contract.sampling import SamplingParams


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        # Seeding the stream with the prompt's tail gives the first tokens their leading spaces.
        self.stream = DecodeStream(ids=prompt_token_ids[-8:], skip_special_tokens=params.skip_special_tokens)
        self.stops = params.stop
        self.include_stop = params.include_stop_str_in_output
        self.holdback = max((len(s) for s in self.stops), default=1) - 1
        self.skip_special_tokens = params.skip_special_tokens
        self.pending: list[int] = []  # tokens the stream holds until they form whole characters
        self.text = ""
        self.num_emitted_chars = 0

    def add_token(self, token_id: int) -> str | None:
        """Append one token's text; returns the stop string it completed, if any."""
        piece = self.stream.step(self.tokenizer, token_id)
        if piece is None:
            self.pending.append(token_id)
            return None
        self.pending.clear()
        return self._add_text(piece)

    def flush(self) -> None:
        """At the end, bytes that never completed a character come out as U+FFFD, as a full decode gives."""
        if self.pending:
            self._add_text(self.tokenizer.decode(self.pending, skip_special_tokens=self.skip_special_tokens))
            self.pending.clear()

    def _add_text(self, piece: str) -> str | None:
        search_from = max(len(self.text) - self.holdback, 0)
        self.text += piece
        return self._cut_at_stop(search_from)

    def _cut_at_stop(self, search_from: int) -> str | None:
        hits = [(i, s) for s in self.stops if (i := self.text.find(s, search_from)) != -1]
        if not hits:
            return None
        index, stop = min(hits)
        self.text = self.text[: index + len(stop) if self.include_stop else index]
        return stop

    def take_new_text(self, finished: bool) -> str:
        """Text not handed out yet, keeping back a possible stop-string prefix while unfinished."""
        end = len(self.text) if finished else max(len(self.text) - self.holdback, self.num_emitted_chars)
        new = self.text[self.num_emitted_chars : end]
        self.num_emitted_chars = end
        return new
