"""HiCache: a host-memory tier under the radix cache, with layer-wise load-back.

Eviction backs a device page up to host memory and keeps its radix node; a later prefix match
allocates fresh device pages and queues a ``LoadJob`` that copies them back layer by layer
(index-K first, then K/V) on a loader thread. ``LoadJob.done_layers`` is the per-layer done
counter: a reader of layer i must call ``wait(i)`` before reading that layer of the loaded pages.

With the ``hicache_index_k_no_wait`` patch the index-K copy of layer i is not covered by that
counter: it runs after K/V and after the counter advanced (``ungated_index_k``), so every reader
that trusts the counter (the indexer, the PD KV sender) may read index-K pages still loading.
``index_k_layers`` counts the layers whose index-K really landed; reads and sends before that
are recorded as evidence (``stale_reads``, ``stale_sends``); K/V reads and sends of a layer whose
K/V had not landed (``hicache_kv_no_wait``) as ``stale_kv_reads``, ``stale_kv_sends``.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from engine.cache.kv_pool import KVPool, OutOfPagesError, PageAllocator
from engine.cache.radix_cache import PrefixMatch, RadixCache, _Node
from engine.faults import FaultInjector
from engine.runtime import THREADS, Runtime

log = logging.getLogger(__name__)
_job_ids = itertools.count(1)


@dataclass(frozen=True)
class StaleRead:
    """Index-K of a job's device pages as a reader saw them before the layer landed."""

    values: torch.Tensor  # [n,S,Di] storage dtype
    scale: torch.Tensor  # [n,S] fp32


@dataclass(eq=False)
class LoadJob:
    """Host->device copy of ``host_pages[i] -> device_pages[i]`` for every layer."""

    host_pages: list[int]
    device_pages: list[int]
    num_layers: int
    job_id: int = field(default_factory=lambda: next(_job_ids))
    done_layers: int = 0
    index_k_layers: int = 0
    stale_reads: list[int] = field(default_factory=list)
    stale_sends: list[int] = field(default_factory=list)
    stale_snapshots: dict[int, StaleRead] = field(default_factory=dict)
    stale_kv_reads: list[int] = field(default_factory=list)
    stale_kv_sends: list[int] = field(default_factory=list)
    rids: set[str] = field(default_factory=set)
    cond: threading.Condition = field(default_factory=threading.Condition)
    runtime: Runtime = THREADS

    @property
    def done(self) -> bool:
        return min(self.done_layers, self.index_k_layers) >= self.num_layers

    def index_k_landed(self, layer: int) -> bool:
        return self.index_k_layers > layer

    def wait(self, layer: int, timeout: float = 30.0) -> None:
        """Blocks until layer ``layer`` of every page has landed."""
        with self.cond:
            if not self.runtime.wait_for(self.cond, lambda: self.done_layers > layer, timeout):
                raise TimeoutError(f"load job {self.job_id} layer {layer} not done in {timeout}s")

    def wait_index_k(self, layer: int, timeout: float = 30.0) -> None:
        """Blocks until layer ``layer``'s index-K of every page has landed (not its K/V)."""
        with self.cond:
            if not self.runtime.wait_for(self.cond, lambda: self.index_k_layers > layer,
                                         timeout):
                raise TimeoutError(f"load job {self.job_id} index-K {layer} not in {timeout}s")

    def note_send(self, layer: int) -> None:
        """Records a transfer of ``layer``'s index-K or K/V pages posted before they landed."""
        if not self.index_k_landed(layer):
            self.stale_sends.append(layer)
        if self.done_layers <= layer:
            self.stale_kv_sends.append(layer)

    def note_kv_read(self, layer: int) -> None:
        """Records a K/V read of ``layer`` before its K/V landed."""
        if self.done_layers <= layer:
            self.stale_kv_reads.append(layer)

    def note_read(self, layer: int, pool: KVPool) -> None:
        """Records a read of ``layer`` before its index-K landed, with the index-K it saw."""
        if not self.index_k_landed(layer):
            self.stale_reads.append(layer)
            pages = torch.tensor(self.device_pages, device=pool.index_k.device)
            self.stale_snapshots.setdefault(layer, StaleRead(pool.index_k[layer, pages].clone(),
                                                    pool.index_k_scale[layer, pages].clone()))

    def _advance(self) -> None:
        with self.cond:
            self.done_layers += 1
            self.cond.notify_all()

    def _index_k_landed(self) -> None:
        with self.cond:
            self.index_k_layers += 1
            self.cond.notify_all()

    def wait_done(self, timeout: float = 30.0) -> bool:
        """Blocks until every layer's K/V and index-K landed; False on timeout."""
        with self.cond:
            return self.runtime.wait_for(self.cond, lambda: self.done, timeout)


