import os
from pathlib import Path

import pytest
import torch

from tests.tiny_models import make_tiny_model

torch.set_num_threads(max(1, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


@pytest.fixture(scope="session")
def tiny_llama3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama 3.1's RoPE scaling, with an original context short enough that the scaling matters."""
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama3"), "llama", rope_parameters=rope)


@pytest.fixture(scope="session")
def tiny_mistral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-mistral"), "mistral", sliding_window=4096)
