"""One definition of per-token times (#32 item 17): the library's ``metrics.token_times_ms`` and the
service's ``token_times_ms`` are both milliseconds since the run started, one per output token."""

import copy
from pathlib import Path

from contract.token_times import token_times_ms
from worker.engine import LLM, SamplingParams
from worker.results import JobResult


def test_the_library_and_the_service_give_the_same_times_for_the_same_run(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=16 << 20)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine = llm.engine
    engine.add_request("run", "The quick brown fox", params)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step()
    whole = copy.deepcopy(deltas[0])  # extend() folds into it
    for delta in deltas[1:]:
        whole.extend(delta)
    metrics = whole.metrics
    library = metrics.token_times_ms
    assert len(library) == 6 == len(whole.outputs[0].token_ids)
    assert library == sorted(library) and library[0] > 0
    assert library == [round((t - metrics.arrival_time) * 1000, 3) for t in metrics.token_times]

    # The service's run started at its claim; given the same start, its times are the library's.
    result = JobResult.of({}, started=metrics.arrival_time)
    for delta in deltas:  # deltas as the worker folds them, step by step
        result.fold(delta, lambda token: "")
    assert result.token_times_ms == library


def test_times_are_milliseconds_since_the_start_to_the_microsecond() -> None:
    assert token_times_ms([10.5, 10.7500004, 12.0], started=10.0) == [500.0, 750.0, 2000.0]
    assert token_times_ms([], started=1.0) == []
