"""Page transfer layer: NIXL WRITEs of KV-cache / index-K pages between prefill and decode.

Buffer invariant: every registered tensor is C-contiguous with shape ``[*outer, P, *inner]``
where ``P`` (at index ``page_dim``) is the number of pages. For a flat outer index ``o``
(a layer, when the shape is ``[L, P, ...]``) page ``p`` is the single contiguous byte range
``data_ptr + (o * P + p) * page_bytes`` of ``page_bytes = prod(inner) * element_size`` bytes.
Peers must agree on dtype, ``page_dim`` and every dimension except ``P`` (pools may differ in
size). Transfers are one-sided WRITEs from this endpoint into the peer's buffer of the same name;
the optional notification tag is delivered to the peer after the data has landed.
All NIXL calls of one endpoint are serialized by a lock, so threads may share an endpoint.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from nixl import _bindings as nixl_bindings
from nixl._api import nixl_agent, nixl_agent_config

from engine.transfer.channel import (
    BufferInfo,
    ChannelError,
    EndpointBlob,
    MetadataChannel,
    TransferError,
    fetch_peer,
)
from engine.transfer.pages import (
    ByteRange,
    Notification,
    PageWrite,
    PeerHandle,
    TransferStatus,
    buffer_infos,
    buffer_pair,
    check_layouts,
    coalesce,
    page_ranges,
)
from engine.transfer.progress import delay_from_env, pace_module_of

__all__ = ["BufferInfo", "ByteRange", "ChannelError", "EndpointBlob", "MetadataChannel",
           "Notification", "PageWrite", "PeerHandle", "TransferEndpoint", "TransferError",
           "TransferHandle", "TransferStatus", "Transport", "buffer_infos", "buffer_pair",
           "check_layouts", "coalesce", "fetch_peer"]

logger = logging.getLogger(__name__)

_NIXL_ERRORS: tuple[type[BaseException], ...] = tuple(
    v for k, v in vars(nixl_bindings).items()
    if k.endswith("Error") and isinstance(v, type) and issubclass(v, Exception)
)


@dataclass
class _Plan:
    """NIXL descriptor tuples ``(addr, len, dev_id)`` for both sides of one WRITE."""

    src: list[tuple[int, int, int]] = field(default_factory=list)
    dst: list[tuple[int, int, int]] = field(default_factory=list)
    nbytes: int = 0
    local_mem: str = "DRAM"
    remote_mem: str = "DRAM"


@dataclass
class TransferHandle:
    """A posted WRITE; poll it with ``TransferEndpoint.poll`` and free it with ``release``."""

    peer: str
    nbytes: int
    num_descs: int
    xfer: object
    status: TransferStatus = TransferStatus.PENDING
    released: bool = False


class TransferEndpoint:
    """One NIXL agent owning registered page buffers; writes pages into connected peers.

    ``page_dims`` maps buffer name to its page dimension (default 0): use 1 for ``[L, P, ...]``.
    ``net_devices`` is UCX's ``UCX_NET_DEVICES`` for this process (default ``lo``: listeners
    bind loopback only); an ``UCX_NET_DEVICES`` already in the environment wins.
    ``progress_delay_us`` paces NIXL's progress thread (``engine.transfer.progress``; default
    ``$PDWB_NIXL_PROGRESS_DELAY_US`` or 1000 µs, 0 = NIXL's busy poll). It is process-wide.
    """

    def __init__(self, name: str, buffers: Mapping[str, torch.Tensor], backend: str = "UCX",
                 page_dims: Mapping[str, int] | None = None, net_devices: str = "lo",
                 progress_delay_us: int | None = None) -> None:
        self.name, self.backend = name, backend
        self._tensors = dict(buffers)
        self._infos = buffer_infos(buffers, page_dims)
        self._lock = threading.RLock()
        os.environ.setdefault("UCX_NET_DEVICES", net_devices)  # read when UCX initialises
        delay = delay_from_env(os.environ) if progress_delay_us is None else progress_delay_us
        pace_module_of(nixl_agent, delay)  # process-wide; 0 = NIXL's busy poll
        self._agent = nixl_agent(name, nixl_agent_config(backends=[backend]))
        if backend not in self._agent.backends:
            raise TransferError(f"NIXL backend {backend!r} unavailable")
        self._regs = [self._nixl("register_memory", t, None, [backend])
                      for t in self._tensors.values()]
        self._peers: dict[str, PeerHandle] = {}
        self._live: list[TransferHandle] = []
        self._closed = False
        logger.info("endpoint %s registered %s", name, sorted(self._infos))

    def __enter__(self) -> TransferEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def blob(self) -> EndpointBlob:
        """What a peer needs to ``connect`` to this endpoint."""
        self._check_open()
        return EndpointBlob(self.name, self._nixl("get_agent_metadata"), dict(self._infos))

    def connect(self, peer: EndpointBlob) -> PeerHandle:
        """Load the peer's agent metadata after checking shared buffers' layouts agree."""
        self._check_open()
        check_layouts(self._infos, peer)
        old = self._peers.get(peer.agent_name)
        if old is not None and old.blob.agent_metadata == peer.agent_metadata:
            return old
        if old is not None:
            self._nixl("remove_remote_agent", peer.agent_name)
        loaded = self._nixl("add_remote_agent", peer.agent_metadata)
        loaded = loaded.decode() if isinstance(loaded, bytes) else loaded
        if loaded != peer.agent_name:
            raise TransferError(f"peer metadata names {loaded!r}, blob says {peer.agent_name!r}")
        handle = PeerHandle(peer.agent_name, peer)
        self._peers[peer.agent_name] = handle
        return handle

    def write_pages(self, peer: PeerHandle, requests: list[PageWrite],
                    notif: bytes = b"") -> TransferHandle:
        """Post one WRITE moving all ``requests``; ``notif`` (if any) reaches the peer after."""
        self._check_open()
        if peer.name not in self._peers:
            raise TransferError(f"peer {peer.name!r} is not connected")
        plan = self._plan(peer, requests)
        local = self._nixl("get_xfer_descs", plan.src, plan.local_mem)
        remote = self._nixl("get_xfer_descs", plan.dst, plan.remote_mem)
        xfer = self._nixl("initialize_xfer", "WRITE", local, remote, peer.name, notif)
        handle = TransferHandle(peer.name, plan.nbytes, len(plan.src), xfer)
        self._live.append(handle)
        handle.status = _STATES[self._nixl("transfer", xfer)]
        return handle

    def _plan(self, peer: PeerHandle, requests: list[PageWrite]) -> _Plan:
        if not requests:
            raise TransferError("write_pages needs at least one PageWrite")
        plan = _Plan()
        local_mems, remote_mems = set(), set()
        for req in requests:
            local, remote = buffer_pair(self._infos, peer, req.buffer)
            local_mems.add(local.mem_type)
            remote_mems.add(remote.mem_type)
            for r in page_ranges(local, remote, req):
                plan.src.append((r.src, r.length, local.device_id))
                plan.dst.append((r.dst, r.length, remote.device_id))
                plan.nbytes += r.length
        if len(local_mems) > 1 or len(remote_mems) > 1:
            raise TransferError("one write_pages call cannot mix DRAM and VRAM buffers")
        plan.local_mem, plan.remote_mem = local_mems.pop(), remote_mems.pop()
        return plan

    def poll(self, handle: TransferHandle) -> TransferStatus:
        """Current status of ``handle`` (terminal states are sticky)."""
        if handle.status is TransferStatus.PENDING and not handle.released:
            handle.status = _STATES[self._nixl("check_xfer_state", handle.xfer)]
        return handle.status

    def wait(self, handle: TransferHandle, timeout_s: float = 20.0) -> TransferStatus:
        """Poll until DONE/FAILED; raises ``TransferError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        spin_until = time.monotonic() + 0.01
        while (status := self.poll(handle)) is TransferStatus.PENDING:
            now = time.monotonic()
            if now > deadline:
                raise TransferError(f"transfer to {handle.peer!r} pending after {timeout_s}s")
            time.sleep(0 if now < spin_until else 0.001)
        return status

    def release(self, handle: TransferHandle) -> None:
        """Free the NIXL request (an in-flight one is cancelled if possible)."""
        if handle.released:
            return
        self._nixl("release_xfer_handle", handle.xfer)
        handle.released = True
        self._live = [h for h in self._live if h is not handle]

    def notifications(self) -> list[Notification]:
        """Drain notifications received since the last call."""
        self._check_open()
        notifs = self._nixl("get_new_notifs")
        return [Notification(peer, tag) for peer, tags in notifs.items() for tag in tags]

    def send_notif(self, peer: PeerHandle, tag: bytes) -> None:
        """Send a standalone notification (not tied to a transfer)."""
        self._check_open()
        self._nixl("send_notif", peer.name, tag)

    def close(self) -> None:
        """Release live transfers, drop remote agents, deregister memory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for h in list(self._live):
            _quietly(self.release, h)
        for name in list(self._peers):
            _quietly(self._nixl, "remove_remote_agent", name)
        for reg in self._regs:
            _quietly(self._nixl, "deregister_memory", reg, [self.backend])
        self._peers.clear()
        self._regs = []

    def _check_open(self) -> None:
        if self._closed:
            raise TransferError(f"endpoint {self.name!r} is closed")

    def _nixl(self, method: str, *args: object):
        with self._lock:
            try:
                return getattr(self._agent, method)(*args)
            except _NIXL_ERRORS as e:
                raise TransferError(f"NIXL {method} failed on {self.name!r}: {e!r}") from e


Transport = Callable[..., TransferEndpoint]
"""Builds an endpoint as ``transport(name, buffers, page_dims=...)``: ``TransferEndpoint`` (NIXL)
or ``engine.sim.SimEndpoint`` (in-process, the same methods and NIXL's ordering semantics)."""


def _quietly(fn, *args: object) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - best-effort teardown must not raise
        logger.warning("transfer teardown %s%r failed: %r", getattr(fn, "__name__", fn), args, e)


_STATES = {"DONE": TransferStatus.DONE, "PROC": TransferStatus.PENDING,
           "ERR": TransferStatus.FAILED}
