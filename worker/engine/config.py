"""The engine's knobs: ``EngineConfig`` lives in the shared contract (contract/engine.py), so that the
service's settings take their defaults from it without importing the engine."""

from contract.engine import DEFAULT_MODEL, EngineConfig

__all__ = ["DEFAULT_MODEL", "EngineConfig"]
