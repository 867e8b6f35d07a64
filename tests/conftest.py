"""Shared fixtures: the shipped model is loaded from disk once per test session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.core import Engine
from engine.model import TinyDeepSeek, load_model


def pytest_collection_modifyitems(items) -> None:
    """A test that asks for the vLLM side environment needs vLLM, whatever its module says."""
    for item in items:
        if "vllm_env" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def shipped_model() -> TinyDeepSeek:
    """The shipped weights (read-only: tests must not modify them)."""
    return load_model(Path(EngineConfig().model_dir) / "model.safetensors").eval()


@pytest.fixture(scope="session")
def make_engine(shipped_model) -> Callable[..., Engine]:
    """``make_engine(**config)``: a fresh engine (pools, cache, scheduler) on the shared model."""
    def make(**cfg) -> Engine:
        return Engine(EngineConfig(**cfg), model=shipped_model)
    return make


@pytest.fixture(scope="session")
def vllm_env() -> Path:
    """The pinned vLLM side environment's interpreter. ``make test`` builds it and sets
    PDWB_REQUIRE_VLLM=1, so there a missing environment fails; elsewhere it skips."""
    import os

    from workbench.deploy.vllm import VllmNotInstalled, vllm_python

    try:
        return vllm_python()
    except VllmNotInstalled as exc:
        if os.environ.get("PDWB_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(str(exc))
