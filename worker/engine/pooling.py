"""Pooling: a model's token states into one vector per input (the packed batch's hidden states), as its
``Pooling`` (contract/pooling_files.py reads it from the model's files) says.
"""

import torch
import torch.nn.functional as F

from contract.pooling import PoolingMode


def pool(hidden: torch.Tensor, lens: list[int], mode: PoolingMode) -> torch.Tensor:
    """``[inputs, hidden]`` from the packed ``[tokens, hidden]`` states of inputs of ``lens`` tokens."""
    if mode == "mean":
        lengths = torch.tensor(lens, device=hidden.device)
        return torch.segment_reduce(hidden.float(), "mean", lengths=lengths)
    ends = torch.tensor(lens, device=hidden.device).cumsum(0)
    rows = ends - torch.tensor(lens, device=hidden.device) if mode == "cls" else ends - 1
    return hidden[rows].float()


def finish(vectors: torch.Tensor, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """Keep the first ``dimensions`` values (all without it), then scale to unit length if ``normalize``."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    return F.normalize(vectors, p=2.0, dim=-1) if normalize else vectors
