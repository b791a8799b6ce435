"""The client commands: ``pagedq submit FILE.jsonl`` and ``pagedq jobs get|cancel|list``, over the REST API.

Every command returns its exit status: 0 done, 1 a job or request failed, 2 bad input. API and network
errors become one line on stderr, never a traceback.
"""

import functools
import hashlib
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec
from urllib.parse import quote

import httpx
from tqdm import tqdm

from core.settings import Settings

Json = dict[str, Any]
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
RETRYABLE = frozenset({502, 503, 504})
POLL_SECONDS = 0.5


class ApiError(Exception):
    """A request the API refused (``status`` is its HTTP status) or could not be made (``status`` 0)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Api:
    """The job endpoints. ``retries`` re-sends on network errors and 502/503/504 (safe: every call is
    idempotent, submissions through their Idempotency-Key)."""

    def __init__(self, url: str, connections: int = 4, retries: int = 0) -> None:
        self.url = url.rstrip("/")
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.key = Settings().api_key
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else None
        self.http = httpx.Client(base_url=self.url, timeout=30.0, limits=limits, headers=headers)
        self.retries = retries

    def __enter__(self) -> "Api":
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def submit(self, body: Json, idempotency_key: str) -> tuple[Json, bool]:
        """The job, and whether this request made it (202) rather than found it by its key (200)."""
        headers = {"Idempotency-Key": idempotency_key}
        response = self.request("POST", "/v1/jobs", json=body, headers=headers)
        return response.json(), response.status_code == 202

    def get(self, job_id: str) -> Json:
        return self.call("GET", f"/v1/jobs/{quote(job_id, safe='')}")

    def cancel(self, job_id: str) -> Json:
        return self.call("POST", f"/v1/jobs/{quote(job_id, safe='')}/cancel")

    def page(self, statuses: list[str], limit: int, after: str | None) -> Json:
        params = {"status": statuses, "limit": limit} | ({"after": after} if after else {})
        return self.call("GET", "/v1/jobs", params=params)

    def call(self, method: str, path: str, **kwargs: Any) -> Json:
        return self.request(method, path, **kwargs).json()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """``send``, re-sent up to ``retries`` times on network errors and 502/503/504."""
        for attempt in range(self.retries):
            try:
                return self.send(method, path, **kwargs)
            except ApiError as error:
                if error.status and error.status not in RETRYABLE:
                    raise
            time.sleep(0.5 * 2**attempt)
        return self.send(method, path, **kwargs)

    def send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The successful response, else ``ApiError``."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ApiError(f"cannot reach the API at {self.url}: {error or type(error).__name__}") from None
        if response.is_success:
            return response
        if response.status_code == 401:  # the API speaks of headers; a CLI user sets a variable
            raise ApiError(self._key_problem(), 401)
        raise ApiError(_detail(response), response.status_code)

    def _key_problem(self) -> str:
        if self.key:
            return f"the API at {self.url} does not accept the key in PAGEDQ_API_KEY"
        return (
            f"the API at {self.url} needs an API key: set PAGEDQ_API_KEY "
            "(an admin makes one with `pagedq keys create NAME`)"
        )


def _detail(response: httpx.Response) -> str:
    """The API's message: ``detail`` is a string, or a 422's list of ``{loc, msg}``."""
    try:
        detail = response.json()["detail"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code} {response.reason_phrase}".strip()
    if isinstance(detail, list):
        return "; ".join(_located(item) for item in detail)
    return str(detail)


def _located(item: Json) -> str:
    loc = [str(part) for part in item.get("loc", []) if part != "body"]
    return f"{'.'.join(loc)}: {item.get('msg')}" if loc else str(item.get("msg"))


P = ParamSpec("P")


def reports_errors(command: Callable[P, int]) -> Callable[P, int]:
    """API, network and file errors as one line on stderr and exit status 1."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return command(*args, **kwargs)
        except (ApiError, OSError) as error:
            print(f"pagedq: {error}", file=sys.stderr)
            return 1

    return run


# ``pagedq jobs``


