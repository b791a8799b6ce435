"""An embedding job's vectors as stored (``jobs.embeddings``: float32, little-endian, one vector after
another) and as OpenAI answers them (``{"object": "list", "data": [{"object": "embedding", ...}]}``), for
the online route (the API) and batch output files (the worker) alike.

``base64`` is the stored bytes of each vector, base64-encoded: what OpenAI sends and its SDK decodes
(``np.frombuffer(base64.b64decode(s), dtype="float32")``).
"""

import base64
import struct
from typing import Any, Literal, Protocol

EMBEDDINGS_ENDPOINT = "/v1/embeddings"
EncodingFormat = Literal["float", "base64"]


def pack(vectors: list[list[float]]) -> bytes:
    values = [value for vector in vectors for value in vector]
    return struct.pack(f"<{len(values)}f", *values)


def unpack(stored: bytes, count: int) -> list[bytes]:
    """The ``count`` vectors' bytes (each float32, little-endian)."""
    size = len(stored) // count if count else 0
    return [stored[i * size : (i + 1) * size] for i in range(count)]


def floats(vector: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(vector) // 4}f", vector))


class EmbeddedJob(Protocol):
    """What an embeddings response is made of: a ``Job`` or a row of its columns."""

    model: str
    prompt_tokens: int
    prompt_token_ids: Any  # one list of ids per input
    embeddings: bytes | None


def embedding_body(job: EmbeddedJob, encoding_format: EncodingFormat = "float") -> dict[str, Any]:
    vectors = unpack(job.embeddings or b"", len(job.prompt_token_ids))
    encode = floats if encoding_format == "float" else (lambda v: base64.b64encode(v).decode("ascii"))
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode(vector)}
            for i, vector in enumerate(vectors)
        ],
        "model": job.model,
        "usage": {"prompt_tokens": job.prompt_tokens, "total_tokens": job.prompt_tokens},
    }
