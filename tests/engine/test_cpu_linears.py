"""CPU float32 linears: the batch-invariant C++ kernel by default; with ``batch_invariant=False`` oneDNN's
private ops, only once these are seen to work: tried on a tiny tensor at start, and where they fail or
disagree with ``F.linear``, the model keeps ``nn.Linear``."""

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.support.tiny_models import make_tiny_model
from worker.engine import LLM, SamplingParams
from worker.engine.model import cpu_linears

pytestmark = pytest.mark.fast

REAL = torch.ops.mkldnn._linear_pointwise


def changed_signature(*args: object) -> torch.Tensor:
    raise RuntimeError("mkldnn::_linear_pointwise() Expected a value of type 'str' for argument 'attr'")


def off(*args: object) -> torch.Tensor:
    return REAL(*args) + 1e-2


@pytest.fixture(autouse=True)
def _tried_afresh() -> Iterator[None]:
    cpu_linears.onednn_works.cache_clear()
    yield
    cpu_linears.onednn_works.cache_clear()  # later tests try the real ops


def kinds(llm: LLM) -> set[str]:
    return {type(m).__name__ for m in llm.engine.runner.model.modules() if not list(m.children())}


@pytest.mark.parametrize("op", [changed_signature, off], ids=["failing", "disagreeing"])
def test_the_model_keeps_f_linear_when_the_onednn_ops_misbehave(
    op: Callable[..., torch.Tensor],
    tiny_llama: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", op)
    with caplog.at_level(logging.WARNING, logger="pagedq.engine"):
        llm = LLM(str(tiny_llama), device="cpu", kv_cache_bytes=4 << 20, batch_invariant=False)
        [out] = llm.generate(["The quick brown fox"], SamplingParams(temperature=0.0, max_tokens=4))
        LLM(
            str(tiny_llama), device="cpu", kv_cache_bytes=4 << 20, batch_invariant=False
        )  # a second model: tried once per process
    assert "Linear" in kinds(llm) and "OneDNNLinear" not in kinds(llm)
    assert out.outputs[0].token_ids
    [warning] = [r for r in caplog.records if "oneDNN" in r.getMessage()]
    reason = "RuntimeError: mkldnn::_linear_pointwise()" if op is changed_signature else "differ from F"
    assert "running F.linear" in warning.getMessage() and reason in warning.reason


def test_the_onednn_ops_are_used_where_they_work(tiny_llama: Path) -> None:
    assert cpu_linears.onednn_works()
    llm = LLM(str(tiny_llama), device="cpu", kv_cache_bytes=4 << 20, batch_invariant=False)
    assert "OneDNNLinear" in kinds(llm) and not llm.engine.runner.batch_invariant


def test_the_batch_invariant_kernel_is_the_default(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), device="cpu", kv_cache_bytes=4 << 20)
    assert kinds(llm) >= {"InvariantLinear"} and not kinds(llm) & {"Linear", "OneDNNLinear"}
    assert llm.engine.runner.batch_invariant


def test_a_tied_lm_head_multiplies_the_embedding_as_it_is(tmp_path: Path) -> None:
    """Packing (where the CPU's kernel wants it) makes a copy: not of the tied vocabulary projection."""
    tied = make_tiny_model(tmp_path / "tied", tie_word_embeddings=True)
    model = LLM(str(tied), device="cpu", kv_cache_bytes=4 << 20).engine.runner.model
    assert not model.lm_head.packed
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    layer = model.layers[0].mlp.down_proj
    assert layer.packed == torch.ops.pagedq_cpu.packs_invariant_linear()


def test_a_misbehaving_post_op_keeps_f_linear_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder's fused GELU and residual add are tried with the plain op."""
    monkeypatch.setattr(cpu_linears.OneDNNLinear, "gelu", lambda self, x: torch.nn.functional.relu(self(x)))
    assert not cpu_linears.onednn_works()


def test_fused_post_ops_equal_their_unfused_forms() -> None:
    linear = torch.nn.Linear(32, 48)
    x, other = torch.randn(5, 32), torch.randn(5, 48)
    packed = cpu_linears.OneDNNLinear(linear)
    with torch.inference_mode():
        torch.testing.assert_close(cpu_linears.linear_gelu(packed, x), torch.nn.functional.gelu(linear(x)))
        torch.testing.assert_close(cpu_linears.linear_add(packed, x, other), linear(x) + other)
        assert torch.equal(cpu_linears.linear_add(linear, x, other), linear(x) + other)
