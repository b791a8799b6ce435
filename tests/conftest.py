import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from core.settings import Settings
from pagedq import cli
from tests.support.gguf_files import gguf_model_dir
from tests.support.jobs_client import Database
from tests.support.services import Process, database_from, migrated_template, redis_url
from tests.support.tiny_models import make_tiny_bert, make_tiny_model

torch.set_num_threads(max(1, os.cpu_count() or 1))

# A test's service serves the chat model it names alone (its processes inherit this), unless it names
# more: an embedding model (PAGEDQ_EMBED_MODEL) or a list (PAGEDQ_MODELS).
os.environ.setdefault("PAGEDQ_EMBED_MODEL", "")

# Triton kernels run in this process only on CUDA or under TRITON_INTERPRET=1; elsewhere
# tests/kernels/test_kernels_interpreted.py runs that module in a child process with the interpreter.
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    collect_ignore = ["test_kernels_triton.py"]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_llama_gguf(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_llama`` with its weights in Q8_0 and Q4_1 blocks: a directory whose ``model.gguf`` carries the
    config and tokenizer in its metadata too, so the file serves on its own."""
    return gguf_model_dir(
        tiny_llama, tmp_path_factory.mktemp("tiny-llama-gguf") / "m", ["Q8_0", "Q4_1"], metadata=True
    )


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


@pytest.fixture(scope="session")
def tiny_llama3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama 3.1's RoPE scaling, with an original context short enough that the scaling matters."""
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama3"), "llama", rope_parameters=rope)


@pytest.fixture(scope="session")
def tiny_mistral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-mistral"), "mistral", sliding_window=4096)


@pytest.fixture(scope="session")
def tiny_bert_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random sentence-transformers BERT (mean pooling, normalized, max_seq_length 48)."""
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert-model"))


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    with migrated_template() as name:
        yield name


@pytest.fixture
def service_settings(pg_template: str, tmp_path: Path, tiny_llama: Path) -> Iterator[Settings]:
    """Settings of a job service on a database of this test's own, the real Redis, and the tiny model.

    The model is reached through a uniquely named link, so this test's queue is its own.
    """
    model = tmp_path / f"tiny-{uuid.uuid4().hex[:8]}"
    model.symlink_to(tiny_llama, target_is_directory=True)
    with database_from(pg_template) as url:
        yield Settings(
            database_url=url,
            broker_url=redis_url(),
            model=str(model),
            data_dir=tmp_path / "data",
            device="cpu",
            dtype="float32",
            max_num_seqs=32,
            kv_cache_bytes=64 * 2**20,
            flush_interval=0.1,
            heartbeat_timeout=3.0,
            requeue_after=2.0,
            reconcile_interval=0.5,
            shutdown_grace=5.0,
        )


@pytest.fixture
def db(service_settings: Settings) -> Iterator[Database]:
    """Direct reads of the test's job tables."""
    database = Database(service_settings)
    yield database
    database.close()


@pytest.fixture(autouse=True)
def _keep_pytest_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pagedq.cli.main`` would point the root logger at one test's captured stderr, for every later test."""
    monkeypatch.setattr(cli, "configure_logging", lambda *_: None)


LOG_TAIL_CHARS = 6000
TEST_STARTED = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[TEST_STARTED] = time.time()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """A failing test's report ends with the last log lines of each pagedq service still running or
    started by the test: a service that stalls in CI shows why there, where nobody can look afterwards."""
    report = yield
    if report.failed:
        started = item.stash.get(TEST_STARTED, time.time())
        for process in Process.STARTED:
            if process.popen.poll() is None or process.started_at >= started:
                tail = process.log()[-LOG_TAIL_CHARS:]
                report.sections.append((f"pagedq {' '.join(process.args)} log ({process.log_path})", tail))
    return report
