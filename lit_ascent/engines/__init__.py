"""Rollout engines (``model.rollout.engine``): hf, fused, vllm. See ``lit_ascent.engines.base``."""
from lit_ascent.engines.base import ENGINES, AdapterWatch, Decoder, Engine, GreedyDecoder, close_engines, engine_for

__all__ = ["ENGINES", "AdapterWatch", "Decoder", "Engine", "GreedyDecoder", "close_engines", "engine_for"]
