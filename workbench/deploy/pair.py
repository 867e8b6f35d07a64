"""A running deployment (``PDPair``) and what was asked of it at launch (``LaunchSpec``)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.config import EngineConfig
from workbench.deploy.backends import BACKENDS, BackendInfo, Capability, require
from workbench.deploy.process import ServerProcess
from workbench.deploy.routers import ROUTERS
from workbench.deploy.vitals import EngineDown
from workbench.deploy.watch import ProcessWatch


@dataclass(frozen=True)
class LaunchSpec:
    """What to launch. ``engine`` holds EngineConfig overrides (validated before launching)."""

    patches: tuple[str, ...] = ()
    engine: dict = field(default_factory=dict)
    faults: dict = field(default_factory=dict)
    num_prefill: int = 1
    num_decode: int = 1
    seed: int = 0
    debug_token: str = field(default="", repr=False)  # generated per launch, never a default
    decode_args: tuple[str, ...] = ()
    template_vars: dict = field(default_factory=dict)
    router: str = "embedded"

    def __post_init__(self) -> None:
        self.engine_config()  # raises ConfigError / UnknownVariantError early
        ROUTERS.get(self.router)
        if self.num_prefill < 1 or self.num_decode < 1:
            raise ValueError("need at least one prefill and one decode server")

    def engine_config(self) -> EngineConfig:
        return EngineConfig.from_dict({**self.engine, "patches": frozenset(self.patches),
                                       "faults": self.faults})

    def engine_args(self) -> str:
        sets = [f"{k}={json.dumps(v)}" for k, v in self.engine.items()]
        if self.patches:
            sets.append("patches=" + ",".join(self.patches))
        if self.faults:
            sets.append("faults=" + json.dumps(self.faults))
        return "--set " + " ".join(shlex.quote(s) for s in sets) if sets else ""


@dataclass(eq=False)
class PDPair:
    """A running deployment: ``url`` is the router's OpenAI base URL (without /v1); ``backend``
    says what its servers offer beyond the chat API (``workbench.deploy.backends``)."""

    spec: LaunchSpec
    prefill: list[ServerProcess]
    decode: list[ServerProcess]
    router: ServerProcess
    log_dir: Path
    backend: BackendInfo = field(default_factory=lambda: BACKENDS.get("embedded"))
    model: str | None = None  # the model name requests carry (None: the servers take any)
    watch: ProcessWatch | None = None  # started by launch/attach: deaths and hangs
    client_token: str = field(default="", repr=False)  # a router that needs a Bearer token

    @property
    def url(self) -> str:
        return self.router.url

    @property
    def headers(self) -> dict[str, str]:
        """What every client request to ``url`` carries (SGLang's router: its API key)."""
        return {"Authorization": f"Bearer {self.client_token}"} if self.client_token else {}

    def down(self) -> tuple[EngineDown, ...]:
        """Every death, hang or lost server seen since launch (empty when all is well)."""
        return self.watch.down() if self.watch is not None else ()

    def start_watch(self, **kwargs) -> PDPair:
        """Starts watching every process and health route (``ProcessWatch`` settings)."""
        self.watch = ProcessWatch(self.servers(), **kwargs).start()
        return self

    def servers(self) -> list[ServerProcess]:
        return [*self.prefill, *self.decode, self.router]

    def debug(self, path: str, server: ServerProcess | None = None, **params) -> dict:
        """GET a debug route (JSON) on ``server`` (default: the first decode server)."""
        require(self, Capability.DEBUG_QUEUES, f"GET {path}")
        srv = server or self.decode[0]
        r = httpx.get(srv.url + path, params=params, timeout=30,
                      headers={"x-debug-token": self.spec.debug_token})
        r.raise_for_status()
        return r.json()

    def debug_bytes(self, path: str, server: ServerProcess, **params) -> bytes:
        require(self, Capability.BUFFER_DUMPS, f"GET {path}")
        r = httpx.get(server.url + path, params=params, timeout=60,
                      headers={"x-debug-token": self.spec.debug_token})
        r.raise_for_status()
        return r.content

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()  # what close() stops is not a death
        for srv in reversed(self.servers()):
            srv.stop()

    def __enter__(self) -> PDPair:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def client_headers(target) -> dict[str, str]:
    """``target.headers`` for a ``PDPair``; nothing for a bare URL."""
    return target.headers if isinstance(target, PDPair) else {}