@reports_errors
def get_job(url: str, job_id: str) -> int:
    with Api(url) as api:
        print(json.dumps(api.get(job_id), indent=2))
    return 0


@reports_errors
def cancel_job(url: str, job_id: str) -> int:
    with Api(url) as api:
        job = api.cancel(job_id)
    print(json.dumps(job, indent=2))
    return 0


@reports_errors
def list_jobs(url: str, statuses: list[str], limit: int, after: str | None, as_json: bool) -> int:
    with Api(url) as api:
        page = api.page(statuses, limit, after)
    if not as_json:
        print(f"{'ID':<40} {'STATUS':<10} {'FINISH':<7} {'TOKENS':>7}  QUEUED AT")
    for job in page["data"]:
        print(json.dumps(job) if as_json else _row(job))
    if page["has_more"]:
        print(f"more: --after {page['next_cursor']}", file=sys.stderr)
    return 0


def _row(job: Json) -> str:
    tokens, queued = job["usage"]["completion_tokens"], job["timings"]["queued_at"]
    return f"{job['id']:<40} {job['status']:<10} {job['finish_reason'] or '-':<7} {tokens:>7}  {queued}"


# ``pagedq submit``


class InputError(Exception):
    """The file cannot be submitted; the message lists every ``FILE:LINE: problem``."""


@dataclass
class Entry:
    """One line of the file: its job body, then the job the API made of it or its refusal."""

    line: int
    body: Json
    job: Json | None = None
    created: bool = False  # False: an earlier run of the same file made the job
    refusal: str | None = None

    @property
    def id(self) -> str | None:
        return self.job["id"] if self.job else None

    @property
    def finished(self) -> bool:
        return self.job is None or self.job["status"] in TERMINAL

    @property
    def status(self) -> str:
        return self.job["status"] if self.job else "rejected"

    def submitted(self) -> Json:
        return {"line": self.line, "id": self.id} | self._refusal()

    def result(self) -> Json:
        if self.job is None:
            return {"line": self.line, "id": None, "status": "rejected"} | self._refusal()
        job = self.job
        return {
            "line": self.line,
            "id": job["id"],
            "status": job["status"],
            "text": job["output"],
            "finish_reason": job["finish_reason"],
            "usage": job["usage"],
            "error": job["error"],
            "timings": job["timings"],
        }

    def _refusal(self) -> Json:
        return {"error": self.refusal} if self.refusal else {}


def read_entries(path: Path) -> tuple[list[Entry], str]:
    """The file's non-blank lines as job bodies, and the sha256 of its bytes."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(f"{path}: {error.strerror or error}") from None
    entries: list[Entry] = []
    problems: list[str] = []
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        body = _parse(raw)
        if isinstance(body, dict):
            entries.append(Entry(number, body))
        else:
            problems.append(f"{path}:{number}: {body}")
    if not entries and not problems:
        problems.append(f"{path}: no jobs in the file")
    if problems:
        raise InputError("\n".join(problems))
    return entries, hashlib.sha256(data).hexdigest()


def _parse(raw: bytes) -> Json | str:
    """The line's JSON object, or what is wrong with it."""
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as error:
        return f"not valid JSON: {error.msg} at column {error.colno}"
    except UnicodeDecodeError:
        return "not valid UTF-8"
    return body if isinstance(body, dict) else f"expected a JSON object, got {type(body).__name__}"


