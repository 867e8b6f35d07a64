"""Launch PD pairs (prefill + decode + router) as subprocesses, or attach to a running one.

``launch_pd_pair(...)`` returns a ``PDPair``: a context manager that owns every process, waits
for health, and tears everything down on exit (and at interpreter exit). Servers come from a
``TemplateBackend`` (command lines with ``{port}``, ``{host}`` and ``{engine_args}``); the router
from ``workbench.deploy.routers.ROUTERS`` (``"embedded"``: ours; ``"sglang"``: SGLang's Rust
router). ``attach(url, ...)`` wraps a deployment that is already running.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine.disagg.control import SECRET_ENV
from workbench.deploy import vllm
from workbench.deploy.backends import BACKENDS
from workbench.deploy.pair import LaunchSpec, PDPair
from workbench.deploy.process import LaunchError, ServerProcess
from workbench.deploy.routers import ROUTERS, RouterArgs

__all__ = ["EMBEDDED", "LaunchSpec", "PDPair", "TemplateBackend", "attach", "launch_pd_pair"]

log = logging.getLogger(__name__)

PY = shlex.quote(sys.executable)
DEBUG_TOKEN_ENV = "PDWB_DEBUG_TOKEN"  # servers and router read their --debug-token default here
LAUNCH_ATTEMPTS = 3  # a port handed out can be taken (e.g. as a socket's source port) before
PORT_TAKEN = "address already in use"  # its server binds it: the launch is retried on new ports


@dataclass(frozen=True)
class TemplateBackend:
    """Command templates for the prefill and decode servers; ``{engine_args}`` expands engine
    options, ``{host}`` and ``{port}`` the server's address. The router is chosen by name
    (``workbench.deploy.routers.ROUTERS``)."""

    name: str
    prefill: str
    decode: str
    health: str = "/health"


EMBEDDED = TemplateBackend(
    name="embedded",
    prefill=PY + " -m engine serve --role prefill --host {host} --port {port} {engine_args}",
    decode=PY + " -m engine serve --role decode --host {host} --port {port} {engine_args}",
)


def _proc(name: str, template: str, log_dir: Path, fill: dict, health: str,
          env: dict[str, str], cwd: Path | None = None, ours: bool = False) -> ServerProcess:
    srv = ServerProcess(name, [], log_dir, health=health, format_argv=False, env=env, cwd=cwd,
                        stack_signal=ours)
    srv.argv = shlex.split(template.format(port=srv.port, host=srv.host, **fill))
    return srv.start()


def launch_pd_pair(*, patches=(), engine: dict | None = None, faults: dict | None = None,
                   num_prefill: int = 1, num_decode: int = 1, seed: int = 0,
                   backend: str | TemplateBackend = "embedded", router: str = "embedded",
                   log_dir: str | Path | None = None, decode_args: tuple[str, ...] = (),
                   vllm_options: vllm.VllmOptions | None = None,
                   timeout_s: float | None = None, source: str | Path | None = None) -> PDPair:
    """Starts prefill(s), decode(s) and a router; returns once all are healthy and ready.

    ``backend``: ``"embedded"`` (our engine; ``router`` names one of ``ROUTERS``; ``patches``,
    ``engine`` and ``faults`` configure it), ``"vllm"`` (real vLLM servers over NIXL behind
    vllm-router, see ``workbench.deploy.vllm``; those three must be empty), or a
    ``TemplateBackend``.
    ``source``: a source tree (e.g. a git worktree of another commit) the embedded servers and
    router run from (working directory and ``PYTHONPATH``), so its engine code, model and data
    are the ones served; default: this checkout.
    Raises ``workbench.deploy.process.LaunchError`` naming the process (with its log tail) on
    failure; whatever did start is stopped first.
    """
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="pdwb-"))
    if backend == "vllm":
        if patches or engine or faults or decode_args or router != "embedded" or source:
            raise ValueError("the vllm backend takes no patches, engine options, faults, "
                             "decode_args or router choice "
                             "(see workbench.deploy.backends.Capability)")
        return _launch_vllm(num_prefill, num_decode, seed, log_dir,
                            vllm_options or vllm.VllmOptions(), timeout_s or 420.0)
    if isinstance(backend, str):
        info = BACKENDS.get(backend)  # unknown names list the valid ones
        if info.name != "embedded":
            raise ValueError(f"backend {info.name!r} cannot be launched; use attach(url)")
        backend = EMBEDDED
    spec = LaunchSpec(tuple(patches), dict(engine or {}), dict(faults or {}), num_prefill,
                      num_decode, seed, debug_token=secrets.token_hex(16),
                      decode_args=tuple(decode_args), router=router)
    kind = ROUTERS.get(router)
    attempt = 1
    while True:
        try:
            return _launch_embedded(spec, backend, kind, log_dir, timeout_s or 180.0, source)
        except LaunchError as e:
            if PORT_TAKEN not in str(e) or attempt == LAUNCH_ATTEMPTS:
                raise
            log.warning("launch attempt %d: a port was taken before its server bound it; "
                        "retrying on fresh ports", attempt)
            attempt += 1


def _launch_embedded(spec: LaunchSpec, backend: TemplateBackend, kind, log_dir: Path,
                     timeout_s: float, source: str | Path | None) -> PDPair:
    num_prefill, num_decode, seed = spec.num_prefill, spec.num_decode, spec.seed
    fill = {"engine_args": spec.engine_args(), "seed": seed, **spec.template_vars}
    started: list[ServerProcess] = []
    # this deployment's control-plane secret and debug token: in the environment, never in argv
    env = {SECRET_ENV: secrets.token_hex(24), DEBUG_TOKEN_ENV: spec.debug_token}
    cwd = Path(source).resolve() if source else None
    if cwd is not None:
        env["PYTHONPATH"] = str(cwd)
    try:
        ours = backend is EMBEDDED
        prefill = [_proc(f"prefill{i}", backend.prefill, log_dir, fill, backend.health, env,
                         cwd, ours) for i in range(num_prefill)]
        started += prefill
        allow = " ".join(["--prefill-allow", *(s.url for s in prefill)])
        dfill = {**fill, "engine_args": " ".join([fill["engine_args"], *spec.decode_args, allow])}
        decode = [_proc(f"decode{i}", backend.decode, log_dir, dfill, backend.health, env, cwd,
                        ours) for i in range(num_decode)]
        started += decode
        _wait_all(started, timeout_s)
        front = ServerProcess("router", [], log_dir, health=kind.ready, format_argv=False,
                              env=env, cwd=cwd,
                              stack_signal=kind.name == "embedded")
        front.argv = kind.argv(RouterArgs(front.host, front.port, tuple(s.url for s in prefill),
                                          tuple(s.port for s in prefill),
                                          tuple(s.url for s in decode), seed,
                                          env[SECRET_ENV], tuple(spec.patches)))
        _start_and_wait([front], started, timeout_s)
    except BaseException:
        _stop(started)
        raise
    log.info("PD pair up: %s router %s, logs in %s", spec.router, front.url, log_dir)
    token = env[SECRET_ENV] if kind.client_auth else ""
    return PDPair(spec, prefill, decode, front, log_dir, client_token=token).start_watch()


def _launch_vllm(num_prefill: int, num_decode: int, seed: int, log_dir: Path,
                 opts: vllm.VllmOptions, timeout_s: float) -> PDPair:
    prefill = [vllm.server(f"prefill{i}", log_dir, opts, seed) for i in range(num_prefill)]
    decode = [vllm.server(f"decode{i}", log_dir, opts, seed) for i in range(num_decode)]
    started: list[ServerProcess] = []
    try:
        _start_and_wait([*prefill, *decode], started, timeout_s)
        _start_and_wait([vllm.router(log_dir, prefill, decode)], started, timeout_s)
    except BaseException:
        _stop(started)
        raise
    spec = LaunchSpec(num_prefill=num_prefill, num_decode=num_decode, seed=seed)
    log.info("vLLM PD pair up: router %s, logs in %s", started[-1].url, log_dir)
    return PDPair(spec, prefill, decode, started[-1], log_dir, BACKENDS.get("vllm"),
                  vllm.SERVED_MODEL).start_watch()


def _start_and_wait(servers: list[ServerProcess], started: list[ServerProcess],
                    timeout_s: float) -> None:
    for srv in servers:
        started.append(srv.start())
    _wait_all(servers, timeout_s)


def _stop(servers: list[ServerProcess]) -> None:
    for srv in reversed(servers):
        srv.stop()


def attach(url: str, *, prefill: tuple[str, ...] | list[str] = (),
           decode: tuple[str, ...] | list[str] = (), backend: str = "embedded", patches=(),
           engine: dict | None = None, faults: dict | None = None,
           debug_token: str | None = None, client_token: str = "", model: str | None = None,
           log_dir: str | Path | None = None, timeout_s: float = 10.0) -> PDPair:
    """A ``PDPair`` handle on a deployment that is already running at ``url`` (its router).

    Nothing is launched and ``close()`` stops nothing. ``backend`` says what the servers are:
    ``"embedded"`` (ours: debug routes, dumps, in-process reference), ``"vllm"``, or
    ``"openai"`` (anything else speaking the chat API, e.g. a GPU cluster's router). ``prefill``/
    ``decode`` name the servers behind the router (for probes reading their debug routes, dumps
    or metrics); ``model`` is the name requests carry; ``patches``, ``engine`` and ``faults``
    describe what ours run (for the in-process reference); ``debug_token`` is the one its servers
    were started with (default ``$PDWB_DEBUG_TOKEN``); ``client_token`` the Bearer token its
    router wants from clients (SGLang's router's ``--api-key``). Raises ``LaunchError`` when ``url``
    does not answer ``/health`` in ``timeout_s``.
    """
    info = BACKENDS.get(backend)
    spec = LaunchSpec(tuple(patches), dict(engine or {}), dict(faults or {}),
                      max(1, len(prefill)), max(1, len(decode)),
                      debug_token=debug_token or os.environ.get(DEBUG_TOKEN_ENV, ""))
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="pdwb-attach-"))
    router = _running("router", url, log_dir)
    _wait_all([router], timeout_s)
    return PDPair(spec, [_running(f"prefill{i}", u, log_dir) for i, u in enumerate(prefill)],
                  [_running(f"decode{i}", u, log_dir) for i, u in enumerate(decode)], router,
                  log_dir, info, model, client_token=client_token).start_watch()


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
