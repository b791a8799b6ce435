"""How close a running batch's ``estimated_completion_at`` (worker/estimates.py) comes to its real end.

Starts a real ``pagedq api`` and one ``pagedq worker`` of the default chat model on private PostgreSQL and
Redis, sends a batch of ``--lines`` chat lines (prompts of 5-150 words, ``max_tokens`` 16-64,
``ignore_eos``) and, once a ``--second-at`` share of it is done, a second such batch; polls both from
``GET /v1/batches/{id}`` until they end. Prints, per batch, the first estimate (when it was first shown
and when it said the batch would end, in seconds after the batch's creation), the estimates at 25, 50
and 75% done, the real end (``completed_at``), and the first estimate's error in seconds and as a share
of the batch's real duration (creation to end).

    python -m bench.batch_estimate [--lines 200] [--second-at 0.1] [--seats 16] [--keep]

The lead's run (a quiet machine, a few minutes): ``python -m bench.batch_estimate``.
"""

import argparse
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from bench.stack import service_stack
from contract.engine import DEFAULT_MODEL

ENDPOINT = "/v1/chat/completions"
ENDED = {"completed", "failed", "expired", "cancelled"}
MARKS = (0.25, 0.5, 0.75)
WORDS = ("river", "stone", "market", "winter", "lantern", "harbor", "copper", "meadow", "signal", "orchard")


@dataclass
class Watch:
    """One batch as polled: (seconds after creation, share done, estimate in seconds after creation)."""

    name: str
    id: str
    created: int
    samples: list[tuple[float, float, float | None]] = field(default_factory=list)
    end: int | None = None
    status: str = "in_progress"

    def poll(self, client: httpx.Client) -> None:
        batch = client.get(f"/v1/batches/{self.id}").raise_for_status().json()
        self.status = batch["status"]
        counts = batch["request_counts"]
        done = (counts["completed"] + counts["failed"]) / max(counts["total"], 1)
        estimate = batch["estimated_completion_at"]
        shown = None if estimate is None else float(estimate - self.created)
        self.samples.append((time.time() - self.created, done, shown))
        if self.status in ENDED:
            self.end = batch["completed_at"] or int(time.time())


def batch_lines(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    lines = [
        {
            "custom_id": f"b{seed}-{i}",
            "method": "POST",
            "url": ENDPOINT,
            "body": {
                "model": DEFAULT_MODEL,
                "messages": [
                    {"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 150)))}
                ],
                "max_tokens": rng.randint(16, 64),
                "temperature": 0,
                "ignore_eos": True,
            },
        }
        for i in range(n)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(5, 150)))


def submit(client: httpx.Client, name: str, content: bytes) -> Watch:
    upload = client.post("/v1/files", files={"file": (f"{name}.jsonl", content)}, data={"purpose": "batch"})
    body = {
        "input_file_id": upload.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    batch = client.post("/v1/batches", json=body).raise_for_status().json()
    return Watch(name, batch["id"], batch["created_at"])


def watch(url: str, args: argparse.Namespace) -> list[Watch]:
    with httpx.Client(base_url=url, timeout=120) as client:
        batches = [submit(client, "first", batch_lines(args.lines, 1))]
        while any(b.end is None for b in batches):
            for batch in batches:
                if batch.end is None:
                    batch.poll(client)
            first = batches[0]
            if len(batches) == 1 and (first.samples[-1][1] >= args.second_at or first.end is not None):
                batches.append(submit(client, "second", batch_lines(args.lines, 2)))
            time.sleep(args.poll)
    return batches


def report(batch: Watch) -> None:
    if batch.status != "completed" or batch.end is None:
        raise SystemExit(f"the {batch.name} batch ended {batch.status}")
    real = batch.end - batch.created
    shown = [(t, done, estimate) for t, done, estimate in batch.samples if estimate is not None]
    print(f"{batch.name} batch {batch.id}: ended at +{real} s")
    if not shown:
        print("  no estimate was ever shown")
        return
    t, done, first = shown[0]
    print(f"  first estimate shown at +{t:.1f} s ({done:.0%} done): ends at +{first:.0f} s")
    for mark in MARKS:
        later = [(t, estimate) for t, done, estimate in shown if done >= mark]
        if later:
            print(f"  at {mark:.0%} done (+{later[0][0]:.1f} s): ends at +{later[0][1]:.0f} s")
    error = first - real
    print(f"  first estimate's error: {error:+.0f} s, {error / max(real, 1):+.0%} of the real duration")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=200, help="lines a batch")
    parser.add_argument("--second-at", type=float, default=0.1, help="the first's share done at the second")
    parser.add_argument("--seats", type=int, default=16, help="PAGEDQ_MAX_NUM_SEQS of the worker")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between polls")
    parser.add_argument("--keep", action="store_true", help="keep the logs")
    args = parser.parse_args()
    fields = {"model": DEFAULT_MODEL, "max_num_seqs": args.seats}
    with service_stack(keep=args.keep, **fields) as stack:
        _, url = stack.api()
        stack.worker()
        batches = watch(url, args)
    print(f"{args.lines} chat lines a batch, {args.seats} seats, one worker of {DEFAULT_MODEL}")
    for batch in batches:
        report(batch)


if __name__ == "__main__":
    main()
