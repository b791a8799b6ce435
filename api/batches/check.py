"""A batch file checked before any of it runs, a slice of lines at a time, in this process or in a pool.

Each line is parsed and checked (``api/batches/lines.py``), its prompt rendered and tokenized and its
length checked against the context (``api/prompts/encoder.py``), and its custom_id checked unique in the file.
That is Python and tokenizer work, a fifth of a millisecond a line on a slow core; with
``PAGEDQ_BATCH_PROCESSES`` set, slices are checked side by side in that many processes, each with its
own tokenizer, while this one writes the checked lines into the database as they come back.

A pool process sends a slice's checked lines as pickles of ``PICKLED_LINES`` lines each. Sent as one
pickle, a slice's 2,048 lines (some 16,000 lists, dicts and tuples) were unpickled by the pool's result
thread in one C call that held the GIL, and so the event loop, for its whole length and for the
collections its allocations set off: 20-30 ms a slice, 0.3-0.5 s with a full collection, which the
slices waiting unwritten made big. As bytes a slice is unpickled at once and holds no object the
collector walks; its lines are unpickled a piece (under a millisecond) at a time as they are written.
"""

import logging
import multiprocessing
import os
import pickle
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, NamedTuple

from api.batches.lines import BatchModel, LineError, read_lines
from api.prompts.encoder import ContextExceeded, PromptEncoder, PromptError
from contract.engine import EngineConfig
from contract.heap import freeze_startup_heap

logger = logging.getLogger(__name__)
SLICE_LINES = 2048


class CheckedLine(NamedTuple):
    """What a job row takes from its line (a plain tuple: it crosses processes cheaply)."""

    number: int
    custom_id: str
    prompt: str | None
    messages: list[dict[str, str]] | None
    prompt_token_ids: list[int] | list[list[int]]  # an embedding line's: one list per input
    params: dict[str, Any]
    meta: dict[str, str]


class BadLines(Exception):
    def __init__(self, errors: list[LineError]) -> None:
        super().__init__(f"{len(errors)} bad lines")
        self.errors = errors


PICKLED_LINES = 64  # lines a pickle: each unpickled in well under a millisecond
PickledSlice = tuple[list[bytes], list[LineError]]  # a slice's lines, PICKLED_LINES to a pickle


class Slice(NamedTuple):
    raw_lines: list[bytes]
    first_number: int
    endpoint: str
    model: BatchModel


def check_slice(encoder: PromptEncoder, task: Slice) -> tuple[list[CheckedLine], list[LineError]]:
    lines, errors = read_lines(*task)
    checked = []
    for line, result in zip(lines, encoder.encode_many([line.spec for line in lines]), strict=True):
        if isinstance(result, PromptError):
            code = "context_length_exceeded" if isinstance(result, ContextExceeded) else "invalid_prompt"
            errors.append(LineError(line.number, code, str(result), f"body.{result.field}"))
            continue
        spec = line.spec
        if line.fills_context:  # no max_tokens: what the context leaves, as OpenAI does
            spec.max_tokens = encoder.context_length - len(result)
        messages = [message.model_dump() for message in spec.messages] if spec.messages else None
        params = spec.engine_params(encoder.sampling_defaults)
        checked.append(
            CheckedLine(line.number, line.custom_id, spec.prompt, messages, result, params, spec.metadata)
        )
    return checked, errors


class BatchChecker:
    def __init__(self, encoder: PromptEncoder, model_dir: Path, engine: EngineConfig, processes: int) -> None:
        self.encoder = encoder
        self._pool_args = (processes, model_dir, engine)
        self._pool = _start_pool(*self._pool_args) if processes > 0 else None

    def check(self, content: bytes, endpoint: str, model: BatchModel) -> Iterator[CheckedLine]:
        """The file's lines, checked, in order, as their slices are done; raises ``BadLines`` (every bad
        line, by number) after the last slice if any line is bad, and yields no line after the first bad
        one (the caller's writes will be rolled back). A pool process that dies fails this check with
        ``BrokenProcessPool`` and is replaced with a new pool for the next."""
        raw_lines = content.splitlines()
        slices = (
            Slice(raw_lines[start : start + SLICE_LINES], start + 1, endpoint, model)
            for start in range(0, len(raw_lines), SLICE_LINES)
        )
        if self._pool is None:
            yield from unique(check_slice(self.encoder, task) for task in slices)
            return
        try:
            yield from unique(map(_unpickled, self._pool.map(_check_slice_here, slices)))
        except BrokenProcessPool:
            logger.error("a batch-checking process died; starting a new pool")
            self._pool = _start_pool(*self._pool_args)
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


def _start_pool(processes: int, model_dir: Path, engine: EngineConfig) -> ProcessPoolExecutor:
    pool = ProcessPoolExecutor(
        processes,
        mp_context=multiprocessing.get_context("spawn"),  # this process has threads: never fork it
        initializer=_load_encoder,
        initargs=(model_dir, engine),
    )
    for _ in range(processes):  # start them now: a process takes seconds to load its tokenizer
        pool.submit(_ready)
    return pool


def unique(results: Iterable[tuple[Iterable[CheckedLine], list[LineError]]]) -> Iterator[CheckedLine]:
    """The slices' good lines while no line is bad, each custom_id once; then ``BadLines`` if any was."""
    first_use: dict[str, int] = {}
    errors: list[LineError] = []
    for lines, slice_errors in results:
        errors += slice_errors
        for line in lines:
            if (first := first_use.setdefault(line.custom_id, line.number)) != line.number:
                message = f"custom_id {line.custom_id!r} is already used on line {first}"
                errors.append(LineError(line.number, "duplicate_custom_id", message))
            elif not errors:
                yield line
    if not first_use and not errors:
        errors.append(LineError(None, "empty_file", "the input file has no request lines"))
    if errors:
        raise BadLines(sorted(errors, key=lambda error: error.line or 0))


_encoder: PromptEncoder | None = None  # a pool process's own


def _load_encoder(model_dir: Path, engine: EngineConfig) -> None:
    global _encoder
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the pool is the parallelism: no threads per process
    _encoder = PromptEncoder(model_dir, engine)
    freeze_startup_heap()  # a slice's lines set off full collections of the tokenizer's heap: 0.15 s each


def _ready() -> None:
    """Nothing: submitted once per process to start it."""


def _check_slice_here(task: Slice) -> PickledSlice:
    assert _encoder is not None, "a pool process loads its encoder first"
    lines, errors = check_slice(_encoder, task)
    pieces = (lines[start : start + PICKLED_LINES] for start in range(0, len(lines), PICKLED_LINES))
    pickled = [pickle.dumps([tuple(line) for line in piece], pickle.HIGHEST_PROTOCOL) for piece in pieces]
    return pickled, errors


def _unpickled(result: PickledSlice) -> tuple[Iterator[CheckedLine], list[LineError]]:
    """The slice's lines, unpickled a piece at a time as they are taken."""
    pickled, errors = result
    return (CheckedLine._make(line) for piece in pickled for line in pickle.loads(piece)), errors
