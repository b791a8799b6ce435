"""``pagedq submit FILE.jsonl --batch``: the file as one OpenAI-style batch, followed to its end.

The file holds OpenAI batch request lines (``{"custom_id", "method", "url", "body"}``). It is uploaded
(``POST /v1/files``), becomes one batch (``POST /v1/batches``), is followed with a progress bar, and its
output and error files are written as one JSONL in input order.
"""

import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pagedq.client import Api, Json, reports_errors

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
POLL_SECONDS = 1.0


@reports_errors
def submit_batch(path: Path, url: str, *, endpoint: str, out: Path | None) -> int:
    data = path.read_bytes()
    if out is not None and not out.parent.is_dir():
        print(f"pagedq: {out.parent}: no such directory for --out", file=sys.stderr)
        return 2
    with Api(url, retries=3) as api:  # retries for the reads; the two POSTs are sent once
        upload = {"files": {"file": (path.name, data)}, "data": {"purpose": "batch"}}
        file = api.send("POST", "/v1/files", **upload).json()
        body = {"input_file_id": file["id"], "endpoint": endpoint, "completion_window": "24h"}
        batch = api.send("POST", "/v1/batches", json=body).json()
        if batch["status"] == "failed":
            return _rejected(path, batch)
        try:
            batch = _follow(api, batch)
        except KeyboardInterrupt:
            print(f"pagedq: interrupted; batch {batch['id']} goes on", file=sys.stderr)
            return 130
        results = _download(api, batch["output_file_id"]) + _download(api, batch["error_file_id"])
    _write(_in_input_order(data, results), out)
    counts = batch["request_counts"]
    summary = f"{batch['status']}: {counts['completed']} completed, {counts['failed']} failed"
    print(f"pagedq: batch {batch['id']} {summary}", file=sys.stderr)
    return 0 if batch["status"] == "completed" and counts["failed"] == 0 else 1


def _rejected(path: Path, batch: Json) -> int:
    for error in batch["errors"]["data"]:
        where = f"{path}:{error['line']}" if error.get("line") else str(path)
        print(f"{where}: {error['code']}: {error['message']}", file=sys.stderr)
    return 2


def _follow(api: Api, batch: Json) -> Json:
    """Polls the batch until it ends, with a bar of its finished requests (completed or failed)."""
    with tqdm(total=batch["request_counts"]["total"], unit="req", desc="batch", dynamic_ncols=True) as bar:
        while True:
            counts = batch["request_counts"]
            bar.update(counts["completed"] + counts["failed"] - bar.n)
            bar.set_postfix_str(f"{batch['status']}, {batch['usage']['output_tokens']} tokens")
            if batch["status"] in TERMINAL:
                return batch
            time.sleep(POLL_SECONDS)
            batch = api.call("GET", f"/v1/batches/{batch['id']}")


def _download(api: Api, file_id: str | None) -> list[Json]:
    if file_id is None:
        return []
    content = api.send("GET", f"/v1/files/{file_id}/content").content
    return [json.loads(line) for line in content.splitlines()]


def _in_input_order(data: bytes, results: list[Json]) -> list[Json]:
    by_id = {result["custom_id"]: result for result in results}
    order = [json.loads(line)["custom_id"] for line in data.splitlines() if line.strip()]
    return [by_id[custom_id] for custom_id in order if custom_id in by_id]


def _write(records: list[Any], out: Path | None) -> None:
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
