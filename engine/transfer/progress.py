"""Pacing of NIXL's UCX progress thread.

NIXL's Python agent sets the progress-thread delay to 0 µs, and the UCX backend's shared
progress thread then polls its workers with ``poll(timeout=0)``: one busy core per agent, even
when idle (a PD pair on a 2-core host has no core left). With a delay of ``d > 0`` µs the thread
sleeps in ``poll()`` on the workers' event descriptors for at most ``ceil(d / 1000)`` ms: UCX
events still wake it at once, the delay only bounds a missed wakeup.

This module imports nothing but the standard library, so a foreign interpreter (the vLLM side
environment's ``sitecustomize``) can load it by path.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Mapping

DELAY_ENV = "PDWB_NIXL_PROGRESS_DELAY_US"
DEFAULT_DELAY_US = 1000


class _PacedBindings(types.ModuleType):
    """The ``nixlBind`` an ``_api`` module sees: the real bindings, with a config class whose
    progress-thread delay never drops below ``delay_us``."""

    def __init__(self, real: types.ModuleType, delay_us: int) -> None:
        super().__init__(real.__name__)
        base = real.nixlAgentConfig
        floor = delay_us

        class PacedAgentConfig(base):  # type: ignore[misc, valid-type]
            pthrDelay = property(base.pthrDelay.__get__,
                                 lambda self, us: base.pthrDelay.__set__(self, max(us, floor)))

        self._real, self.delay_us, self.nixlAgentConfig = real, delay_us, PacedAgentConfig

    def __getattr__(self, name: str):
        return getattr(self._real, name)


def pace(api: types.ModuleType, delay_us: int = DEFAULT_DELAY_US) -> None:
    """Make agents created through ``api`` (a ``nixl*._api`` module) use a progress-thread
    delay of at least ``delay_us`` µs. Idempotent; ``delay_us == 0`` restores NIXL's busy poll."""
    if delay_us < 0:
        raise ValueError(f"progress delay must be >= 0 µs, got {delay_us}")
    bind = api.nixlBind
    real = bind._real if isinstance(bind, _PacedBindings) else bind
    api.nixlBind = _PacedBindings(real, delay_us) if delay_us else real


def pace_module_of(agent_class: type, delay_us: int = DEFAULT_DELAY_US) -> None:
    """:func:`pace` the module that defines ``agent_class`` (``nixl._api.nixl_agent``)."""
    pace(sys.modules[agent_class.__module__], delay_us)


class _PaceOnImport(importlib.abc.MetaPathFinder):
    """Paces every ``nixl*._api`` module right after it executes (no eager NIXL import)."""

    def __init__(self, delay_us: int) -> None:
        self.delay_us = delay_us

    def find_spec(self, name, path, target=None):
        top, _, leaf = name.partition(".")
        if not top.startswith("nixl") or leaf != "_api":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, delay = spec.loader.exec_module, self.delay_us

        def exec_module(module: types.ModuleType) -> None:
            run(module)
            if hasattr(module, "nixlBind"):
                pace(module, delay)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def delay_from_env(environ: Mapping[str, str]) -> int:
    """``environ[DELAY_ENV]`` in µs (``DEFAULT_DELAY_US`` when unset); ValueError if malformed."""
    raw = environ.get(DELAY_ENV, "").strip()
    if not raw:
        return DEFAULT_DELAY_US
    if not raw.isdigit():
        raise ValueError(f"{DELAY_ENV} must be a whole number of µs >= 0, got {raw!r}")
    return int(raw)


def install_from_env(environ: Mapping[str, str]) -> bool:
    """Install the import hook when the environment asks for a positive delay; True if it did."""
    delay = delay_from_env(environ)
    if delay == 0:
        return False
    if not any(isinstance(f, _PaceOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PaceOnImport(delay))
    return True