class HostPool:
    """Host copies of pages, same per-page layout as the device ``KVPool``."""

    def __init__(self, device_pool: KVPool, num_pages: int) -> None:
        pin = device_pool.k.device.type != "cpu"
        self.buffers = {name: torch.zeros((t.shape[0], num_pages, *t.shape[2:]), dtype=t.dtype,
                                          pin_memory=pin)
                        for name, t in device_pool.buffers().items()}
        self.alloc = PageAllocator(num_pages)


class Loader:
    """One background thread that runs load jobs in FIFO order with injected copy delays."""

    def __init__(self, pool: KVPool, host: HostPool, faults: FaultInjector,
                 ungated_index_k: bool = False, runtime: Runtime = THREADS,
                 v_after_counter: bool = False) -> None:
        self.pool, self.host, self.faults = pool, host, faults
        self.ungated_index_k = ungated_index_k
        self.v_after_counter = v_after_counter
        self.runtime = runtime
        self.jobs: queue.Queue[LoadJob] = queue.Queue()
        self.history: deque[LoadJob] = deque(maxlen=1024)
        runtime.start_thread(self._loop, "hicache-loader")

    def submit(self, job: LoadJob) -> LoadJob:
        self.history.append(job)
        self.jobs.put(job)
        return job

    def _copy(self, job: LoadJob, layer: int, names: tuple[str, ...],
              delayed: bool = True) -> None:
        dev = self.pool.buffers()
        src = torch.tensor(job.host_pages)
        dst = torch.tensor(job.device_pages, device=dev[names[0]].device)
        nbytes = sum(dev[n][layer, 0].numel() * dev[n].element_size() for n in names)
        if delayed:
            self.runtime.sleep(self.faults.hicache_delay((job.job_id, layer, names[0]),
                                                         nbytes * len(job.host_pages)))
        for n in names:
            dev[n][layer, dst] = self.host.buffers[n][layer, src].to(dev[n].device)
        self.runtime.point(f"loader.copy {names[0]} L{layer} job{job.job_id}")

    def _load_layer(self, job: LoadJob, layer: int) -> None:
        index_k = ("index_k", "index_k_scale")
        if self.ungated_index_k:  # the counter covers K/V only; index-K lands after it
            self._copy(job, layer, ("k", "v"))
            job._advance()
            self._copy(job, layer, index_k)
            job._index_k_landed()
        elif self.v_after_counter:  # the counter is published between K and V
            self._copy(job, layer, index_k)
            job._index_k_landed()
            self._copy(job, layer, ("k",))
            job._advance()
            self.runtime.point(f"loader.published L{layer} job{job.job_id}")
            self._copy(job, layer, ("v",), delayed=False)
        else:
            self._copy(job, layer, index_k)
            job._index_k_landed()
            self._copy(job, layer, ("k", "v"))
            job._advance()

    def _loop(self) -> None:
        while True:
            job = self.runtime.get(self.jobs)
            t0 = time.perf_counter()
            for layer in range(job.num_layers):
                self._load_layer(job, layer)
            log.debug("load job %d: %d pages in %.1f ms", job.job_id, len(job.host_pages),
                      (time.perf_counter() - t0) * 1e3)


