"""OpenAI's online API and the classic /generate, through ``pagedq api`` and ``pagedq worker`` processes
on the real PostgreSQL and Redis, driven by the official ``openai`` SDK and by curl."""

import json
import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from core.settings import Settings
from tests.support.jobs_client import Database, start_worker
from tests.support.services import Process, database_from, free_port, redis_url, service_env, wait_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def service(
    pg_template: str, tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """A real API (two processes on one port) and worker, as users start them."""
    tmp = tmp_path_factory.mktemp("openai")
    model = tmp / f"tiny-{uuid.uuid4().hex[:8]}"
    model.symlink_to(tiny_llama, target_is_directory=True)
    with database_from(pg_template) as url:
        settings = Settings(
            database_url=url,
            broker_url=redis_url(),
            model=str(model),
            embed_model="",  # the tiny chat model alone: /readyz waits for a worker of each model
            data_dir=tmp,
            port=free_port(),
            device="cpu",
            dtype="float32",
            kv_cache_bytes=64 * 2**20,
            flush_interval=0.1,
            api_workers=2,
        )
        db = Database(settings)
        worker = start_worker(settings, db, tmp / "worker.log")
        api = Process(["api"], service_env(settings), tmp / "api.log")
        try:
            wait_for(lambda: _ready(settings), 60, "the API to be ready", interval=0.2)
            yield settings
        finally:
            assert api.stop() == 0, api.log()[-3000:]  # SIGTERM stops every API process cleanly
            worker.stop()
            db.close()


def _ready(settings: Settings) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{settings.port}/readyz").status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def client(service: Settings) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{service.port}/v1", api_key="unused", max_retries=0)


def job_of(service: Settings, completion_id: str) -> dict:
    job_id = "job_" + completion_id.split("-", 1)[1]
    return httpx.get(f"http://127.0.0.1:{service.port}/v1/jobs/{job_id}").json()


def test_the_api_runs_as_several_processes(service: Settings, client: openai.OpenAI) -> None:
    def started() -> int:
        return (service.data_dir / "api.log").read_text().count('"message": "Started server process')

    wait_for(lambda: started() >= 2, 60, "the second API process to start", interval=0.2)
    assert started() == 2
    for i in range(6):  # the kernel spreads connections over both processes; each must serve them
        fresh = openai.OpenAI(base_url=str(client.base_url), api_key="unused", max_retries=0)
        completion = fresh.completions.create(
            model=service.served_model_name,
            prompt=f"Count {i}",
            max_tokens=2,
            extra_body={"ignore_eos": True},
        )
        assert completion.usage is not None and completion.usage.completion_tokens == 2


def test_chat_completion_is_a_job_with_timings(service: Settings, client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=service.served_model_name,
        messages=[{"role": "user", "content": "Name three rivers."}],
        max_tokens=12,
        temperature=0,
    )
    job = job_of(service, completion.id)
    assert completion.object == "chat.completion" and completion.model == service.served_model_name
    assert completion.choices[0].message.content == job["output"] and job["status"] == "succeeded"
    assert completion.usage.completion_tokens == len(job["timings"]["token_times_ms"]) == 12
    assert completion.usage.prompt_tokens == job["usage"]["prompt_tokens"] > 0


def test_streamed_chat_completion_adds_up_to_the_job(service: Settings, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=service.served_model_name,
        messages=[{"role": "user", "content": "Count to ten."}],
        max_tokens=200,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    job = job_of(service, chunks[0].id)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 5
    assert text == job["output"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 200


def test_completions_with_n_samples(service: Settings, client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model=service.served_model_name, prompt="The quick brown fox", max_tokens=8, n=2, seed=3
    )
    assert completion.object == "text_completion" and len(completion.choices) == 2
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.usage.completion_tokens == sum(
        c["completion_tokens"] for c in job_of(service, completion.id)["choices"]
    )


def test_models_list_names_the_served_model(service: Settings, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [service.served_model_name]


def test_unsupported_openai_fields_are_a_clear_400(service: Settings, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=service.served_model_name,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"frobnicate": True},
        )
    assert error.value.status_code == 400 and "frobnicate" in str(error.value)
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(
            model=service.served_model_name,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )


def test_the_readme_generate_calls_work(service: Settings) -> None:
    readme = (REPO / "README.md").read_text()
    calls = [line for line in readme.splitlines() if line.startswith("curl") and "/generate" in line]
    assert len(calls) == 3
    answers = []
    for call in calls:
        argv = shlex.split(call.replace("localhost:8000", f"127.0.0.1:{service.port}"))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        answers.append(json.loads(done.stdout))
    prompts = [json.loads(re.search(r"-d '(.*)'", call).group(1)) for call in calls]
    for prompt, answer in zip(prompts, answers, strict=True):
        assert len(answer["text"]) == prompt.get("n", 1)
        assert all(text.startswith(prompt["prompt"]) for text in answer["text"])


def test_a_streaming_client_that_disconnects_cancels_its_job(service: Settings) -> None:
    url = f"http://127.0.0.1:{service.port}/v1/completions"
    body = {
        "prompt": "Once upon a time",
        "max_tokens": 900,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
    job_id = "job_" + json.loads(first.removeprefix("data: "))["id"].split("-", 1)[1]
    base = f"http://127.0.0.1:{service.port}"
    wait_for(lambda: httpx.get(f"{base}/v1/jobs/{job_id}").json()["status"] == "cancelled", 10, "the cancel")
    job = httpx.get(f"{base}/v1/jobs/{job_id}").json()
    assert job["usage"]["completion_tokens"] < 900

    def engine_idle() -> bool:
        metrics = httpx.get(f"{base}/metrics").text
        return bool(re.search(r"pagedq_engine_kv_cache_usage_ratio\{[^}]*\} 0\.0", metrics))

    wait_for(engine_idle, 10, "the engine to free the job's blocks")


def test_logprobs_are_the_engines_in_openai_shapes(service: Settings, client: openai.OpenAI) -> None:
    from worker.engine import LLM, SamplingParams

    messages = [{"role": "user", "content": "Say something."}]
    chat = client.chat.completions.create(
        model=service.served_model_name,
        messages=messages,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    text = client.completions.create(
        model=service.served_model_name, prompt="The quick brown fox", max_tokens=6, temperature=0, logprobs=2
    )
    llm = LLM(service.model, device="cpu", dtype="float32", kv_cache_bytes=64 * 2**20)
    [want] = llm.chat([messages], SamplingParams(temperature=0, max_tokens=6, logprobs=3))
    sample = want.outputs[0]
    content = chat.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(
        [lp[t] for lp, t in zip(sample.logprobs, sample.token_ids, strict=True)]
    )
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)
    assert len(content) == chat.usage.completion_tokens
    logprobs = text.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 6
    assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0
    with pytest.raises(openai.BadRequestError, match="without stream"):
        client.chat.completions.create(
            model=service.served_model_name, messages=messages, logprobs=True, stream=True
        )
