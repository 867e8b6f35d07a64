"""The tiny DeepSeek-style model (MLA-free attention with a lightning indexer) and the no-cache
reference that recomputes it token by token."""

from engine.model.model import TinyDeepSeek, load_model
from engine.model.reference import Reference

__all__ = ["Reference", "TinyDeepSeek", "load_model"]
