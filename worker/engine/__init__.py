"""pagedq's inference engine: paged KV cache, continuous batching, prefix caching.

It knows nothing of HTTP, SQL or Celery; the worker drives it through ``LLMEngine``.
"""

from contract.engine import EngineConfig
from contract.sampling import SamplingParams
from worker.engine.llm import LLM
from worker.engine.llm_engine import EngineStats, LLMEngine
from worker.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "EngineStats",
    "LLMEngine",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
]
