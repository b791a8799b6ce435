"""What the service and the engine agree on, in pure Python: the request contract (``sampling.py``) and
its defaults from a model's generation config (``sampling_defaults.py``), the context rule
(``context.py``), the engine's knobs with their defaults (``engine.py``), and how a process keeps what it
loaded out of the garbage collector's walks (``heap.py``).

It imports only the standard library and ``annotated_types``, so ``core/`` (and through it the API) and
``worker/engine/`` both import it, and neither drags in the other's world: no torch, no pydantic, no SQL.
"""
