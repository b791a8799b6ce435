"""The served models as the API knows them (``core/served_models.py``'s list): each one's entry and queue,
for a generate model its prompt encoder and batch checker, for an embedding model its embedding encoder
(api/embeddings/encoder.py), loaded once, on first use, and kept."""

import threading
from collections.abc import Callable
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from api.batches.check import BatchChecker
from api.embeddings.encoder import EmbeddingEncoder
from api.http.problems import UnknownModel, WrongKind
from api.prompts.encoder import PromptEncoder
from core.queue import queue_name
from core.served_models import ModelEntry, default_model, kind_problem, served_models
from core.settings import Settings

Locate = Callable[[ModelEntry], Path]  # a model's Hugging Face directory (pagedq/serve.py resolves built-ins)


def source_dir(entry: ModelEntry) -> Path:
    return Path(entry.source).expanduser()


class ServedModels:
    def __init__(self, settings: Settings, locate: Locate = source_dir) -> None:
        self.entries = served_models(settings)
        self._by_name = {entry.name: entry for entry in self.entries}
        self.default_chat = default_model(settings).name  # what a request that names no model runs on
        self._engine, self._processes = settings.engine_config(), settings.batch_processes
        self._locate = locate
        self._encoders: dict[str, PromptEncoder] = {}
        self._checkers: dict[str, BatchChecker] = {}
        self._embedders: dict[str, EmbeddingEncoder] = {}
        self._lock = threading.Lock()
        if self._by_name[self.default_chat].kind == "generate":
            # at start: a model that cannot load stops the API at once, and the first batch does not
            # wait seconds for the checking processes to load their tokenizers
            self.checker(self.default_chat)

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def entry(self, name: str | None) -> ModelEntry:
        """The served model called ``name`` (None: the default chat model); ``UnknownModel`` if none is."""
        entry = self._by_name.get(self.default_chat if name is None else name)
        if entry is None:
            raise UnknownModel(str(name), self.names)
        return entry

    def generating(self, name: str | None) -> ModelEntry:
        """``entry(name)``, refused (``WrongKind``) unless it generates text."""
        entry = self.entry(name)
        if entry.kind != "generate":
            raise WrongKind(
                f"model {entry.name!r} is of kind {entry.kind!r}: it makes embeddings (POST /v1/embeddings), "
                "not completions; generate models here: "
                + ", ".join(e.name for e in self.entries if e.kind == "generate")
            )
        return entry

    def embedding(self, name: str) -> ModelEntry:
        """``entry(name)``, refused (``WrongKind``) unless it embeds."""
        entry = self.entry(name)
        if problem := kind_problem(entry, "embed"):
            raise WrongKind(problem)
        return entry

    def embedder(self, name: str) -> EmbeddingEncoder:
        """The embedding model's encoder: its tokenizer loaded on first use (blocks: call it off the event
        loop), then kept."""
        entry = self.embedding(name)
        with self._lock:
            if name not in self._embedders:
                self._embedders[name] = EmbeddingEncoder(self._locate(entry))
            return self._embedders[name]

    def queue(self, name: str) -> str:
        return queue_name(self.entry(name).name)

    def encoder(self, name: str) -> PromptEncoder:
        """The generate model's encoder: loaded (seconds) on first use, then kept."""
        if (encoder := self._encoders.get(name)) is not None:
            return encoder
        entry = self.generating(name)
        with self._lock:
            if name not in self._encoders:
                self._encoders[name] = PromptEncoder(self._locate(entry), entry.engine_config(self._engine))
            return self._encoders[name]

    async def loaded_encoder(self, name: str) -> PromptEncoder:
        """``encoder(name)``, loading it off the event loop the first time."""
        return self._encoders.get(name) or await run_in_threadpool(self.encoder, name)

    def checker(self, name: str) -> BatchChecker:
        """The generate model's batch checker (its pool of processes, each with the model's encoder)."""
        encoder = self.encoder(name)
        with self._lock:
            if name not in self._checkers:
                model_dir = self._locate(self.entry(name))
                self._checkers[name] = BatchChecker(encoder, model_dir, encoder.engine, self._processes)
            return self._checkers[name]

    def close(self) -> None:
        """Stops the checkers' pools and the encoders' threads."""
        with self._lock:
            for checker in self._checkers.values():
                checker.close()
            for encoder in [*self._encoders.values(), *self._embedders.values()]:
                encoder.close()
