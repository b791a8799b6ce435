"""Sampling defaults: what a request runs with for the parameters it leaves out, at every entry point
(the API's routes and batch lines, ``pagedq generate``, the library's ``LLM``).

The model's own where its ``generation_config.json`` sets them (the parameters vLLM takes from there
with ``generation_config="auto"``, its default), else the contract's (``SamplingParams``' defaults). Beam
search is deterministic and takes none of the model's.
"""

import json
from pathlib import Path
from typing import Any

from contract.sampling import ContractError, SamplingParams

# What a model's generation_config.json may set for the requests that leave it out (as vLLM does).
MODEL_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def generation_defaults(model_dir: Path) -> dict[str, Any]:
    """The sampling defaults of the model in ``model_dir``; a ``ValueError`` naming the file if the
    contract would refuse them."""
    path = model_dir / "generation_config.json"
    try:
        return model_defaults(json.loads(path.read_text()) if path.is_file() else {})
    except ContractError as error:
        raise ValueError(f"{path}: its sampling defaults are not valid requests: {error}") from None


def model_defaults(generation_config: dict[str, Any]) -> dict[str, Any]:
    """The sampling defaults a model ships in its generation config; raises ``ContractError`` if the
    contract would refuse them."""
    found = {name: value for name in MODEL_DEFAULTS if (value := generation_config.get(name)) is not None}
    SamplingParams(**found)
    return found


def with_model_defaults(params: dict[str, Any], given: set[str], model: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the model's defaults for what the request left out (``given`` names what it set)."""
    if params.get("use_beam_search"):
        return params
    return params | {name: value for name, value in model.items() if name not in given}
