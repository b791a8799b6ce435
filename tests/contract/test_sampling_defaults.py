"""One rule for the sampling parameters a request leaves out, at every entry point: the model's
generation_config.json, else the contract's (``contract/sampling_defaults.py``). The API's side is in
tests/api/test_api.py; here the library's ``LLM`` and ``pagedq generate``."""

import json
from pathlib import Path

import pytest

from contract.sampling import SamplingParams
from pagedq import cli
from worker.engine import LLM

PROMPTS = ["Paged attention stores keys", "The quick brown fox", "def add(a, b):", "Continuous batching"]


def with_generation_config(tiny_llama: Path, where: Path, **config: object) -> Path:
    """The tiny model with ``config`` as its generation_config.json."""
    where.mkdir()
    for part in tiny_llama.iterdir():
        if part.name != "generation_config.json":
            (where / part.name).symlink_to(part)
    (where / "generation_config.json").write_text(json.dumps(config))
    return where


@pytest.fixture(scope="module")
def greedy_model(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model whose card asks for greedy decoding, and for top_p 0.5 (which greedy ignores)."""
    return with_generation_config(
        tiny_llama, tmp_path_factory.mktemp("m") / "greedy", temperature=0.0, top_p=0.5
    )


@pytest.fixture(scope="module")
def llm(greedy_model: Path) -> LLM:
    return LLM(str(greedy_model), device="cpu", kv_cache_bytes=4 << 20)


def texts(llm: LLM, prompts: list[str], params: SamplingParams | None = None) -> list[str]:
    return [out.outputs[0].text for out in llm.generate(prompts, params)]


@pytest.mark.fast
def test_the_library_fills_what_is_left_out_from_the_models_generation_config(llm: LLM) -> None:
    assert llm.sampling_params() == SamplingParams(temperature=0.0, top_p=0.5)
    given = llm.sampling_params(temperature=0.7, max_tokens=5)
    assert (given.temperature, given.top_p, given.max_tokens) == (0.7, 0.5, 5)
    beams = llm.sampling_params(use_beam_search=True, n=2, temperature=0.0)
    assert beams.top_p == 1.0  # beam search takes none of the model's defaults
    greedy = SamplingParams(temperature=0.0, top_p=0.5)
    assert texts(llm, PROMPTS) == texts(llm, PROMPTS, greedy)  # no SamplingParams: the model's


def test_generate_on_the_command_line_takes_the_models_defaults_and_its_own_flags(
    llm: LLM, greedy_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDQ_KV_CACHE_BYTES", str(4 << 20))  # the engine's settings apply to it

    def generated(*flags: str) -> list[str]:
        command = ["generate", "--model", str(greedy_model), "--device", "cpu", "--json", *flags, *PROMPTS]
        assert cli.main(command) == 0
        return [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]

    greedy = SamplingParams(temperature=0.0, max_tokens=128)  # 128 tokens unless told
    assert generated() == texts(llm, PROMPTS, greedy)
    sampled = SamplingParams(temperature=1.0, top_p=0.5, seed=3, max_tokens=8)
    assert generated("--max-tokens", "8", "--temperature", "1", "--seed", "3") == texts(llm, PROMPTS, sampled)
