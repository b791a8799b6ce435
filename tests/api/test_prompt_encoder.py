"""Where a job's prompt is tokenized: a short one on the event loop, the rest in the encoder's thread, and
never on the loop while another thread holds the tokenizer (``PromptEncoder.encode_soon``)."""

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.prompts.encoder import INLINE_CHARS, PromptEncoder
from contract.engine import EngineConfig
from core.spec import JobSpec

SHORT = JobSpec(prompt="The quick brown fox jumps over the lazy dog.", max_tokens=4)
LONG = JobSpec(prompt="fox " * (INLINE_CHARS // 4 + 1), max_tokens=4)


@pytest.fixture
def encoder(tiny_llama: Path) -> Iterator[PromptEncoder]:
    """An encoder whose ``encoding_threads`` lists the thread of each ``encode``."""
    encoder = PromptEncoder(tiny_llama, EngineConfig(max_model_len=4096))
    threads: list[str] = []
    encode = encoder.encode

    def recorded(spec: JobSpec) -> list[int]:
        threads.append(threading.current_thread().name)
        return encode(spec)

    encoder.encode = recorded  # type: ignore[method-assign]
    encoder.encoding_threads = threads  # type: ignore[attr-defined]
    yield encoder
    encoder.close()


def test_a_short_prompt_is_tokenized_on_the_loop_and_a_long_one_in_the_encoders_thread(
    encoder: PromptEncoder,
) -> None:
    short, long = asyncio.run(encoder.encode_soon(SHORT)), asyncio.run(encoder.encode_soon(LONG))

    loop_thread = threading.current_thread().name  # asyncio.run's loop runs here
    assert encoder.encoding_threads == [loop_thread, encoder.encoding_threads[1]]  # type: ignore[attr-defined]
    assert encoder.encoding_threads[1].startswith("tokenize")  # type: ignore[attr-defined]
    assert short == encoder.tokenizer.encode(SHORT.prompt) and len(long) > INLINE_CHARS // 4


def test_the_loop_never_waits_for_a_tokenizer_another_thread_holds(encoder: PromptEncoder) -> None:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with encoder._lock:
            held.set()
            release.wait(timeout=10)  # the test's end releases it; a loop blocked here fails, not hangs

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(timeout=10)

    async def submit_while_held() -> tuple[bool, list[int]]:
        task = asyncio.create_task(encoder.encode_soon(SHORT))
        done, _ = await asyncio.wait({task}, timeout=0.2)  # the loop goes on meanwhile
        release.set()
        return bool(done), await task

    finished_while_held, ids = asyncio.run(submit_while_held())
    holder.join()

    assert not finished_while_held  # it waited in the encoder's thread, not on the loop
    assert encoder.encoding_threads[0].startswith("tokenize")  # type: ignore[attr-defined]
    assert ids == encoder.tokenizer.encode(SHORT.prompt)
