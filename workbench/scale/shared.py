"""This process's shared executor: one placement per process, a Ray cluster started once and
reused by every later search (``executor_for``)."""

from __future__ import annotations

import atexit
import os

from workbench.scale.executor import Executor, Placement

LOCAL_FIRST_S = 10.0
"""With nothing asked, a search runs this long in process before a local cluster is started."""

_SHARED: Executor | None = None


def executor_for(workers: int | None = None, address: str | None = None) -> Executor:
    """``workers=1`` (and no address): a fresh in-process executor. Otherwise this process's
    shared Ray executor: started on first use with that placement, reused by every later
    search (a notebook starts Ray once), stopped at exit, with the dashboard when ``ray[default]``
    is installed. ``$PDWB_WORKERS`` sets the default ``workers``. With nothing asked (no
    ``workers``, address or ``$RAY_ADDRESS``) the local cluster starts only after
    ``LOCAL_FIRST_S`` of a search ran here with work left (``Placement.local_first_s``)."""
    global _SHARED
    if workers is None and address is None and os.environ.get("PDWB_WORKERS"):
        workers = int(os.environ["PDWB_WORKERS"])
    asked = workers is not None or address is not None or os.environ.get("RAY_ADDRESS")
    placement = Placement(workers, address, dashboard=_has_dashboard(),
                          local_first_s=0.0 if asked else LOCAL_FIRST_S)
    if placement.local:
        return Executor(placement)
    if _SHARED is None or (_SHARED.connected and not _ray_up()) or _stale(_SHARED, placement):
        _SHARED = Executor(placement)
        atexit.register(_SHARED.close)
    return _SHARED


def _stale(shared: Executor, asked: Placement) -> bool:
    """A staged executor not yet connected gives way to a different placement asked for."""
    return not shared.connected and shared.placement != asked


def _ray_up() -> bool:
    import ray
    return ray.is_initialized()


def _has_dashboard() -> bool:
    import importlib.util
    return importlib.util.find_spec("aiohttp") is not None  # ray[default]'s dashboard server
