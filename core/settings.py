"""Every setting of the job service, read from ``PAGEDQ_*`` environment variables."""

from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, get_type_hints

from pydantic import Field, create_model, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from contract.engine import DEFAULT_EMBED_MODEL, EngineConfig
from contract.sampling import MAX_N


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "pagedq"


def _engine_knobs() -> dict[str, Any]:
    """Every ``EngineConfig`` field as a setting of the same name, type and default (``PAGEDQ_MAX_NUM_SEQS``
    is ``max_num_seqs``): the engine owns its knobs, their defaults and the reasons for them."""
    hints = get_type_hints(EngineConfig)
    return {knob.name: (hints[knob.name], knob.default) for knob in fields(EngineConfig)}


EngineSettings = create_model("EngineSettings", __base__=BaseSettings, **_engine_knobs())


class Settings(EngineSettings):
    """One flat set of knobs: the worker's engine (``EngineSettings``, from ``EngineConfig``), then the
    service's. The defaults are the embedded mode: SQLite and a broker on local disk."""

    model_config = SettingsConfigDict(env_prefix="PAGEDQ_", extra="ignore")

    # The models served (core/served_models.py): inline JSON or a .toml/.json file's path; unset: the chat
    # model of PAGEDQ_MODEL and the embedding model of PAGEDQ_EMBED_MODEL ("" serves the chat model alone).
    models: str = ""
    embed_model: str = DEFAULT_EMBED_MODEL

    # Where jobs live and how they travel.
    data_dir: Path = default_data_dir()
    database_url: str = ""  # default: sqlite:///<data_dir>/pagedq.db
    broker_url: str = ""  # default: filesystem://<data_dir>/broker (no server)
    log_level: str = "INFO"
    log_format: Literal["auto", "json", "text"] = "auto"  # auto: text lines on a terminal, else JSON lines

    # The API (``api_url`` is where the ``pagedq submit|jobs`` client finds it).
    api_url: str = ""  # default: http://<host>:<port>
    host: str = "127.0.0.1"
    port: int = 8000
    api_workers: int = 1  # API processes sharing the port; each is one core's worth of submissions
    batch_processes: int = 0  # processes (per API process) checking a batch file's lines; 0: its own thread
    max_wait_seconds: float = 60.0  # the longest ``Prefer: wait=N`` honoured
    max_request_bytes: int = 8 * 2**20  # the largest request body but an upload (413 beyond it)
    max_upload_bytes: int = 200 * 2**20  # the largest file ``POST /v1/files`` takes (OpenAI's limit)
    keep_jobs_of_disconnected_clients: bool = False  # an OpenAI-style request whose client left: keep it

    # API keys (``pagedq keys``) and each key's limits; a key's own value, if set, wins over these.
    auth: Literal["auto", "required", "off"] = "auto"  # auto: required unless the API listens on loopback
    admin_key: str = ""  # pq_…: the first admin key, made on a first start with auth required and no key
    api_key: str = ""  # the key ``pagedq submit`` and ``pagedq jobs`` send
    key_max_active_jobs: int = 100_000  # queued + running jobs of a key, batch lines counted
    key_requests_per_second: float = 50.0  # submissions (jobs, completions, /generate, batches) per second
    key_tokens_per_minute: int = 2_000_000  # prompt tokens + max_tokens of online submissions per minute
    key_max_tokens: int | None = None  # the largest max_tokens a key may ask for; default: the context's
    key_max_n: int = MAX_N  # the largest n (or beam width) a key may ask for
    key_max_prompt_tokens: int | None = None  # the longest prompt a key may send; default: the context's

    # Webhooks (Standard Webhooks), sent by ``pagedq webhooks`` from their own queue.
    webhook_url: str = ""  # a global endpoint for every event; jobs and batches may name their own
    webhook_secret: str = ""  # whsec_…; default: generated once into <data_dir>/webhook_secret
    webhook_allow_private: bool = False  # allow URLs in special-purpose ranges (loopback, private, …)
    webhook_resolve_timeout: float = 3.0  # seconds a webhook URL's host may take to resolve
    webhook_timeout: float = 10.0
    webhook_max_attempts: int = 8
    webhook_backoff_base: float = 1.0  # seconds before the first retry; doubles each time, capped, jittered
    webhook_queue: str = "pagedq.webhooks"  # the broker queue deliveries travel on

    # The worker's reliability loop.
    worker_concurrency: int | None = None  # jobs held at once; default: max_num_seqs
    flush_interval: float = 0.8  # partial output and cancellations: under a second apart
    # a batch line's partial output, which only a resumed run reads; default: 6 x flush_interval
    batch_flush_interval: float | None = None
    # nice increment of the worker's bookkeeping threads (flusher, streamer, watchers, reconciler, Celery
    # seats), so they do not preempt the engine's threads on a busy CPU; the heartbeat keeps 0
    bookkeeping_nice: int = Field(default=0, ge=0, le=19)
    # on a CPU engine, after a step that streams a reader's first token the engine waits this long before
    # its next step (which takes every core), so that the token's relay (streamer, Redis, API) runs first
    first_token_yield_ms: float = Field(default=1.5, ge=0, le=50)
    heartbeat_timeout: float = 30.0  # a worker silent this long is dead; its jobs are requeued
    heartbeat_interval: float | None = None  # default: heartbeat_timeout / 6; also the worker gauges' age
    max_attempts: int = 3  # runs a job may start; if its worker dies (or drains) in the last, it fails
    requeue_after: float = 30.0  # a queued job this old with an empty broker queue is republished
    reconcile_interval: float = 5.0
    shutdown_grace: float = 30.0  # on SIGTERM, running jobs get this long before they are requeued
    worker_status_file: Path | None = (
        None  # default: <data_dir>/worker-status.json (``pagedq worker --check``)
    )

    # Retention (core/retention.py): ended jobs, batches and files are deleted this long after creation.
    retention_days: float = 30.0  # a job or file, or a batch after its output is written; 0: keep forever
    purge_interval: float = 300.0  # seconds between a worker's purges of what has expired
    purge_chunk: int = 500  # jobs deleted per transaction (files: a twentieth), so no lock is held long
    # Fair share (worker/fair.py): a message is a ticket; the claim takes the fairest queued job.
    fair_share: bool = True  # off: a message claims its own job (broker order)
    fair_aging_seconds: float = 30.0  # a job gains one priority point on jobs submitted this much later
    # Jobs get a prefix key at submission and workers prefer the queued jobs whose prompt prefix they hold
    # (worker/fair.py, contract/prefix.py); off: neither (a batch's lines run in input order).
    prefix_aware_order: bool = True
    batch_priority: int = 10  # a batch's default priority; single jobs and online requests default to 0

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'pagedq.db'}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or f"filesystem://{self.data_dir / 'broker'}"

    @property
    def resolved_worker_status_file(self) -> Path:
        return self.worker_status_file or self.data_dir / "worker-status.json"

    @property
    def listen_url(self) -> str:
        """The API this machine serves at ``host`` and ``port`` (a wildcard host is reached on loopback)."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def resolved_api_url(self) -> str:
        """Where clients find the API: ``api_url``, else ``listen_url``."""
        return self.api_url or self.listen_url

    @property
    def auth_required(self) -> bool:
        """``PAGEDQ_AUTH``, or for ``auto`` whether the API listens beyond loopback."""
        if self.auth != "auto":
            return self.auth == "required"
        return self.host not in ("127.0.0.1", "::1", "localhost") and not self.host.startswith("127.")

    @property
    def broker_kind(self) -> Literal["filesystem", "other"]:
        return "filesystem" if self.resolved_broker_url.startswith("filesystem://") else "other"

    @property
    def served_model_name(self) -> str:
        """The name clients and queues know the model by: the directory's name for a path."""
        return Path(self.model.rstrip("/")).name

    def engine_config(self) -> EngineConfig:
        """The worker's engine, as these settings configure it."""
        return EngineConfig(**self.model_dump(include={knob.name for knob in fields(EngineConfig)}))

    @property
    def heartbeat_period(self) -> float:
        return self.heartbeat_interval or self.heartbeat_timeout / 6

    @property
    def batch_flush_period(self) -> float:
        return self.batch_flush_interval or 6 * self.flush_interval

    @model_validator(mode="after")
    def _heartbeats_within_the_timeout(self) -> "Settings":
        if self.heartbeat_period >= self.heartbeat_timeout:
            raise ValueError(
                f"PAGEDQ_HEARTBEAT_INTERVAL ({self.heartbeat_period:g} s) must be shorter than "
                f"PAGEDQ_HEARTBEAT_TIMEOUT ({self.heartbeat_timeout:g} s): workers would look dead"
            )
        return self
