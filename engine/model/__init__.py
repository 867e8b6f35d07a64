"""The tiny DeepSeek-style model (MLA-free attention with a lightning indexer) and the no-cache
reference that recomputes it token by token."""

from engine.model.model import TinyDeepSeek, load_model
from engine.model.reference import Reference, Scored

__all__ = ["Reference", "Scored", "TinyDeepSeek", "load_model"]
