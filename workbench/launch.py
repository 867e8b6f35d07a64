"""Launch PD pairs (prefill + decode + router) as subprocesses, or attach to a running one.

``launch_pd_pair(...)`` returns a ``PDPair``: a context manager that owns every process, waits
for health, and tears everything down on exit (and at interpreter exit). Servers come from a
``TemplateBackend`` (command lines with ``{port}``, ``{host}`` and ``{engine_args}``); the router
from ``workbench.routers.ROUTERS`` (``"embedded"``: ours; ``"sglang"``: SGLang's Rust router).
``attach(url, ...)`` wraps a deployment that is already running.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.config import EngineConfig
from workbench.process import ServerProcess
from workbench.routers import ROUTERS, RouterArgs

log = logging.getLogger(__name__)

PY = shlex.quote(sys.executable)


@dataclass(frozen=True)
class TemplateBackend:
    """Command templates for the prefill and decode servers; ``{engine_args}`` expands engine
    options, ``{host}`` and ``{port}`` the server's address. The router is chosen by name
    (``workbench.routers.ROUTERS``)."""

    name: str
    prefill: str
    decode: str
    health: str = "/health"


EMBEDDED = TemplateBackend(
    name="embedded",
    prefill=PY + " -m engine serve --role prefill --host {host} --port {port} {engine_args}",
    decode=PY + " -m engine serve --role decode --host {host} --port {port} {engine_args}",
)


@dataclass(frozen=True)
class LaunchSpec:
    """What to launch. ``engine`` holds EngineConfig overrides (validated before launching)."""

    patches: tuple[str, ...] = ()
    engine: dict = field(default_factory=dict)
    faults: dict = field(default_factory=dict)
    num_prefill: int = 1
    num_decode: int = 1
    seed: int = 0
    debug_token: str = "pdwb-debug"
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
        out = "--debug-token " + shlex.quote(self.debug_token)
        return out + (" --set " + " ".join(shlex.quote(s) for s in sets) if sets else "")


@dataclass(eq=False)
class PDPair:
    """A running deployment: ``url`` is the router's OpenAI base URL (without /v1)."""

    spec: LaunchSpec
    prefill: list[ServerProcess]
    decode: list[ServerProcess]
    router: ServerProcess
    log_dir: Path

    @property
    def url(self) -> str:
        return self.router.url

    def servers(self) -> list[ServerProcess]:
        return [*self.prefill, *self.decode, self.router]

    def debug(self, path: str, server: ServerProcess | None = None, **params) -> dict:
        """GET a debug route (JSON) on ``server`` (default: the first decode server)."""
        srv = server or self.decode[0]
        r = httpx.get(srv.url + path, params=params, timeout=30,
                      headers={"x-debug-token": self.spec.debug_token})
        r.raise_for_status()
        return r.json()

    def debug_bytes(self, path: str, server: ServerProcess, **params) -> bytes:
        r = httpx.get(server.url + path, params=params, timeout=60,
                      headers={"x-debug-token": self.spec.debug_token})
        r.raise_for_status()
        return r.content

    def close(self) -> None:
        for srv in reversed(self.servers()):
            srv.stop()

    def __enter__(self) -> PDPair:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _proc(name: str, template: str, log_dir: Path, fill: dict, health: str) -> ServerProcess:
    srv = ServerProcess(name, [], log_dir, health=health, format_argv=False)
    srv.argv = shlex.split(template.format(port=srv.port, host=srv.host, **fill))
    return srv.start()


def launch_pd_pair(*, patches=(), engine: dict | None = None, faults: dict | None = None,
                   num_prefill: int = 1, num_decode: int = 1, seed: int = 0,
                   backend: TemplateBackend = EMBEDDED, router: str = "embedded",
                   log_dir: str | Path | None = None, decode_args: tuple[str, ...] = (),
                   timeout_s: float = 180.0) -> PDPair:
    """Starts prefill(s), decode(s) and the ``router`` named (``ROUTERS``); returns once all
    are healthy and the router is ready.

    Raises ``workbench.process.LaunchError`` naming the process (with its log tail) on failure;
    whatever did start is stopped first.
    """
    spec = LaunchSpec(tuple(patches), dict(engine or {}), dict(faults or {}), num_prefill,
                      num_decode, seed, decode_args=tuple(decode_args), router=router)
    kind = ROUTERS.get(router)
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="pdwb-"))
    fill = {"engine_args": spec.engine_args(), "seed": seed, **spec.template_vars}
    started: list[ServerProcess] = []
    try:
        prefill = [_proc(f"prefill{i}", backend.prefill, log_dir, fill, backend.health)
                   for i in range(num_prefill)]
        started += prefill
        dfill = {**fill, "engine_args": fill["engine_args"] + " " + " ".join(decode_args)}
        decode = [_proc(f"decode{i}", backend.decode, log_dir, dfill, backend.health)
                  for i in range(num_decode)]
        started += decode
        _wait_all(started, timeout_s)
        front = ServerProcess("router", [], log_dir, health=kind.ready, format_argv=False)
        front.argv = kind.argv(RouterArgs(front.host, front.port, tuple(s.url for s in prefill),
                                          tuple(s.port for s in prefill),
                                          tuple(s.url for s in decode), seed))
        started.append(front.start())
        _wait_all([front], timeout_s)
    except BaseException:
        for srv in started:
            srv.stop()
        raise
    log.info("PD pair up: %s router %s, logs in %s", router, front.url, log_dir)
    return PDPair(spec, prefill, decode, front, log_dir)


def attach(url: str, *, prefill: tuple[str, ...] | list[str] = (),
           decode: tuple[str, ...] | list[str] = (), patches=(), engine: dict | None = None,
           faults: dict | None = None, debug_token: str = "pdwb-debug",
           log_dir: str | Path | None = None, timeout_s: float = 10.0) -> PDPair:
    """A ``PDPair`` handle on a deployment that is already running at ``url`` (its router).

    Nothing is launched and ``close()`` stops nothing. ``prefill``/``decode`` name the servers
    behind the router (needed by probes that read their debug routes or dumps); ``patches``,
    ``engine`` and ``faults`` describe what they run (for the in-process reference). Raises
    ``LaunchError`` when ``url`` does not answer ``/health`` within ``timeout_s``.
    """
    spec = LaunchSpec(tuple(patches), dict(engine or {}), dict(faults or {}),
                      max(1, len(prefill)), max(1, len(decode)), debug_token=debug_token)
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="pdwb-attach-"))
    router = _running("router", url, log_dir)
    _wait_all([router], timeout_s)
    return PDPair(spec, [_running(f"prefill{i}", u, log_dir) for i, u in enumerate(prefill)],
                  [_running(f"decode{i}", u, log_dir) for i, u in enumerate(decode)], router,
                  log_dir)


def _running(name: str, url: str, log_dir: Path) -> ServerProcess:
    """A server this process did not start (``proc`` stays None: ``stop()`` does nothing)."""
    u = httpx.URL(url)
    if u.scheme != "http" or not u.host or not u.port:
        raise ValueError(f"{name} URL must look like http://HOST:PORT, not {url!r}")
    return ServerProcess(name, [], log_dir, host=u.host, port=u.port)


def _wait_all(servers: list[ServerProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for srv in servers:
        srv.wait_healthy(max(1.0, deadline - time.monotonic()))
