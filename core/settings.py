"""Every setting of the job service, read from ``PAGEDQ_*`` environment variables."""

from pathlib import Path
from typing import Literal

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "pagedq"


class Settings(BaseSettings):
    """One flat set of knobs. The defaults are the embedded mode: SQLite and a broker on local disk."""

    model_config = SettingsConfigDict(env_prefix="PAGEDQ_", extra="ignore")

    # Where jobs live and how they travel.
    data_dir: Path = default_data_dir()
    database_url: str = ""  # default: sqlite:///<data_dir>/pagedq.db
    broker_url: str = ""  # default: filesystem://<data_dir>/broker (no server)
    model: str = "smollm2-135m-instruct"  # a Hugging Face directory or the built-in default
    log_level: str = "INFO"

    # The API (``api_url`` is where the ``pagedq submit|jobs`` client finds it).
    api_url: str = "http://127.0.0.1:8000"
    host: str = "127.0.0.1"
    port: int = 8000
    api_workers: int = 1  # API processes sharing the port; each is one core's worth of submissions
    batch_processes: int = 0  # processes (per API process) checking a batch file's lines; 0: its own thread
    max_wait_seconds: float = 60.0  # the longest ``Prefer: wait=N`` honoured
    max_request_bytes: int = 8 * 2**20  # the largest request body but an upload (413 beyond it)
    max_upload_bytes: int = 200 * 2**20  # the largest file ``POST /v1/files`` takes (OpenAI's limit)
    keep_jobs_of_disconnected_clients: bool = False  # an OpenAI-style request whose client left: keep it

    # The worker's engine.
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    block_size: int = 16
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    kv_cache_bytes: int | None = None
    enforce_eager: bool = False  # CUDA: no graph capture of decode steps

    # Webhooks (Standard Webhooks), sent by ``pagedq webhooks`` from their own queue.
    webhook_url: str = ""  # a global endpoint for every event; jobs and batches may name their own
    webhook_secret: str = ""  # whsec_…; default: generated once into <data_dir>/webhook_secret
    webhook_allow_private: bool = False  # allow URLs resolving to loopback, private or link-local addresses
    webhook_timeout: float = 10.0
    webhook_max_attempts: int = 8
    webhook_backoff_base: float = 1.0  # seconds before the first retry; doubles each time, capped, jittered
    webhook_queue: str = "pagedq.webhooks"  # the broker queue deliveries travel on

    # The worker's reliability loop.
    worker_concurrency: int | None = None  # jobs held at once; default: max_num_seqs
    flush_interval: float = 0.8  # partial output and cancellations: under a second apart
    heartbeat_timeout: float = 30.0  # a worker silent this long is dead; its jobs are requeued
    heartbeat_interval: float | None = None  # default: heartbeat_timeout / 6; also the worker gauges' age
    requeue_after: float = 30.0  # a queued job this old with an empty broker queue is republished
    reconcile_interval: float = 5.0
    shutdown_grace: float = 30.0  # on SIGTERM, running jobs get this long before they are requeued
    visibility_timeout: int = 3600  # Redis redelivers an unacknowledged message after this many seconds

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'pagedq.db'}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or f"filesystem://{self.data_dir / 'broker'}"

    @property
    def broker_kind(self) -> Literal["filesystem", "other"]:
        return "filesystem" if self.resolved_broker_url.startswith("filesystem://") else "other"

    @property
    def served_model_name(self) -> str:
        """The name clients and queues know the model by: the directory's name for a path."""
        return Path(self.model.rstrip("/")).name

    @property
    def jobs_held_per_worker(self) -> int:
        return self.worker_concurrency or self.max_num_seqs

    @property
    def heartbeat_period(self) -> float:
        return self.heartbeat_interval or self.heartbeat_timeout / 6

    @model_validator(mode="after")
    def _heartbeats_within_the_timeout(self) -> "Settings":
        if self.heartbeat_period >= self.heartbeat_timeout:
            raise ValueError(
                f"PAGEDQ_HEARTBEAT_INTERVAL ({self.heartbeat_period:g} s) must be shorter than "
                f"PAGEDQ_HEARTBEAT_TIMEOUT ({self.heartbeat_timeout:g} s): workers would look dead"
            )
        return self
