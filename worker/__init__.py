"""The pagedq worker: drains the job queue into one engine."""
