"""What a caller may ask of one request: the request contract's ``SamplingParams`` (contract/sampling.py),
which checks itself on construction with the same rules the API applies at submission."""

from contract.sampling import SamplingParams

__all__ = ["SamplingParams"]
