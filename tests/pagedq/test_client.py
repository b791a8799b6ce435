"""``pagedq submit`` and ``pagedq jobs`` against a real API server, worker, PostgreSQL and Redis."""

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core import keys
from core.settings import Settings
from pagedq import cli
from tests.support.jobs_client import Database, api_over_http, start_worker


@pytest.fixture
def api_url(service_settings: Settings) -> Iterator[str]:
    with api_over_http(service_settings) as url:
        yield url


@pytest.fixture
def worker(service_settings: Settings, db: Database, tmp_path: Path) -> Iterator[None]:
    process = start_worker(service_settings, db, tmp_path / "worker.log")
    yield
    process.stop()


def jsonl(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def body(i: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": f"The quick brown fox {i} jumps over", "max_tokens": 4 + i, "temperature": 0} | extra


def all_job_ids(url: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert cli.main(["jobs", "list", "--json", "--limit", "1000", "--url", url]) == 0
    return [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()]


def test_submit_wait_writes_results_in_input_order_and_a_rerun_submits_nothing_new(
    api_url, worker, tmp_path, capsys
):
    jobs, out = jsonl(tmp_path / "jobs.jsonl", [body(i, ignore_eos=True) for i in range(6)]), tmp_path / "out"
    assert cli.main(["submit", str(jobs), "--wait", "--out", str(out), "--url", api_url]) == 0
    results = read_jsonl(out)
    assert [r["line"] for r in results] == [1, 2, 3, 4, 5, 6]
    assert all(r["status"] == "succeeded" and r["text"] and r["error"] is None for r in results)
    assert [r["usage"]["completion_tokens"] for r in results] == [4 + i for i in range(6)]
    assert all(r["usage"]["completion_tokens"] == len(r["timings"]["token_times_ms"]) for r in results)
    assert "6 succeeded" in capsys.readouterr().err

    again = tmp_path / "again"
    assert cli.main(["submit", str(jobs), "--wait", "--out", str(again), "--url", api_url]) == 0
    assert read_jsonl(again) == results
    capsys.readouterr()
    assert sorted(all_job_ids(api_url, capsys)) == sorted(r["id"] for r in results)


def test_submit_without_wait_prints_one_id_per_line(api_url, tmp_path, capsys):
    jobs = jsonl(tmp_path / "jobs.jsonl", [body(0), "", body(1)])
    assert cli.main(["submit", str(jobs), "--url", api_url]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["line"] for p in printed] == [1, 3] and all(p["id"].startswith("job_") for p in printed)


def test_a_bad_line_is_reported_with_its_number_and_nothing_is_submitted(api_url, tmp_path, capsys):
    jobs = jsonl(tmp_path / "jobs.jsonl", [body(0), "{not json", body(1), "[1, 2]"])
    with jobs.open("ab") as file:
        file.write(b'{"prompt": "caf\xe9"}\n')
    assert cli.main(["submit", str(jobs), "--wait", "--url", api_url]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{jobs}:2: not valid JSON: Expecting property name enclosed in double quotes at column 2",
        f"{jobs}:4: expected a JSON object, got list",
        f"{jobs}:5: not valid UTF-8",
    ]
    assert all_job_ids(api_url, capsys) == []


def test_a_line_the_api_rejects_is_reported_and_the_others_still_run(api_url, worker, tmp_path, capsys):
    jobs = jsonl(tmp_path / "jobs.jsonl", [body(0), body(1, max_tokens=0), body(2)])
    out = tmp_path / "out"
    assert cli.main(["submit", str(jobs), "--wait", "--out", str(out), "--url", api_url]) == 1
    err = capsys.readouterr().err
    assert f"{jobs}:2: rejected by the API (422): max_tokens: Input should be greater than or equal" in err
    results = read_jsonl(out)
    assert [r["status"] for r in results] == ["succeeded", "rejected", "succeeded"]
    assert results[1]["id"] is None and "max_tokens" in results[1]["error"]


def test_jobs_get_list_and_cancel(api_url, tmp_path, capsys):
    jobs = jsonl(tmp_path / "jobs.jsonl", [body(0, metadata={"batch": "7"})])
    assert cli.main(["submit", str(jobs), "--url", api_url]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    assert cli.main(["jobs", "get", job_id, "--url", api_url]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"] == {"batch": "7"}
    assert cli.main(["jobs", "cancel", job_id, "--url", api_url]) == 0  # no worker: still queued
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"
    assert cli.main(["jobs", "list", "--status", "cancelled", "--url", api_url]) == 0
    [header, row] = capsys.readouterr().out.splitlines()
    assert header.startswith("ID") and row.startswith(job_id) and "cancelled" in row
    assert cli.main(["jobs", "cancel", job_id, "--url", api_url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pagedq: job {job_id} is already cancelled") and err.count("\n") == 1


@pytest.mark.parametrize("action", ["get", "cancel"])
def test_an_unknown_job_is_a_one_line_error(api_url, action, capsys):
    assert cli.main(["jobs", action, "job_nope", "--url", api_url]) == 1
    captured = capsys.readouterr()
    assert captured.err == "pagedq: job 'job_nope' not found\n" and captured.out == ""


def test_an_unreachable_api_is_a_one_line_error(capsys):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert cli.main(["jobs", "get", "job_x", "--url", f"http://127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pagedq: cannot reach the API at http://127.0.0.1:{port}: ")
    assert err.count("\n") == 1


def test_a_rerun_says_its_lines_were_submitted_before_and_new_runs_them_again(api_url, tmp_path, capsys):
    jobs = jsonl(tmp_path / "jobs.jsonl", [body(0), body(1)])
    assert cli.main(["submit", str(jobs), "--url", api_url]) == 0
    first = capsys.readouterr()
    assert "submitted before" not in first.err

    assert cli.main(["submit", str(jobs), "--url", api_url]) == 0
    again = capsys.readouterr()
    assert again.out == first.out
    assert (
        "pagedq: 2 of 2 lines were submitted before (same file); showing their job ids; "
        "`--new` to run them again"
    ) in again.err

    assert cli.main(["submit", str(jobs), "--new", "--url", api_url]) == 0
    renewed = capsys.readouterr()
    assert "submitted before" not in renewed.err
    ids = {json.loads(line)["id"] for line in (first.out + renewed.out).splitlines()}
    assert len(ids) == 4


def test_a_batch_file_without_batch_is_refused_with_the_flag_to_use(api_url, tmp_path, capsys):
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi"}}
    jobs = jsonl(tmp_path / "batch.jsonl", [line, line | {"custom_id": "b"}])
    assert cli.main(["submit", str(jobs), "--url", api_url]) == 2
    err = capsys.readouterr().err
    assert "holds OpenAI batch request lines (custom_id, method, url, body)" in err
    assert f"`pagedq submit {jobs} --batch`" in err
    assert all_job_ids(api_url, capsys) == []


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "http://127.0.0.1:8000"),
        ({"PAGEDQ_PORT": "8001"}, "http://127.0.0.1:8001"),
        ({"PAGEDQ_HOST": "0.0.0.0", "PAGEDQ_PORT": "8002"}, "http://127.0.0.1:8002"),
        ({"PAGEDQ_HOST": "::1"}, "http://[::1]:8000"),
        ({"PAGEDQ_PORT": "8001", "PAGEDQ_API_URL": "http://api.example:9000"}, "http://api.example:9000"),
    ],
)
def test_clients_find_the_api_where_make_run_put_it(monkeypatch, env, url):
    for name in ("PAGEDQ_HOST", "PAGEDQ_PORT", "PAGEDQ_API_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.api_url(cli.build_parser().parse_args(["jobs", "list"])) == url


def test_a_missing_or_wrong_key_names_the_variable_to_set(service_settings, db, monkeypatch, capsys):
    settings = service_settings.model_copy(update={"auth": "required"})
    with db.sessions.begin() as session:
        key = keys.create(session, "cli", False)[1]
    monkeypatch.delenv("PAGEDQ_API_KEY", raising=False)
    with api_over_http(settings) as url:
        assert cli.main(["jobs", "list", "--url", url]) == 1
        err = capsys.readouterr().err
        assert "needs an API key: set PAGEDQ_API_KEY" in err and "header" not in err and err.count("\n") == 1
        monkeypatch.setenv("PAGEDQ_API_KEY", "pq_not_a_key")
        assert cli.main(["jobs", "list", "--url", url]) == 1
        assert "does not accept the key in PAGEDQ_API_KEY" in capsys.readouterr().err
        monkeypatch.setenv("PAGEDQ_API_KEY", key)
        assert cli.main(["jobs", "list", "--url", url]) == 0
