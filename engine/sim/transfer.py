"""The simulated transfer layer: in-process endpoints with the NIXL semantics the engines rely on.

``SimEndpoint`` has ``TransferEndpoint``'s methods. A ``write_pages`` is a one-sided WRITE: it is
validated like the real one (same ``page_ranges`` checks, same ``TransferError``s), then lands on
its own simulated thread after a virtual wire time, one buffer at a time (each landing is a
scheduling decision); the source pages are read when they land, as an RDMA read of the sender's
memory is. After the last byte the initiator's handle turns DONE and, at a later decision, the
tag reaches the peer: a notification never overtakes its data. Standalone notifications
(``send_notif``) travel on their own thread with a virtual latency, so they may overtake or
trail other WRITEs, as NIXL gives no order between different transfers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from engine.runtime import Runtime
from engine.transfer.endpoint import (
    EndpointBlob,
    Notification,
    PageWrite,
    PeerHandle,
    TransferError,
    TransferHandle,
    TransferStatus,
    buffer_infos,
    buffer_pair,
    check_layouts,
    page_ranges,
)


@dataclass(eq=False)
class Fabric:
    """The simulated network: endpoints by agent name, and the wire's virtual costs."""

    runtime: Runtime
    latency_s: float = 20e-6  # per WRITE or notification
    bytes_per_s: float = 10e9
    endpoints: dict[str, SimEndpoint] = field(default_factory=dict)

    def endpoint(self, name: str, buffers: Mapping[str, torch.Tensor],
                 page_dims: Mapping[str, int] | None = None) -> SimEndpoint:
        """A ``engine.transfer.Transport``: builds and registers ``name``'s endpoint."""
        if name in self.endpoints:
            raise TransferError(f"agent {name!r} already on the fabric")
        ep = SimEndpoint(self, name, buffers, page_dims)
        self.endpoints[name] = ep
        return ep


class SimEndpoint:
    """One simulated agent owning page buffers (layout rules of ``TransferEndpoint``)."""

    def __init__(self, fabric: Fabric, name: str, buffers: Mapping[str, torch.Tensor],
                 page_dims: Mapping[str, int] | None = None) -> None:
        self.fabric, self.name = fabric, name
        self._tensors = dict(buffers)
        self._infos = buffer_infos(buffers, page_dims)
        self._peers: dict[str, PeerHandle] = {}
        self._inbox: list[Notification] = []
        self._closed = False

    def blob(self) -> EndpointBlob:
        self._check_open()
        return EndpointBlob(self.name, self.name.encode(), dict(self._infos))

    def connect(self, peer: EndpointBlob) -> PeerHandle:
        self._check_open()
        check_layouts(self._infos, peer)
        if peer.agent_name not in self.fabric.endpoints:
            raise TransferError(f"no agent {peer.agent_name!r} on the fabric")
        handle = PeerHandle(peer.agent_name, peer)
        self._peers[peer.agent_name] = handle
        return handle

    def write_pages(self, peer: PeerHandle, requests: list[PageWrite],
                    notif: bytes = b"") -> TransferHandle:
        """Posts one WRITE of all ``requests``; ``notif`` reaches the peer after its data."""
        self._check_open()
        if peer.name not in self._peers:
            raise TransferError(f"peer {peer.name!r} is not connected")
        if not requests:
            raise TransferError("write_pages needs at least one PageWrite")
        nbytes = 0
        for req in requests:
            local, remote = buffer_pair(self._infos, peer, req.buffer)
            nbytes += sum(r.length for r in page_ranges(local, remote, req))
        handle = TransferHandle(peer.name, nbytes, len(requests), xfer=None)
        target = self.fabric.endpoints[peer.name]
        self.fabric.runtime.start_thread(lambda: self._wire(handle, target, requests, notif),
                                         f"wire {self.name}->{peer.name}")
        return handle

    def _wire(self, handle: TransferHandle, target: SimEndpoint, requests: list[PageWrite],
              notif: bytes) -> None:
        rt = self.fabric.runtime
        rt.sleep(self.fabric.latency_s + handle.nbytes / self.fabric.bytes_per_s)
        for req in requests:
            if target._closed or handle.released:
                handle.status = TransferStatus.FAILED
                return
            self._land(target, req)
            rt.point(f"landed {req.buffer}" + (f" L{req.layer}" if req.layer is not None else ""))
        handle.status = TransferStatus.DONE
        if notif:
            rt.point("notify")
            target._deliver(Notification(self.name, notif))

    def _land(self, target: SimEndpoint, req: PageWrite) -> None:
        src, dst = self._tensors[req.buffer], target._tensors[req.buffer]
        s, d = torch.tensor(req.src_pages), torch.tensor(req.dst_pages)
        if self._infos[req.buffer].page_dim == 0:
            dst[d] = src[s]  # [n, *inner]
        elif req.layer is None:
            dst[:, d] = src[:, s]  # [L, n, *inner]
        else:
            dst[req.layer, d] = src[req.layer, s]  # [n, *inner]

    def _deliver(self, note: Notification) -> None:
        if not self._closed:
            self._inbox.append(note)

    def poll(self, handle: TransferHandle) -> TransferStatus:
        return handle.status

    def wait(self, handle: TransferHandle, timeout_s: float = 20.0) -> TransferStatus:
        """Waits (virtual time) until DONE/FAILED; ``TransferError`` after ``timeout_s``."""
        done = self.fabric.runtime.wait_for(
            None, lambda: handle.status is not TransferStatus.PENDING, timeout_s)
        if not done:
            raise TransferError(f"transfer to {handle.peer!r} pending after {timeout_s}s")
        return handle.status

    def release(self, handle: TransferHandle) -> None:
        handle.released = True

    def has_notifications(self) -> bool:
        return bool(self._inbox)

    def notifications(self) -> list[Notification]:
        self._check_open()
        out, self._inbox = self._inbox, []
        return out

    def send_notif(self, peer: PeerHandle, tag: bytes) -> None:
        self._check_open()
        target = self.fabric.endpoints.get(peer.name)
        if target is None or peer.name not in self._peers:
            raise TransferError(f"peer {peer.name!r} is not connected")

        def travel() -> None:
            self.fabric.runtime.sleep(self.fabric.latency_s)
            target._deliver(Notification(self.name, tag))
        self.fabric.runtime.start_thread(travel, f"notif {self.name}->{peer.name}")

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise TransferError(f"endpoint {self.name!r} is closed")

