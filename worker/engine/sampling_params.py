"""What a caller may ask of one request."""

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Sampling parameters, with vLLM's names and meanings.

    ``temperature=0`` is greedy decoding. ``top_k=0`` and ``top_p=1`` disable those filters.
    ``logprobs=k`` returns, for every generated token, its log-probability and the top ``k``
    alternatives, taken from the model's raw distribution (before penalties and temperature).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    max_tokens: int = 16
    min_tokens: int = 0
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Beam search (transformers' semantics): ``best_of`` beams (default ``n``), the best ``n`` returned.
    use_beam_search: bool = False
    best_of: int | None = None
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True, False or "never"

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self._validate()

    def _validate(self) -> None:
        checks = [
            (self.n >= 1, f"n must be >= 1, got {self.n}"),
            (self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0 or self.top_k == -1, f"top_k must be >= 0 (0 disables), got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.repetition_penalty > 0.0, f"repetition_penalty must be > 0, got {self.repetition_penalty}"),
            (
                -2.0 <= self.presence_penalty <= 2.0,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                -2.0 <= self.frequency_penalty <= 2.0,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"),
            (
                0 <= self.min_tokens <= self.max_tokens,
                f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}",
            ),
            (
                self.logprobs is None or 0 <= self.logprobs <= 20,
                f"logprobs must be in [0, 20], got {self.logprobs}",
            ),
            (all(s for s in self.stop), "stop strings must not be empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.top_k == -1:
            self.top_k = 0
        if self.use_beam_search:
            self._validate_beam_search()

    def _validate_beam_search(self) -> None:
        width = self.beam_width
        checks = [
            (width >= self.n, f"best_of ({width}) must be >= n ({self.n})"),
            (width >= 2, f"beam search needs at least 2 beams (best_of or n), got {width}"),
            (self.temperature == 0.0, "beam search is deterministic: temperature must be 0"),
            (
                self.top_p == 1.0 and self.top_k == 0 and self.min_p == 0.0,
                "beam search takes no top_p/k, min_p",
            ),
            (
                not self.needs_penalties,
                "beam search does not support repetition/presence/frequency penalties",
            ),
            (not self.stop, "beam search supports stop_token_ids, not stop strings"),
            (
                self.min_tokens == 0 and self.logprobs is None,
                "beam search supports neither min_tokens nor logprobs",
            ),
            (self.early_stopping in (True, False, "never"), "early_stopping must be true, false or 'never'"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def beam_width(self) -> int:
        return self.best_of or self.n

    @property
    def num_sequences(self) -> int:
        """Sequences the request runs at once: its beams, or its n samples."""
        return self.beam_width if self.use_beam_search else self.n

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
