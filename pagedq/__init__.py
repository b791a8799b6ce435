"""pagedq: a self-hosted, job-based LLM inference service with its own paged-KV-cache engine."""

__version__ = "0.1.0"
