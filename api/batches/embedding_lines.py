"""An embeddings batch file (``"url": "/v1/embeddings"``) checked before any of it runs: each line's body
read as ``POST /v1/embeddings`` reads one (api/embeddings/schemas.py), every line naming the same served
embedding model (one model per batch, as OpenAI), its inputs tokenized and checked by that model's
encoder (api/embeddings/encoder.py). In this process: an embedding model's tokenizer is fast, and a file
of embedding lines holds far fewer lines than a chat batch's tens of thousands.
"""

from api.batches.check import CheckedLine, unique
from api.batches.lines import EMBEDDINGS, LineError, envelope
from api.embeddings.encoder import EmbeddingInputError
from api.embeddings.schemas import BodyError, EmbeddingsBody, read_body
from api.http.problems import UnknownModel, WrongKind
from api.served_models import ServedModels
from core.served_models import ModelEntry

Read = tuple[int, str, EmbeddingsBody, list[str] | list[list[int]]]  # number, custom_id, body, inputs


def check_embedding_lines(models: ServedModels, content: bytes) -> tuple[str | None, list[CheckedLine]]:
    """The batch's model and its lines, checked, in order; raises ``BadLines`` naming every bad line."""
    read, errors = _read(content)
    entry = _model(models, read, errors)
    checked: list[CheckedLine] = []
    if entry is not None:
        encoder = models.embedder(entry.name)
        for number, custom_id, body, inputs in read:
            try:
                token_ids = encoder.encode(inputs, body.params())
            except EmbeddingInputError as error:
                errors.append(LineError(number, "invalid_value", str(error), f"body.{error.param}"))
                continue
            params = {"truncate_prompt_tokens": body.truncate_prompt_tokens, "dimensions": body.dimensions}
            params["encoding_format"] = body.encoding_format
            checked.append(CheckedLine(number, custom_id, None, None, token_ids, params, {}))
    return (entry.name if entry else None), list(unique([(checked, errors)]))


def _read(content: bytes) -> tuple[list[Read], list[LineError]]:
    read: list[Read] = []
    errors: list[LineError] = []
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            request = envelope(raw, EMBEDDINGS)
            body, inputs = read_body(request["body"])
        except LineError as error:
            error.line = number
            errors.append(error)
            continue
        except BodyError as error:
            param = f"body.{error.param}" if error.param else "body"
            errors.append(LineError(number, error.code, str(error), param))
            continue
        read.append((number, request["custom_id"], body, inputs))
    return read, errors


def _model(models: ServedModels, read: list[Read], errors: list[LineError]) -> ModelEntry | None:
    """The served embedding model the first good line names, each line naming another being an error."""
    if not read:
        return None
    first, name = read[0][0], read[0][2].model
    for number, _, body, _ in read[1:]:
        if body.model != name:
            message = f"model {body.model!r}: a batch's lines name one model, and line {first} names {name!r}"
            errors.append(LineError(number, "invalid_value", message, "body.model"))
    try:
        return models.embedding(name)
    except (UnknownModel, WrongKind) as error:
        errors.append(LineError(first, error.code, str(error), "body.model"))
        return None
