"""Job rows for ``insert_jobs`` (api/batches/bulk_insert.py) in tests: what every row needs, and a row."""

import uuid
from typing import Any

from api.batches.queries import FRESH

# The batch writer's fresh values, and the columns a batch's request gives it.
REQUIRED = FRESH | {"prompt_token_ids": [1], "params": {}, "meta": {}, "priority": 0, "prompt_tokens": 1}


def shared_values(model: str, **values: Any) -> dict[str, Any]:
    """What every row of ``model`` shares: the NOT NULL columns, with ``values`` over them."""
    return {"model": model} | REQUIRED | values


def job_row(**values: Any) -> dict[str, Any]:
    """One row: a new id and ``values`` (the same keys in every row of one insert)."""
    return {"id": f"job_{uuid.uuid4().hex}"} | values
