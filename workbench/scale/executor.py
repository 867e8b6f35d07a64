"""Where a search's work runs: in this process, or as Ray tasks and actors on a local or remote
cluster, with results that do not depend on where or in what order the work ran."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from workbench.scale.progress import Progress

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")
LOOPBACK = "127.0.0.1"  # every Ray service of a local cluster listens here, never on the LAN


def ray_env(address: str | None = None) -> dict[str, str]:
    """Environment for Ray in this process, set before ``ray`` is first imported (it reads it at
    import): no usage report leaves the machine, and a local cluster (no address, or a loopback
    one) binds and dials loopback only; Ray otherwise swaps 127.0.0.1 for the LAN address."""
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    host = (address or LOOPBACK).removeprefix("ray://").split(":")[0]
    if host in (LOOPBACK, "localhost"):
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return env


class WorkerLost(RuntimeError):
    """A Ray worker or node died under a task (not an exception raised by the task itself)."""


@dataclass(frozen=True)
class Placement:
    """Where an ``Executor`` runs work.

    ``workers=1``: in this process, no Ray (the inner loop, and tests that need no cluster).
    Otherwise Ray: the cluster at ``address`` (else ``$RAY_ADDRESS``), or a local cluster of
    ``workers`` CPUs (default: this machine's cores) started for the executor and stopped when
    it closes. A Ray already initialised in this process is used as it is and left running.
    ``local_first_s``: a local cluster is started only once a ``map`` has run this long in this
    process with items left (0: at once), so a search that ends sooner never waits for Ray."""

    workers: int | None = None
    address: str | None = None
    dashboard: bool = False
    local_first_s: float = 0.0

    @property
    def local(self) -> bool:
        return self.workers == 1 and self.address is None


def _node() -> str:
    import ray
    return ray.get_runtime_context().get_node_id()


def _run_chunk(fn: Callable[[T], R], items: Sequence[T]) -> tuple[str, list[R]]:
    import torch  # one CPU per task: torch's own thread pool would oversubscribe the node
    torch.set_num_threads(1)
    return _node(), [fn(x) for x in items]


@dataclass(eq=False)
class Executor:
    """Maps a function over items and hosts actors, in process or on Ray (``Placement``).

    Invariant: ``map`` returns results in item order, and with ``stop`` it returns exactly the
    items up to and including the lowest one whose result stops, whatever ran first where: the
    same list ``workers=1`` returns. ``fn`` and its results must pickle (Ray ships them);
    ``nodes`` records which Ray nodes ran tasks, never the results."""

    placement: Placement = field(default_factory=Placement)
    nodes: set[str] = field(default_factory=set)
    dashboard_url: str | None = None
    _owns_ray: bool = False
    _chunk_fn: Any = None

    def __post_init__(self) -> None:
        if not self.placement.local and not self.placement.local_first_s:
            self._connect()

    @property
    def connected(self) -> bool:
        return self._chunk_fn is not None

    @property
    def local(self) -> bool:
        return self.placement.local

    @property
    def workers(self) -> int:
        """CPUs work is spread over: 1 in process, the cluster's CPUs on Ray."""
        if self.local:
            return 1
        if not self.connected:
            return self.placement.workers or os.cpu_count() or 1
        import ray
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    @property
    def gpus(self) -> int:
        if self.local:
            return 0
        self._ensure_connected()
        import ray
        return int(ray.cluster_resources().get("GPU", 0))

    def _connect(self) -> None:
        address = self.placement.address or os.environ.get("RAY_ADDRESS")
        for k, v in ray_env(address).items():
            os.environ.setdefault(k, v)
        import ray
        if not ray.is_initialized():
            local = {} if address else {"num_cpus": self.placement.workers or os.cpu_count(),
                                        "_node_ip_address": LOOPBACK}
            ctx = ray.init(address=address, include_dashboard=self.placement.dashboard,
                           log_to_driver=False, logging_level=logging.WARNING, **local)
            self._owns_ray = True
            url = getattr(ctx, "dashboard_url", None)
            self.dashboard_url = f"http://{url}" if url else None
            log.info("ray: %s, %d CPUs%s", address or "local cluster", self.workers,
                     f", dashboard {self.dashboard_url}" if self.dashboard_url else "")
        self._chunk_fn = ray.remote(num_cpus=1)(_run_chunk)

    def close(self) -> None:
        """Stops the local cluster this executor started (not one it found running)."""
        if self._owns_ray:
            import ray
            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map(self, fn: Callable[[T], R], items: Sequence[T], *, chunk: int = 1,
            failed: Callable[[R], bool] | None = None, stop: bool = False,
            label: str | None = None, unit: str = "tasks", flag: str = "failing") -> list[R]:
        """``[fn(x) for x in items]``; with ``stop``, cut after the first result ``failed``
        accepts. ``chunk`` items per Ray task. A progress bar (``label``) counts results and
        failed ones."""
        items = list(items)
        bar = Progress(len(items), label or "", enabled=label is not None, unit=unit,
                       flag=flag, link=self.dashboard_url)
        failed = failed or _never
        try:
            if self.local:
                return self._map_local(fn, items, chunk, failed if stop else None,
                                       _Counter(bar, failed))
            return self._map_staged(fn, items, max(1, chunk), failed if stop else None,
                                    _Counter(bar, failed))
        finally:
            bar.close()

    def _map_staged(self, fn, items, chunk, stop, count) -> list:
        """In process for ``local_first_s`` while unconnected, then the rest on Ray."""
        head: list = []
        if not self.connected:
            t0 = time.monotonic()
            for x in items:
                head.append(fn(x))
                count.add(head[-1:])
                if stop is not None and stop(head[-1]):
                    return head
                if time.monotonic() - t0 >= self.placement.local_first_s:
                    break
            if len(head) == len(items):
                return head
            self._ensure_connected()
        return head + self._map_ray(fn, items[len(head):], chunk, stop, count)

    def _ensure_connected(self) -> None:
        if not self.connected:
            self._connect()

    def _map_local(self, fn, items, chunk, stop, count) -> list:
        out = []
        for x in items:
            out.append(fn(x))
            count.add(out[-1:])
            if stop is not None and stop(out[-1]):
                break
        return out

    def _map_ray(self, fn, items, chunk, stop, count) -> list:
        import ray
        fn_ref = ray.put(fn)
        starts = list(range(0, len(items), chunk))
        pending: dict[Any, int] = {}
        results: dict[int, list] = {}
        cut, nxt, inflight = len(items), 0, 2 * self.workers
        while nxt < len(starts) or pending:
            while nxt < len(starts) and len(pending) < inflight and starts[nxt] < cut:
                s = starts[nxt]
                pending[self._chunk_fn.remote(fn_ref, items[s:s + chunk])] = s
                nxt += 1
            if not pending:
                break
            [ref], _ = ray.wait(list(pending), num_returns=1)
            start = pending.pop(ref)
            results[start] = self._get(ref)
            cut = min(cut, _first_stop(results[start], start, stop))
            for late in [r for r, s in pending.items() if s >= cut]:
                ray.cancel(late)
                pending.pop(late)
            count.add(results[start])
        return [r for s in sorted(results) for r in results[s]][:cut]

    def _get(self, ref: Any) -> list:
        import ray
        try:
            node, got = ray.get(ref)
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as e:
            raise WorkerLost(f"a Ray worker died under a task: {e}") from e
        self.nodes.add(node)
        return got

    def actor(self, cls: type, *args: Any, cpus: float = 1, gpus: float = 0,
              **kwargs: Any) -> Remote:
        """An instance of ``cls`` in this process, or as a Ray actor holding ``cpus`` and
        ``gpus``; Ray kills it when this driver exits or dies (it is never detached)."""
        if self.local:
            return Remote(cls(*args, **kwargs), None)
        self._ensure_connected()
        import ray
        handle = ray.remote(num_cpus=cpus, num_gpus=gpus, max_restarts=0)(cls)
        return Remote(None, handle.remote(*args, **kwargs))


def _never(_: object) -> bool:
    return False


@dataclass
class _Counter:
    """Results and failed results so far, into the progress bar."""

    bar: Progress
    failed: Callable[[Any], bool]
    done: int = 0
    failures: int = 0

    def add(self, results: list) -> None:
        self.done += len(results)
        self.failures += sum(map(self.failed, results))
        self.bar.update(self.done, self.failures)


def _first_stop(results: list, start: int, stop: Callable | None) -> int:
    """One past the index of the first stopping result of a chunk starting at ``start``."""
    for k, r in enumerate(results):
        if stop is not None and stop(r):
            return start + k + 1
    return 1 << 62


@dataclass(eq=False)
class Remote:
    """A handle on an object in this process or in a Ray actor: ``call`` blocks for the
    result either way, so callers (e.g. a bisection's trial threads) do not care which."""

    obj: Any
    handle: Any

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.handle is None:
            return getattr(self.obj, method)(*args, **kwargs)
        import ray
        try:
            return ray.get(getattr(self.handle, method).remote(*args, **kwargs))
        except ray.exceptions.RayActorError as e:
            raise WorkerLost(f"the actor died: {e}") from e

    def kill(self) -> None:
        """Runs the object's ``close`` (if any), then ends the actor."""
        try:
            self.call("close")
        except AttributeError:
            pass
        except WorkerLost as e:
            log.warning("closing an actor: %s", e)
        if self.handle is not None:
            import ray
            ray.kill(self.handle)
