"""Where a job's prompt is tokenized: a short one on the event loop, the rest in the encoder's thread
(``PromptEncoder.encode_soon``; never on the loop while another thread holds the tokenizer: the test of
that is test_hostile_input's, through the API)."""

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.prompts.encoder import INLINE_CHARS, MESSAGE_CHARS, PromptEncoder
from contract.engine import EngineConfig
from core.spec import JobSpec

SHORT = JobSpec(prompt="The quick brown fox jumps over the lazy dog.", max_tokens=4)
LONG = JobSpec(prompt="fox " * (INLINE_CHARS // 4 + 1), max_tokens=4)
# Short text, but many messages for the template to render: not on the loop either.
TURNS = [
    {"role": ("user", "assistant")[i % 2], "content": "hi"} for i in range(INLINE_CHARS // MESSAGE_CHARS + 1)
]
MANY = JobSpec(messages=TURNS, max_tokens=4)


@pytest.fixture
def encoder(tiny_llama: Path) -> Iterator[tuple[PromptEncoder, list[str]]]:
    """An encoder, and the thread of each of its ``encode`` calls."""
    encoder = PromptEncoder(tiny_llama, EngineConfig(max_model_len=4096))
    threads: list[str] = []
    encode = encoder.encode

    def recorded(spec: JobSpec) -> list[int]:
        threads.append(threading.current_thread().name)
        return encode(spec)

    encoder.encode = recorded  # type: ignore[method-assign]
    yield encoder, threads
    encoder.close()


def test_a_short_prompt_is_tokenized_on_the_loop_a_long_one_or_a_long_chat_in_the_encoders_thread(
    encoder: tuple[PromptEncoder, list[str]],
) -> None:
    prompts, threads = encoder
    short, long = asyncio.run(prompts.encode_soon(SHORT)), asyncio.run(prompts.encode_soon(LONG))
    many = asyncio.run(prompts.encode_soon(MANY))

    loop_thread = threading.current_thread().name  # asyncio.run's loop runs here
    first, *others = threads
    assert first == loop_thread and len(others) == 2
    assert all(thread.startswith("tokenize") for thread in others)
    assert short == prompts.tokenizer.encode(SHORT.prompt) and len(long) > INLINE_CHARS // 4 and many


def test_a_short_prompt_or_chat_is_tokenized_holding_the_gil(
    encoder: tuple[PromptEncoder, list[str]],
) -> None:
    """On the event loop, tokenizing must not let the GIL go: taking it back from a thread that runs
    Python waits out the switch interval (made 1 s here; 5 ms by default), and the loop with it. The
    longest prompt the loop tokenizes (``INLINE_CHARS``) too."""
    prompts, _ = encoder
    chat = JobSpec(messages=[{"role": "user", "content": "Tell me about the fox."}], max_tokens=4)
    longest = JobSpec(prompt="fox " * (INLINE_CHARS // 4), max_tokens=4)
    expected = prompts.encode(SHORT), prompts.encode(chat), prompts.encode(longest)
    spinning, stop = threading.Event(), threading.Event()

    def spin() -> None:
        spinning.set()
        while not stop.is_set():
            pass

    interval, thread = sys.getswitchinterval(), threading.Thread(target=spin)
    sys.setswitchinterval(1.0)
    try:
        thread.start()
        spinning.wait()
        started = time.perf_counter()
        tokenized = prompts.encode(SHORT), prompts.encode(chat), prompts.encode(longest)
        took = time.perf_counter() - started
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert tokenized == expected and expected[1] and len(expected[2]) >= INLINE_CHARS // 4
    assert took < 0.5, f"tokenizing let the GIL go: {took:.2f} s"
