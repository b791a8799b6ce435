"""Job rows for ``insert_jobs`` (api/batches/bulk_insert.py) in tests: what every row needs, and a row."""

import uuid
from typing import Any

from core.models import FRESH_RESULTS

REQUIRED = {"prompt_token_ids": [1], "params": {}, "meta": {}, "attempt": 0, "priority": 0}
REQUIRED |= {"cancel_requested": False, "prompt_tokens": 1} | FRESH_RESULTS


def shared_values(model: str, **values: Any) -> dict[str, Any]:
    """What every row of ``model`` shares: the NOT NULL columns, with ``values`` over them."""
    return {"model": model} | REQUIRED | values


def job_row(**values: Any) -> dict[str, Any]:
    """One row: a new id and ``values`` (the same keys in every row of one insert)."""
    return {"id": f"job_{uuid.uuid4().hex}"} | values
