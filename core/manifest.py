"""A job's manifest: what it ran and produced, enough to reproduce and audit it. ``GET
/v1/jobs/{id}/manifest`` serves it with its digest, and a batch's output lines carry that digest
(worker/batch_output.py), so a line can be checked against the manifest read later."""

import hashlib
import json
from typing import Any

from core.models import Job
from core.states import JobStatus


def manifest(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "status": JobStatus(job.status).value,
        "model": job.model,
        "served_by": job.served_by,
        "params": job.params,
        "prompt_token_ids": job.prompt_token_ids,
        "output_token_ids": job.choice_token_ids,
        "replay_of": job.replay_of,
    }


def manifest_digest(content: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON (keys sorted, no spaces, UTF-8): a client recomputes it
    from the manifest it reads, its ``digest`` left out."""
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"sha256:{hashlib.sha256(canonical.encode()).hexdigest()}"