@reports_errors
def submit_file(
    path: Path, url: str, *, wait: bool, out: Path | None, concurrency: int, new: bool = False
) -> int:
    """Submits every line of ``path``; with ``wait``, waits for them all and writes their results.

    Re-running the same command submits nothing twice (and says so): each line's Idempotency-Key is the
    file's hash and the line number, so the API answers with the job it made the first time. ``new``
    adds a fresh nonce to the keys: every line runs again.
    """
    try:
        entries, digest = read_entries(path)
    except InputError as error:
        print(error, file=sys.stderr)
        return 2
    if batch_lines(entries):
        print(
            f"pagedq: {path} holds OpenAI batch request lines (custom_id, method, url, body), not job "
            f"bodies: run it as one batch with `pagedq submit {path} --batch`",
            file=sys.stderr,
        )
        return 2
    if out is not None and not out.parent.is_dir():
        print(f"pagedq: {out.parent}: no such directory for --out", file=sys.stderr)
        return 2
    started = time.monotonic()
    key_prefix = f"pagedq-{digest[:32]}" + (f"-{uuid.uuid4().hex}" if new else "")
    with Api(url, concurrency, retries=3) as api, _threads(concurrency) as pool:
        try:
            _submit_all(api, pool, entries, key_prefix)
            _say_if_submitted_before(entries, wait)
            if wait:
                _wait(api, pool, entries, started)
        except KeyboardInterrupt:
            print("pagedq: interrupted; submitted jobs go on. Re-run the command to resume.", file=sys.stderr)
            return 130
    for entry in entries:
        if entry.refusal:
            print(f"{path}:{entry.line}: {entry.refusal}", file=sys.stderr)
    if not wait:
        _write((entry.submitted() for entry in entries), out)
        return 1 if any(entry.refusal for entry in entries) else 0
    _write((entry.result() for entry in entries), out)
    return _summarize(entries)


@contextmanager
def _threads(count: int) -> Iterator[ThreadPoolExecutor]:
    """A thread pool that drops its queued calls when left early (an error, Ctrl-C)."""
    pool = ThreadPoolExecutor(count)
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


def _submit_all(api: Api, pool: ThreadPoolExecutor, entries: list[Entry], key_prefix: str) -> None:
    sent = pool.map(lambda entry: _submit(api, entry, f"{key_prefix}-{entry.line}"), entries)
    list(tqdm(sent, total=len(entries), desc="submitting", unit="job", leave=False, dynamic_ncols=True))


def batch_lines(entries: list[Entry]) -> bool:
    """Every line is an OpenAI batch request line, which ``--batch`` takes."""
    return all({"custom_id", "body"} <= entry.body.keys() for entry in entries)


def _say_if_submitted_before(entries: list[Entry], wait: bool) -> None:
    jobs = [entry for entry in entries if entry.job]
    if earlier := sum(not entry.created for entry in jobs):
        showing = "their results" if wait else "their job ids"
        print(
            f"pagedq: {earlier} of {len(jobs)} lines were submitted before (same file); showing {showing}; "
            "`--new` to run them again",
            file=sys.stderr,
        )


def _submit(api: Api, entry: Entry, idempotency_key: str) -> None:
    try:
        entry.job, entry.created = api.submit(entry.body, idempotency_key)
    except ApiError as error:
        if not 400 <= error.status < 500:
            raise
        entry.refusal = f"rejected by the API ({error.status}): {error}"


def _wait(api: Api, pool: ThreadPoolExecutor, entries: list[Entry], started: float) -> None:
    """Polls the unfinished jobs every ``POLL_SECONDS`` until all are terminal, with a progress bar."""
    jobs = [entry for entry in entries if entry.job]
    with tqdm(total=len(jobs), unit="job", desc="jobs", dynamic_ncols=True) as bar:
        while True:
            done = sum(entry.finished for entry in jobs)
            bar.update(done - bar.n)
            bar.set_postfix_str(f"{_tokens(jobs) / (time.monotonic() - started):.1f} tok/s")
            if done == len(jobs):
                return
            time.sleep(POLL_SECONDS)
            pending = [entry for entry in jobs if not entry.finished]
            for entry, job in zip(pending, pool.map(api.get, [e.id for e in pending]), strict=True):
                entry.job = job


def _tokens(entries: Iterable[Entry]) -> int:
    """Tokens generated so far: finished jobs' totals and running jobs' partial counts."""
    return sum(entry.job["usage"]["completion_tokens"] for entry in entries if entry.job)


def _write(records: Iterable[Json], out: Path | None) -> None:
    text = "".join(json.dumps(record) + "\n" for record in records)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)


def _summarize(entries: list[Entry]) -> int:
    counts = Counter(entry.status for entry in entries)
    print("pagedq: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())), file=sys.stderr)
    return 0 if counts.keys() == {"succeeded"} else 1
