"""A new user's first minutes: the README's quick start against a fresh ``pagedq up``, as written."""

import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from core.settings import Settings
from tests.support.jobs_client import Database
from tests.support.services import REPO, Process, free_port, service_env, wait_for

READY = "pagedq is ready: "


def readme_first_request() -> tuple[dict[str, str], str]:
    """The headers and body of the README's first ``curl … /v1/jobs``."""
    readme = (REPO / "README.md").read_text()
    command = re.search(r"^curl -s localhost:8000/v1/jobs .*?\n(?=\S)", readme, re.MULTILINE | re.DOTALL)
    assert command, "the README's quick start has no curl to /v1/jobs"
    words = shlex.split(command.group(0).replace("\\\n", " "))
    headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
    return headers, words[words.index("-d") + 1]


def test_the_readme_quick_start_answers_a_finished_job_once_up_says_ready(
    tiny_llama: Path, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path / "data", model=str(tiny_llama), port=free_port(), device="cpu")
    up = Process(["up"], service_env(settings), tmp_path / "up.log")
    try:
        wait_for(lambda: READY in up.log() or up.popen.poll() is not None, 180, "the ready line")
        log = up.log()
        assert up.popen.poll() is None, log[-3000:]
        url = f"http://127.0.0.1:{settings.port}"
        assert f"{READY}API {url}, worker " in log and "on cpu (float32, context 1024), KV cache" in log
        assert f"curl -s {url}/v1/jobs" in log
        for chatter in ("Running upgrade", "-------------- ", "superuser privileges", "No hostname"):
            assert chatter not in log

        headers, body = readme_first_request()
        assert headers["Prefer"] == "wait=30"
        reply = httpx.post(f"{url}/v1/jobs", headers=headers, content=body, timeout=40)
        assert reply.status_code == 200, reply.text
        assert reply.json()["status"] == "succeeded"

        second = subprocess.run(
            [sys.executable, "-m", "pagedq", "up"],
            env=service_env(settings),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert f"{settings.data_dir} is in use by another `pagedq up` (pid {up.popen.pid})" in second.stderr

        endless = {"prompt": "hi", "max_tokens": 1000, "ignore_eos": True}
        long = httpx.post(f"{url}/v1/jobs", json=endless).json()
        wait_for(lambda: httpx.get(f"{url}/v1/jobs/{long['id']}").json()["status"] == "running", 30, "a job")
        up.popen.send_signal(signal.SIGINT)  # Ctrl-C: the API stops, running jobs get 30 s
        wait_for(lambda: "Ctrl-C again: requeue them now" in up.log(), 30, "the stopping line")
        up.popen.send_signal(signal.SIGINT)  # again: requeue them now
        db = Database(settings)
        try:
            db.wait_until([long["id"]], {"queued"}, 10)  # back in the queue at once, not left running
        finally:
            db.close()
        assert up.popen.wait(60) == 0, up.log()[-3000:]
    finally:
        up.stop()
    assert "requeueing running jobs and stopping now" in up.log()
