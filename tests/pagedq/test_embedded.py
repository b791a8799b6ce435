"""``pagedq up``: API and worker in one command, on SQLite and a local-disk broker; jobs survive restarts."""

import json
import signal
from collections import Counter
from pathlib import Path

import httpx
import pytest
from gguf import GGUFReader
from safetensors.torch import load_file

from core.settings import Settings
from pagedq.up import READY
from tests.support.services import Process, free_port, service_env, wait_for
from worker.engine import LLM, SamplingParams


def start_up(settings: Settings, log: Path, key: str = "") -> tuple[Process, httpx.Client]:
    """``pagedq up`` with ``settings``, and a client that sends ``key`` (when auth is on) once it is ready."""
    process = Process(["up"], service_env(settings), log)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    client = httpx.Client(base_url=f"http://{settings.host}:{settings.port}", timeout=30, headers=headers)

    def ready() -> bool:
        try:
            return client.get("/readyz").status_code == 200
        except httpx.TransportError:
            assert process.popen.poll() is None, process.log()[-3000:]
            return False

    wait_for(ready, 120, "pagedq up to answer /readyz", interval=0.2)
    # /readyz is 200 once the worker heartbeats, a moment before it consumes: a batch made in that moment
    # waits for the reconciler (PAGEDQ_REQUEUE_AFTER). Its "worker ready" log line says it consumes.
    wait_for(lambda: '"worker ready"' in process.log(), 30, "the worker to consume", interval=0.1)
    return process, client


def embedded_settings(tiny_llama: Path, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        model=str(tiny_llama),
        port=free_port(),
        device="cpu",
        kv_cache_bytes=64 * 2**20,
        shutdown_grace=0.2,
        flush_interval=0.1,
    )


def test_pagedq_up_runs_jobs_on_sqlite_and_they_survive_a_restart(tiny_llama: Path, tmp_path: Path) -> None:
    # No grace, and 16 long jobs at once: alone, the tiny model's 1,000 tokens take ~0.3 s on a fast CPU,
    # about what it takes to see its first tokens and stop, and then no job runs for the restart to take over.
    settings = embedded_settings(tiny_llama, tmp_path).model_copy(update={"shutdown_grace": 0.0})
    process, client = start_up(settings, tmp_path / "up1.log")
    try:
        quick = client.post(
            "/v1/jobs",
            json={"prompt": "hello", "max_tokens": 8, "ignore_eos": True},
            headers={"Prefer": "wait=60"},
        ).json()
        assert quick["status"] == "succeeded", quick
        assert quick["usage"]["completion_tokens"] == len(quick["timings"]["token_times_ms"]) == 8
        body = {"prompt": "hi", "max_tokens": 1000, "ignore_eos": True}
        longs = [client.post("/v1/jobs", json=body).json()["id"] for _ in range(16)]
        wait_for(
            lambda: client.get(f"/v1/jobs/{longs[-1]}").json()["usage"]["completion_tokens"] > 0,
            60,
            "the long jobs to be running",
        )
    finally:
        process.signal(signal.SIGTERM)
        assert process.popen.wait(60) == 0, process.log()[-3000:]
    assert "(open, no API keys, to all on 127.0.0.1)" in process.log()  # its startup line says so
    assert (settings.data_dir / "pagedq.db").is_file()

    process, client = start_up(settings, tmp_path / "up2.log")
    try:
        assert client.get(f"/v1/jobs/{quick['id']}").json()["output"] == quick["output"]
        wait_for(
            lambda: all(client.get(f"/v1/jobs/{i}").json()["status"] == "succeeded" for i in longs),
            120,
            "the requeued jobs to run again and finish",
        )
        final = client.get(f"/v1/jobs/{longs[-1]}").json()
        assert final["attempt"] == 2 and final["usage"]["completion_tokens"] == 1000
        # it went on from the tokens flushed before the restart, and ended as one run would have
        assert 0 < final["runs"][-1]["resumed_from_token"] < 1000
        assert len(final["timings"]["token_times_ms"]) == 1000
        manifest = client.get(f"/v1/jobs/{longs[-1]}/manifest").json()
        llm = LLM(str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=64 * 2**20)
        [whole] = llm.generate([manifest["prompt_token_ids"]], SamplingParams(**manifest["params"]))
        assert manifest["output_token_ids"] == [whole.outputs[0].token_ids]
    finally:
        process.stop()


