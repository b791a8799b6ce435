"""A job's life: queued → running → succeeded | failed | cancelled (running → queued on requeue)."""

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


class BatchStatus(StrEnum):
    """OpenAI's batch statuses."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


BATCH_TERMINAL = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)
