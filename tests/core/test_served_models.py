"""The deployment's list of models: parsed from inline JSON or a models file, defaults, refusals."""

import json
import re
from pathlib import Path

import pytest

from contract.engine import DEFAULT_EMBED_MODEL, DEFAULT_MODEL, EngineConfig
from core.served_models import ModelsError, model_named, parse_models, served_models
from core.settings import Settings

pytestmark = pytest.mark.fast


def test_unset_serves_the_chat_model_and_the_embedding_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDQ_EMBED_MODEL", raising=False)  # tests/conftest.py's one-model default
    entries = served_models(Settings(models="", model=DEFAULT_MODEL, quantization="gguf", max_num_seqs=8))
    assert [(e.name, e.kind) for e in entries] == [
        (DEFAULT_MODEL, "generate"),
        (DEFAULT_EMBED_MODEL, "embed"),
    ]
    assert (entries[0].quantization, entries[0].seats) == ("gguf", 8)


def test_an_empty_embed_model_serves_the_chat_model_alone(tmp_path: Path) -> None:
    entries = served_models(Settings(models="", model=str(tmp_path / "my-llama/"), embed_model=""))
    assert [(e.name, e.source) for e in entries] == [("my-llama", str(tmp_path / "my-llama/"))]


def test_inline_json_and_a_toml_file_say_the_same(tmp_path: Path) -> None:
    inline = parse_models(
        '[{"name": "chat", "source": "smollm2-135m-instruct", "quantization": "gguf", "workers": 2},'
        ' {"name": "minilm", "source": "all-minilm-l6-v2", "kind": "embed", "seats": 64}]'
    )
    toml = tmp_path / "models.toml"
    toml.write_text(
        '[[models]]\nname = "chat"\nsource = "smollm2-135m-instruct"\nquantization = "gguf"\nworkers = 2\n\n'
        '[[models]]\nname = "minilm"\nsource = "all-minilm-l6-v2"\nkind = "embed"\nseats = 64\n'
    )
    assert parse_models(str(toml)) == inline
    assert served_models(Settings(models=str(toml)))[1].kind == "embed"


def test_an_entry_shapes_the_engine_it_runs_on() -> None:
    entry = parse_models(
        '{"models": [{"name": "m", "source": "/w/m-q8", "quantization": "gguf", "seats": 4}]}'
    )[0]
    config = entry.engine_config(EngineConfig(max_num_batched_tokens=512))
    assert (config.model, config.quantization, config.max_num_seqs, config.max_num_batched_tokens) == (
        "/w/m-q8",
        "gguf",
        4,
        512,
    )


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("[]", "empty"),
        ('[{"name": "a", "source": "x"}, {"name": "a", "source": "y"}]', "listed more than once: a"),
        ('[{"name": "a", "source": "x", "kind": "rerank"}]', "0.kind"),
        ('[{"name": "a", "source": "x", "seat": 3}]', "0.seat"),
        ('[{"name": "a b", "source": "x"}]', "0.name"),
        ("[{", "not valid JSON"),
        ("/nowhere/models.toml", "cannot be read"),
    ],
)
def test_a_bad_list_is_refused_naming_the_entry_and_field(value: str, says: str) -> None:
    with pytest.raises(ModelsError, match=says):
        parse_models(value)


def test_a_bad_toml_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "models.toml"
    bad.write_text("[[models]\n")
    with pytest.raises(ModelsError, match=f"{bad}: not valid TOML"):
        parse_models(str(bad))


def test_a_model_is_found_by_its_served_name() -> None:
    settings = Settings(
        models='[{"name": "a", "source": "x"}, {"name": "b", "source": "y", "kind": "embed"}]'
    )
    assert model_named(settings, "b").source == "y"
    with pytest.raises(ModelsError, match="served: a, b"):
        model_named(settings, "c")


def test_the_readmes_models_file_reads_as_written(tmp_path: Path) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = re.search(r"```toml\n(.*?)```", readme[readme.index("## Several models") :], re.S)
    assert example, "the README's Several models section has no TOML example"
    path = tmp_path / "models.toml"
    path.write_text(example.group(1))
    entries = parse_models(str(path))
    assert [(e.name, e.kind, e.workers, e.seats) for e in entries] == [
        ("chat", "generate", 2, None),
        ("llama-8b", "generate", 1, 64),
        ("all-minilm-l6-v2", "embed", 1, None),
    ]


def test_a_gguf_file_source_serves_its_weights_as_they_are_and_a_bad_one_is_a_config_error(
    tmp_path: Path,
) -> None:
    good = tmp_path / "model.Q4_1.gguf"
    good.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    [entry] = parse_models(f'[{{"name": "q", "source": "{good}"}}]')
    assert entry.quantization == "gguf" and entry.engine_config(EngineConfig()).quantization == "gguf"
    chat = served_models(Settings(models="", model=str(good), embed_model=""))
    assert [(e.source, e.quantization) for e in chat] == [(str(good), "gguf")]

    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + bytes(16))
    refusals = {
        f'[{{"name": "q", "source": "{tmp_path}/missing.gguf"}}]': "the file cannot be read: No such file",
        f'[{{"name": "q", "source": "{not_gguf}"}}]': "not a GGUF file",
        f'[{{"name": "q", "source": "{good}", "quantization": "none"}}]': "quantization 'gguf' (its default)",
        f'[{{"name": "q", "source": "{good}", "kind": "embed"}}]': "serves kind 'generate', not 'embed'",
    }
    for value, says in refusals.items():
        source = json.loads(value)[0]["source"]
        where = re.escape(f"PAGEDQ_MODELS: 0: source '{source}': ")
        with pytest.raises(ModelsError, match=rf"^{where}.*{re.escape(says)}"):
            parse_models(value)
    with pytest.raises(ModelsError, match=r"^PAGEDQ_MODEL: the model: source '.*missing.gguf': the file"):
        served_models(Settings(models="", model=str(tmp_path / "missing.gguf"), embed_model=""))
