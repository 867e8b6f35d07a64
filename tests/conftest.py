"""Shared fixtures: the shipped model is loaded from disk once per test session, a Ray cluster
of two nodes is started at most once (``ray_cluster``), and searches run in process unless a
test asks for Ray (``PDWB_WORKERS=1``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.core import Engine
from engine.model import TinyDeepSeek, load_model
from workbench.scale.executor import LOOPBACK, ray_env

os.environ.setdefault("PDWB_WORKERS", "1")  # searches default to in-process; Ray tests say so
os.environ.update(ray_env())  # before any test module imports ray: the test cluster is loopback


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


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The address of a two-node Ray cluster on this machine (one CPU each, loopback only),
    started once for the whole session; this process is connected to it as a driver."""
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "node_ip_address": LOOPBACK}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster.address
    ray.shutdown()
    cluster.shutdown()