def test_pagedq_up_serves_two_models_each_by_its_own_workers_on_its_own_queue(
    tiny_llama: Path, tiny_qwen2: Path, tmp_path: Path
) -> None:
    models = [
        {"name": "llama", "source": str(tiny_llama)},
        {"name": "qwen", "source": str(tiny_qwen2), "seats": 4},
    ]
    settings = embedded_settings(tiny_llama, tmp_path).model_copy(update={"models": json.dumps(models)})
    process, client = start_up(settings, tmp_path / "up.log")
    try:
        wait_for(
            lambda: process.log().count(f"{READY}: API") == 2, 30, "a ready line per model", interval=0.1
        )
        body = {"prompt": "hello", "max_tokens": 4, "ignore_eos": True}
        wait = {"Prefer": "wait=60"}
        jobs = {
            m: client.post("/v1/jobs", json=body | {"model": m}, headers=wait).json()
            for m in ("llama", "qwen")
        }
        chat = client.post(
            "/v1/chat/completions",
            json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        listed = {m["id"]: m["live_workers"] for m in client.get("/v1/models").json()["data"]}
        log = process.log()
    finally:
        process.stop()
    assert all(job["status"] == "succeeded" for job in jobs.values()), jobs
    assert chat.status_code == 200 and chat.json()["model"] == "qwen", chat.text
    assert listed == {"llama": 1, "qwen": 1}
    # Each model's job ran on a worker of its own: the one that consumes that model's queue.
    assert jobs["llama"]["worker_id"] != jobs["qwen"]["worker_id"]
    for model in ("llama", "qwen"):
        assert f"{READY}: API http://127.0.0.1:{settings.port}, worker " in log
        assert f", model {model} on cpu" in log


def ready_line(log: str, model: str) -> str:
    return next(
        line for line in log.splitlines() if line.startswith(f"{READY}: ") and f" model {model} on " in line
    )


def test_a_model_added_to_the_list_is_served_after_a_restart_and_each_reports_its_weights(
    tiny_llama: Path, tiny_qwen2: Path, tiny_llama_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adding a model is editing the list and restarting (here a .gguf file: a tiny Llama's weights in
    Q8_0 and Q4_1 blocks, its config and tokenizer in its metadata, prepared once for the API and the
    worker). Each model's ready line and ``/v1/models`` entry say its weights as loaded."""
    monkeypatch.setenv("PAGEDQ_CACHE_DIR", str(tmp_path / "cache"))  # where the file's config is prepared
    gguf = tiny_llama_gguf
    two = [{"name": "llama", "source": str(tiny_llama)}, {"name": "qwen", "source": str(tiny_qwen2)}]
    settings = embedded_settings(tiny_llama, tmp_path).model_copy(update={"models": json.dumps(two)})
    body = {"prompt": "hello", "max_tokens": 4, "ignore_eos": True}
    process, client = start_up(settings, tmp_path / "up1.log")
    try:
        wait_for(
            lambda: process.log().count(f"{READY}: API") == 2, 30, "a ready line per model", interval=0.1
        )
        before = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        unknown = client.post("/v1/jobs", json=body | {"model": "llama-q"})
    finally:
        process.stop()
    assert unknown.status_code == 404, unknown.text

    three = [*two, {"name": "llama-q", "source": str(gguf / "model.gguf")}]  # quantization: gguf, its default
    settings = settings.model_copy(update={"models": json.dumps(three)})
    process, client = start_up(settings, tmp_path / "up2.log")
    try:
        wait_for(
            lambda: process.log().count(f"{READY}: API") == 3, 30, "a ready line per model", interval=0.1
        )
        job = client.post("/v1/jobs", json=body | {"model": "llama-q"}, headers={"Prefer": "wait=60"}).json()
        after = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        ready = client.get("/readyz").json()["models"]
        log = process.log()
    finally:
        process.stop()
    assert job["status"] == "succeeded" and job["model"] == "llama-q", job
    assert list(after) == ["llama", "qwen", "llama-q"]
    assert {name: m["live_workers"] for name, m in after.items()} == {"llama": 1, "qwen": 1, "llama-q": 1}
    assert {name: m["weights"] for name, m in ready.items()} == {
        name: m["weights"] for name, m in after.items()
    }

    # The float32 directory: every checkpoint tensor (q/k/v and gate/up fused) in float32, on the
    # batch-invariant kernels (the default).
    floats = load_file(tiny_llama / "model.safetensors")
    dense = {"types": {"F32": 15}, "bytes": 4 * sum(t.numel() for t in floats.values())}
    assert after["llama"]["weights"] == dense | {"kernels": "float32-invariant"}
    assert before["llama"]["weights"] == after["llama"]["weights"]
    assert "weights 15 F32 tensors" in ready_line(log, "llama")

    # The GGUF file: its tensors' own types and bytes (the blocks as stored), far less than float32.
    file = GGUFReader(gguf / "model.gguf")
    quantized = after["llama-q"]["weights"]
    assert quantized["types"] == Counter(t.tensor_type.name for t in file.tensors)
    assert set(quantized["types"]) == {"F32", "Q4_1", "Q8_0"}
    assert quantized["bytes"] == sum(int(t.n_bytes) for t in file.tensors) < dense["bytes"] / 2
    assert quantized["kernels"].startswith("gguf-float-fma-")
    types = " + ".join(f"{count} {name}" for name, count in quantized["types"].items())
    assert f"weights {types} tensors" in ready_line(log, "llama-q")
    assert f"on {quantized['kernels']} kernels" in ready_line(log, "llama-q")
