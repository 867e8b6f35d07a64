"""The PD routers a pair can be launched behind: our own (``engine.router``) and SGLang's Rust
router (PyPI ``sglang-router``, pinned in ``pyproject.toml``), each a small registry entry.

SGLang's router reads ``--prefill URL BOOTSTRAP_PORT`` (our prefill serves its bootstrap routes on
its HTTP port), probes workers (gRPC first, then ``/health``, ``/server_info``, ``/model_info``),
draws rooms with its own unseeded RNG, drops our ``X-Bootstrap-Room`` header and unknown request
fields (``return_token_ids``), and passes the decode's body through: probes read the room from
the completion id and token ids from ``logprobs``.

Our PD servers register a room only for a holder of the deployment secret. Our router sends it
as ``X-PD-Secret``. SGLang's router (0.3.2, measured) adds no credential of its own to proxied
requests: it forwards the client's ``Authorization`` (and drops ``X-PD-Secret``); with
``--api-key K`` it refuses clients without ``Bearer K``. So it runs with the secret as its API key
and its clients send it (``RouterKind.client_auth``): the deployment is as closed as its router,
and who may use that router holds the secret.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.registry import Registry


@dataclass(frozen=True)
class RouterArgs:
    host: str
    port: int
    prefill: tuple[str, ...]  # base URLs
    bootstrap_ports: tuple[int, ...]  # one per prefill
    decode: tuple[str, ...]
    seed: int
    secret: str = field(default="", repr=False)  # the deployment's PD secret
    patches: tuple[str, ...] = ()  # patch variants, in argv as every server gets them


@dataclass(frozen=True)
class RouterKind:
    """How to start one router; ``ready`` is polled until it answers 200. ``forwards_token_ids``:
    the
    router passes ``return_token_ids`` on (else the load asks for ``logprobs``, which costs the
    servers a log-softmax per token)."""

    name: str
    argv: Callable[[RouterArgs], list[str]]
    ready: str
    forwards_token_ids: bool  # False: probes recover token ids from logprobs instead
    client_auth: bool = False  # its clients send the deployment secret as a Bearer token


def _embedded(a: RouterArgs) -> list[str]:
    return [sys.executable, "-m", "engine.router", "--host", a.host, "--port", str(a.port),
            "--prefill", *a.prefill, "--decode", *a.decode, "--seed", str(a.seed),
            *(["--patches", ",".join(a.patches)] if a.patches else [])]


def _sglang(a: RouterArgs) -> list[str]:
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
            "--host", a.host, "--port", str(a.port), "--policy", "round_robin",
            "--log-level", "warn", "--health-check-interval-secs", "5",
            "--request-timeout-secs", "300"]
    for url, port in zip(a.prefill, a.bootstrap_ports, strict=True):
        argv += ["--prefill", url, str(port)]
    for url in a.decode:
        argv += ["--decode", url]
    return argv + (["--api-key", a.secret] if a.secret else [])


ROUTERS: Registry[RouterKind] = Registry("router")
ROUTERS.register("embedded", RouterKind("embedded", _embedded, "/health",
                                        forwards_token_ids=True))
ROUTERS.register("sglang", RouterKind("sglang", _sglang, "/readiness",
                                      forwards_token_ids=False, client_auth=True))
