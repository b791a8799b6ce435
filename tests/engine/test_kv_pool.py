"""The CPU KV pool: sized to what the seats can use, and costing RAM only as its blocks are written."""

from pathlib import Path

import pytest
import torch

from worker.engine import LLM, SamplingParams
from worker.engine.model_runner import zeroed

pytestmark = pytest.mark.fast


def resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def test_the_cpu_default_holds_every_seat_at_full_context_and_no_more(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), device="cpu", dtype="float32", max_num_seqs=3)
    runner = llm.engine.runner

    assert runner.max_model_len == 1024
    assert runner.num_blocks == 3 * 1024 // 16
    out = llm.generate(["hello"] * 3, SamplingParams(max_tokens=4, temperature=0))
    assert [len(o.outputs[0].token_ids) for o in out] == [4, 4, 4]


def test_the_cpu_pool_reads_as_zeros_and_is_not_resident_until_written() -> None:
    before = resident_bytes()
    pool = zeroed((2, 4, 1 << 25), torch.float32, torch.device("cpu"))  # 1 GiB
    assert resident_bytes() - before < 64 << 20

    assert pool.shape == (2, 4, 1 << 25) and pool.is_contiguous()
    assert not pool[1, 3, -4096:].any()
    pool[0, 0, :1024] = 1.0
    assert pool[0, 0, :4096].sum().item() == 1024.0
    assert resident_bytes() - before < 64 << 20
