"""An embedding job's stored vectors and OpenAI's response body made of them."""

import base64
from types import SimpleNamespace

import numpy as np
import pytest

from core.embeddings import embedding_body, pack

VECTORS = [[0.1, -2.5, 3e-8], [1.0, 0.0, -0.333333]]


@pytest.mark.fast
def test_vectors_are_stored_as_little_endian_float32_and_answered_as_floats_or_base64() -> None:
    stored = pack(VECTORS)
    assert stored == np.asarray(VECTORS, dtype="<f4").tobytes()
    job = SimpleNamespace(model="m", prompt_tokens=7, prompt_token_ids=[[1, 2], [3]], embeddings=stored)
    floats = embedding_body(job, "float")
    assert floats["usage"] == {"prompt_tokens": 7, "total_tokens": 7} and floats["model"] == "m"
    expected = np.asarray(VECTORS, dtype=np.float32).tolist()
    assert [item["embedding"] for item in floats["data"]] == expected
    assert [item["index"] for item in floats["data"]] == [0, 1]
    encoded = embedding_body(job, "base64")["data"]
    # as the openai SDK decodes it
    decoded = [
        np.frombuffer(base64.b64decode(item["embedding"]), dtype="float32").tolist() for item in encoded
    ]
    assert decoded == expected
