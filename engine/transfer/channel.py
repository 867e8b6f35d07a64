"""Side channel for the transfer layer: endpoint blobs and a tiny length-prefixed TCP exchange.

Wire format: every message is one frame, an 8-byte big-endian length followed by that many bytes
of UTF-8 JSON. A client sends ``{"op": "GET", "blob": <its blob or null>}`` and the server answers
with its own blob. Every socket operation has a bounded timeout; nothing here loops forever.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import queue
import socket
import struct
import threading
import time
from dataclasses import asdict, dataclass, field

import torch

logger = logging.getLogger(__name__)

_LEN = struct.Struct(">Q")
MAX_FRAME_BYTES = 64 << 20


class TransferError(RuntimeError):
    """Bad request (unknown buffer, page out of range, layout mismatch) or a NIXL failure."""


class ChannelError(TransferError):
    """Raised when the side channel cannot exchange a blob (timeout, bad frame, refused)."""


@dataclass(frozen=True)
class BufferInfo:
    """Layout of one registered buffer, as the peer needs it to address pages.

    The tensor is C-contiguous with shape ``[*outer, num_pages, *inner]`` (``page_dim`` is the
    index of ``num_pages``); ``n_outer = prod(outer)``. Page ``p`` of flat outer index ``o``
    (a layer) is the byte range ``base_addr + (o * num_pages + p) * page_bytes`` of length
    ``page_bytes``.
    """

    name: str
    base_addr: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    page_dim: int
    num_pages: int
    page_bytes: int
    n_outer: int
    device_id: int
    mem_type: str

    @classmethod
    def from_tensor(cls, name: str, t: torch.Tensor, page_dim: int) -> BufferInfo:
        """Layout of tensor ``t`` with pages along ``page_dim``; memory type from its device."""
        if not t.is_contiguous():
            raise TransferError(f"buffer {name!r} must be contiguous")
        if not 0 <= page_dim < t.dim() or t.numel() == 0:
            raise TransferError(f"buffer {name!r}: page_dim {page_dim} invalid for {t.shape}")
        shape = tuple(t.shape)
        return cls(
            name=name, base_addr=t.data_ptr(), nbytes=t.numel() * t.element_size(),
            shape=shape, dtype=str(t.dtype), page_dim=page_dim, num_pages=shape[page_dim],
            page_bytes=math.prod(shape[page_dim + 1:]) * t.element_size(),
            n_outer=math.prod(shape[:page_dim]), device_id=max(t.get_device(), 0),
            mem_type="DRAM" if t.device.type == "cpu" else "VRAM",
        )

    def check_compatible(self, remote: BufferInfo) -> None:
        """Raise ``TransferError`` unless both sides share dtype, page_dim and page shape."""
        mine = (self.dtype, self.page_dim, self.page_shape())
        theirs = (remote.dtype, remote.page_dim, remote.page_shape())
        if mine != theirs:
            raise TransferError(
                f"buffer {self.name!r} layout mismatch: local (dtype, page_dim, page shape) "
                f"{mine} vs peer {theirs}")

    def page_shape(self) -> tuple[int, ...]:
        """Shape with the page dimension removed: what must agree between peers."""
        return self.shape[: self.page_dim] + self.shape[self.page_dim + 1 :]

    def page_addr(self, outer: int, page: int) -> int:
        """Address of page ``page`` of flat outer index ``outer``."""
        return self.base_addr + (outer * self.num_pages + page) * self.page_bytes


@dataclass(frozen=True)
class EndpointBlob:
    """Everything a peer needs to talk to an endpoint: NIXL agent metadata plus buffer layouts."""

    agent_name: str
    agent_metadata: bytes
    buffers: dict[str, BufferInfo] = field(default_factory=dict)

    def to_json(self) -> dict:
        """Plain-types form (metadata base64-encoded)."""
        return {
            "agent_name": self.agent_name,
            "agent_metadata": base64.b64encode(self.agent_metadata).decode("ascii"),
            "buffers": {k: asdict(v) for k, v in self.buffers.items()},
        }

    @classmethod
    def from_json(cls, obj: dict) -> EndpointBlob:
        """Inverse of ``to_json``; raises ``ChannelError`` on a malformed object."""
        try:
            buffers = {}
            for name, b in obj["buffers"].items():
                buffers[name] = BufferInfo(**{**b, "shape": tuple(b["shape"])})
            meta = base64.b64decode(obj["agent_metadata"])
            return cls(agent_name=obj["agent_name"], agent_metadata=meta, buffers=buffers)
        except (KeyError, TypeError, ValueError) as e:
            raise ChannelError(f"malformed endpoint blob: {e!r}") from e


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ChannelError(f"peer closed after {got}/{n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def send_frame(sock: socket.socket, obj: dict) -> None:
    """Send one JSON object as a length-prefixed frame."""
    data = json.dumps(obj).encode("utf-8")
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_frame(sock: socket.socket) -> dict:
    """Receive one length-prefixed JSON frame (bounded by ``MAX_FRAME_BYTES``)."""
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > MAX_FRAME_BYTES:
        raise ChannelError(f"frame of {n} bytes exceeds limit {MAX_FRAME_BYTES}")
    try:
        return json.loads(_recv_exact(sock, n).decode("utf-8"))
    except ValueError as e:
        raise ChannelError(f"bad frame: {e!r}") from e


class MetadataChannel:
    """Serves this endpoint's blob to peers and collects the blobs they send along.

    ``serve`` binds (port 0 picks a free port), starts a daemon thread and returns the port.
    Blobs received from clients are queued; take them with ``wait_for_peer``.
    """

    def __init__(self, blob: EndpointBlob, timeout_s: float = 5.0) -> None:
        self._blob = blob.to_json()
        self._timeout_s = timeout_s
        self._peers: queue.Queue[EndpointBlob] = queue.Queue()
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Start answering requests on ``host:port``; returns the bound port."""
        if self._sock is not None:
            raise ChannelError("channel already serving")
        sock = socket.create_server((host, port))
        sock.settimeout(0.1)
        self._sock, self.port = sock, sock.getsockname()[1]
        self._thread = threading.Thread(target=self._loop, name="metadata-channel", daemon=True)
        self._thread.start()
        logger.info("metadata channel serving on %s:%d", host, self.port)
        return self.port

    def _loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # accept timeout, or the socket was closed
                continue
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(self._timeout_s)
        try:
            req = recv_frame(conn)
            if req.get("op") != "GET":
                raise ChannelError(f"unknown op {req.get('op')!r}")
            if req.get("blob") is not None:
                self._peers.put(EndpointBlob.from_json(req["blob"]))
            send_frame(conn, self._blob)
        except (ChannelError, OSError) as e:
            logger.warning("metadata channel request failed: %s", e)

    def wait_for_peer(self, timeout_s: float = 20.0) -> EndpointBlob:
        """Next blob a client sent, waiting at most ``timeout_s``."""
        try:
            return self._peers.get(timeout=timeout_s)
        except queue.Empty as e:
            raise ChannelError(f"no peer blob within {timeout_s:.1f}s") from e

    def close(self) -> None:
        """Stop the server thread and close the socket (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def fetch_peer(
    host: str, port: int, my_blob: EndpointBlob | None = None, timeout_s: float = 20.0
) -> EndpointBlob:
    """Fetch the blob served at ``host:port``, handing over ``my_blob`` in the same request.

    Retries refused connections (the server may still be starting) until ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    req = {"op": "GET", "blob": None if my_blob is None else my_blob.to_json()}
    last: Exception | None = None
    while time.monotonic() < deadline:
        left = max(0.05, deadline - time.monotonic())
        try:
            with socket.create_connection((host, port), timeout=left) as sock:
                sock.settimeout(left)
                send_frame(sock, req)
                return EndpointBlob.from_json(recv_frame(sock))
        except (ConnectionRefusedError, ConnectionResetError) as e:
            last = e
            time.sleep(0.05)
        except (OSError, ChannelError) as e:
            raise ChannelError(f"fetch from {host}:{port} failed: {e!r}") from e
    raise ChannelError(f"fetch from {host}:{port} timed out after {timeout_s:.1f}s: {last!r}")
