"""The OpenAI-compatible HTTP server of one engine (single, prefill or decode role)."""

from engine.serving.server import create_app

__all__ = ["create_app"]