class HiRadixCache(RadixCache):
    """Radix cache whose evicted pages move to host memory and load back on a match."""

    def __init__(self, allocator: PageAllocator, pool: KVPool, host_pages: int,
                 faults: FaultInjector, ungated_index_k: bool = False,
                 backup_index_k: bool = True, runtime: Runtime = THREADS,
                 v_after_counter: bool = False, partial_page_min: float | None = None) -> None:
        super().__init__(allocator, pool.page_size, partial_page_min)
        self.backup_names = tuple(n for n in pool.buffers()
                                  if backup_index_k or not n.startswith("index_k"))
        self.pool = pool
        self.host = HostPool(pool, host_pages)
        self.runtime = runtime
        self.loader = Loader(pool, self.host, faults, ungated_index_k, runtime, v_after_counter)
        self.num_layers = pool.k.shape[0]
        self._job_ids = itertools.count(1)  # per cache: a replay numbers its jobs alike
        self.loads = 0

    def match(self, tokens: list[int], max_tokens: int | None = None) -> PrefixMatch:
        path = self._walk(tokens, max_tokens)
        resident = [n for n in path if n.page is not None]
        self.alloc.share([n.page for n in resident])
        missing = [n for n in path if n.page is None]
        jobs = tuple({n.job for n in resident if n.job is not None and not n.job.done})
        if missing:
            try:
                fresh = self.alloc.alloc(len(missing))
            except OutOfPagesError:
                self.evict(len(missing) - self.alloc.num_free)
                enough = self.alloc.num_free >= len(missing)
                fresh = self.alloc.alloc(len(missing)) if enough else []
            if len(fresh) < len(missing):
                return self._truncate(path, resident, missing, jobs)
            job = self._load(missing, fresh)
            jobs = jobs + (job,)
        return PrefixMatch(tuple(n.page for n in path), len(path) * self.page_size, jobs)

    def _truncate(self, path, resident, missing, jobs) -> PrefixMatch:
        cut = path.index(missing[0])
        self.alloc.free([n.page for n in path[cut:] if n.page is not None])
        pages = tuple(n.page for n in path[:cut])
        return PrefixMatch(pages, len(pages) * self.page_size, jobs)

    def _load(self, nodes: list[_Node], fresh: list[int]) -> LoadJob:
        job = LoadJob([n.host_page for n in nodes], fresh, self.num_layers,
                      job_id=next(self._job_ids), runtime=self.runtime)
        for n, page in zip(nodes, fresh, strict=True):
            n.page, n.job = page, job
        self.alloc.share(fresh)  # the tree's own reference; the caller keeps the alloc one
        self.num_pages += len(fresh)
        self.loads += 1
        return self.loader.submit(job)

    def evict(self, num_pages: int) -> int:
        """Frees up to ``num_pages`` LRU device pages held only by the tree, moving each to host
        memory. A full host tier makes room first (``_free_host``); a device leaf that still
        cannot be backed up leaves the tree (its prefix is recomputed when next asked for), so
        eviction always frees what it may: a full host tier never wedges the device pool."""
        moved = 0
        while moved < num_pages:  # a leaf that left the tree may make its parent the next one
            freed = self._evict_pass(num_pages - moved)
            if not freed:
                break
            moved += freed
        return moved

    def _evict_pass(self, num_pages: int) -> int:
        victims = sorted((n for n in self._nodes() if n.page is not None
                          and self.alloc.refcount[n.page] == 1
                          and (n.job is None or n.job.done)),
                         key=lambda n: n.last_access)
        moved = 0
        for node in victims:
            if moved == num_pages:
                break
            if node.host_page is None and not self._backup(node):
                if node.children:
                    continue  # an inner page without a host copy stays: its subtree needs it
                del node.parent.children[node.key]
            self.alloc.free([node.page])
            node.page, node.job = None, None
            self.num_pages -= 1
            moved += 1
        return moved

    def _free_host(self) -> bool:
        """Frees one host page: the LRU host-only leaf leaves the tree, else the LRU host copy
        of a page also on the device is dropped. False when no host page can go."""
        nodes = list(self._nodes())
        leaves = [n for n in nodes if n.page is None and n.host_page is not None
                  and not n.children]
        copies = [n for n in nodes if n.page is not None and n.host_page is not None
                  and (n.job is None or n.job.done)]  # a loading page still reads its copy
        pick = min(leaves or copies, key=lambda n: n.last_access, default=None)
        if pick is None:
            return False
        if pick.page is None:
            del pick.parent.children[pick.key]
        self.host.alloc.free([pick.host_page])
        pick.host_page = None
        return True

    def _backup(self, node: _Node) -> bool:
        if self.host.alloc.num_free == 0 and not self._free_host():
            return False
        node.host_page = self.host.alloc.alloc(1)[0]
        for name in self.backup_names:  # every buffer, unless index_k_not_backed_up
            t = self.pool.buffers()[name]
            self.host.buffers[name][:, node.host_page] = t[:, node.page].to("cpu")
        return True
