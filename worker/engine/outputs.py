"""What the engine hands back: per-request outputs, their samples and timings."""

from dataclasses import dataclass, field, replace

from contract.token_times import token_times_ms

# One generated position's log-probabilities: token id -> logprob (the sampled token and the top-k).
TokenLogprobs = dict[int, float]


@dataclass
class CompletionOutput:
    """One sample of a request. From ``LLMEngine.step`` it holds only what is new since the last step."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None  # when logprobs were asked for (or beam search), else None
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None  # stop | length | abort
    stop_reason: str | int | None = None  # the stop string or stop token that ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def extend(self, delta: "CompletionOutput") -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.logprobs = (self.logprobs or []) + delta.logprobs
        self.cumulative_logprob = delta.cumulative_logprob
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason


@dataclass
class RequestMetrics:
    """Monotonic timestamps (``time.monotonic()``, seconds) of one request's life. From ``LLMEngine.step``,
    ``token_times`` holds only the new tokens' times, as the samples hold only the new tokens;
    ``token_times_ms`` are the same as the service reports them (contract/token_times.py)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per token of the first sample (or beam step)
    # Seconds of engine steps charged to it so far: each step's wall time is split over its rows by the
    # tokens each computed (a prompt chunk of 500 tokens costs 500 times a decode token). Cumulative.
    engine_time: float = 0.0

    @property
    def token_times_ms(self) -> list[float]:
        """Milliseconds since the request was added, one per token: the service's ``token_times_ms``."""
        return token_times_ms(self.token_times, self.arrival_time)

    def record_token(self, now: float) -> None:
        if self.first_token_time is None:
            self.first_token_time = now
        self.token_times.append(now)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # why it failed (its constraint did not compile or gave up); finished
    seed: int | None = None  # the request's sampling seed (its own, or the one the engine chose): replays it

    def extend(self, delta: "RequestOutput") -> None:
        """Fold an incremental output from ``LLMEngine.step`` into this accumulated one."""
        by_index = {o.index: o for o in self.outputs}
        for d in delta.outputs:
            if d.index in by_index:
                by_index[d.index].extend(d)
            else:
                self.outputs.append(d)
        self.outputs.sort(key=lambda o: o.index)
        self.finished = delta.finished
        self.metrics.token_times.extend(delta.metrics.token_times)
        self.metrics = replace(delta.metrics, token_times=self.metrics.token_times)
        self.num_cached_tokens = delta.num_cached_tokens
        self.error = delta.error
        self.seed = delta.seed


@dataclass
class EmbeddingOutput:
    """One embedding request's result, from ``EmbeddingEngine.step`` once its step ran (or failed)."""

    request_id: str
    embedding: list[float]  # float32 values, pooled and (if the model says so) normalized; [] on error
    num_tokens: int  # the tokens embedded, after truncation: what the request's usage counts
    metrics: RequestMetrics
    error: str | None = None  # why it failed (aborted); its embedding is then empty
