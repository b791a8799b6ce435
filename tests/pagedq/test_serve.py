"""``pagedq api`` with several processes (``PAGEDQ_API_WORKERS``) on a box too busy to start them quickly."""

from pathlib import Path

import httpx
import pytest

from core.settings import Settings
from tests.support.services import Process, database_from, free_port, redis_url, service_env, wait_for

SLOW_START = 8  # seconds: more than uvicorn's 5 s ping timeout


@pytest.fixture
def slow_start(tmp_path: Path) -> Path:
    """A sitecustomize that holds each spawned child (never the parent) before it can answer a ping."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import sys, time\nif '--multiprocessing-fork' in sys.argv:\n    time.sleep({SLOW_START})\n"
    )
    return site


def test_api_processes_that_start_slowly_are_not_killed(
    pg_template: str, tiny_llama: Path, slow_start: Path, tmp_path: Path
) -> None:
    with database_from(pg_template) as url:
        settings = Settings(
            database_url=url,
            broker_url=redis_url(),
            model=str(tiny_llama),
            data_dir=tmp_path,
            port=free_port(),
            api_workers=2,
        )
        env = service_env(settings)
        env["PYTHONPATH"] = f"{slow_start}:{env.get('PYTHONPATH', '')}".rstrip(":")
        api = Process(["api"], env, tmp_path / "api.log")
        try:
            started = lambda: api.log().count('"message": "Started server process')  # noqa: E731
            wait_for(lambda: started() >= 2, 120, "both API processes to start", interval=0.2)
            # "Started" comes before the app's startup (the heap's freeze): the port answers once it ends
            wait_for(lambda: served(settings.port), 60, "the API to answer", interval=0.2)
            log = api.log()
            assert started() == 2 and "died" not in log, log[-3000:]  # none killed and replaced
        finally:
            assert api.stop() == 0, api.log()[-3000:]


def served(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.fast
def test_a_worker_for_a_model_not_served_here_refuses_to_start_naming_the_served_ones(tmp_path: Path) -> None:
    models = '[{"name": "chat-a", "source": "/m/a"}, {"name": "chat-b", "source": "/m/b"}]'
    settings = Settings(models=models, data_dir=tmp_path, broker_url="filesystem://" + str(tmp_path / "b"))
    worker = Process(["worker", "--model", "chat-c"], service_env(settings), tmp_path / "worker.log")
    assert worker.popen.wait(60) == 1
    assert "no model named 'chat-c' is served here; served: chat-a, chat-b" in worker.log()


def test_a_gguf_file_that_cannot_be_served_stops_up_and_its_worker_at_start_naming_it(
    tiny_llama_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncated file passes the models list's check (it is a GGUF file) and fails where it is loaded:
    `pagedq up` before it starts anything, a worker before it consumes. A missing one is a config error."""
    monkeypatch.setenv("PAGEDQ_CACHE_DIR", str(tmp_path / "cache"))
    truncated = tmp_path / "broken.gguf"
    data = (tiny_llama_gguf / "model.gguf").read_bytes()
    truncated.write_bytes(data[: len(data) - 4096])
    broker = "filesystem://" + str(tmp_path / "b")
    broken = Settings(
        models=f'[{{"name": "broken", "source": "{truncated}"}}]', data_dir=tmp_path, broker_url=broker
    )

    up = Process(["up"], service_env(broken), tmp_path / "up.log")
    assert up.popen.wait(120) == 1
    assert f"pagedq: model 'broken' cannot be served: {truncated}: tensor " in up.log()
    worker = Process(["worker", "--model", "broken"], service_env(broken), tmp_path / "worker.log")
    assert worker.popen.wait(120) != 0
    assert f"{truncated}: tensor " in worker.log() and "truncated" in worker.log()

    missing = broken.model_copy(update={"models": f'[{{"name": "gone", "source": "{tmp_path}/gone.gguf"}}]'})
    worker = Process(["worker"], service_env(missing), tmp_path / "missing.log")
    assert worker.popen.wait(60) == 1
    assert f"source '{tmp_path}/gone.gguf': the file cannot be read: No such file" in worker.log()
    assert not (tmp_path / "cache").exists()  # nothing was prepared
