"""The page transfer's typed messages and its byte-range planning, with no NIXL in them: which
pages of which buffer go where (``PageWrite``), the validated and coalesced byte ranges that
implement a write (``page_ranges``), and the layout checks both peers must pass. The buffer
invariant is ``engine.transfer.endpoint``'s."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

import torch

from engine.transfer.channel import BufferInfo, EndpointBlob, TransferError


class TransferStatus(Enum):
    """State of a posted transfer."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class PageWrite:
    """Copy ``src_pages[i]`` of the local buffer to ``dst_pages[i]`` of the peer's buffer.

    ``layer`` selects one flat outer index; ``None`` moves the pages of every outer index.
    """

    buffer: str
    src_pages: list[int]
    dst_pages: list[int]
    layer: int | None = None


@dataclass(frozen=True)
class Notification:
    """A tag received from the peer agent named ``peer``."""

    peer: str
    tag: bytes


@dataclass(frozen=True)
class PeerHandle:
    """A connected peer: its NIXL agent name and the blob it published."""

    name: str
    blob: EndpointBlob


@dataclass(frozen=True)
class ByteRange:
    """One descriptor pair: ``length`` bytes from local ``src`` to remote ``dst``."""

    src: int
    dst: int
    length: int


def coalesce(ranges: Iterable[ByteRange]) -> list[ByteRange]:
    """Merge consecutive ranges that are adjacent on both sides into one descriptor."""
    out: list[ByteRange] = []
    for r in ranges:
        last = out[-1] if out else None
        if last and last.src + last.length == r.src and last.dst + last.length == r.dst:
            out[-1] = ByteRange(last.src, last.dst, last.length + r.length)
        else:
            out.append(r)
    return out


def _check_pages(what: str, pages: list[int], num_pages: int) -> list[int]:
    try:
        pages = [operator.index(p) for p in pages]
    except TypeError as e:
        raise TransferError(f"{what} pages must be integers: {e}") from e
    bad = [p for p in pages if not 0 <= p < num_pages]
    if bad:
        raise TransferError(f"{what} pages {bad[:8]} out of range [0, {num_pages})")
    return pages


def page_ranges(local: BufferInfo, remote: BufferInfo, req: PageWrite) -> list[ByteRange]:
    """Validated, coalesced byte ranges implementing ``req``."""
    if len(req.src_pages) != len(req.dst_pages) or not req.src_pages:
        raise TransferError(
            f"{req.buffer!r}: need equal, non-empty src/dst page lists, got "
            f"{len(req.src_pages)} and {len(req.dst_pages)}")
    src = _check_pages(f"{req.buffer!r} src", req.src_pages, local.num_pages)
    dst = _check_pages(f"{req.buffer!r} dst", req.dst_pages, remote.num_pages)
    if len(set(dst)) != len(dst):
        raise TransferError(f"{req.buffer!r}: duplicate dst pages {dst}")
    if req.layer is not None and not 0 <= req.layer < local.n_outer:
        raise TransferError(f"{req.buffer!r}: layer {req.layer} out of range [0, {local.n_outer})")
    outers = range(local.n_outer) if req.layer is None else [req.layer]
    pairs = sorted(zip(src, dst, strict=True))
    return coalesce(
        ByteRange(local.page_addr(o, s), remote.page_addr(o, d), local.page_bytes)
        for o in outers for s, d in pairs)


def buffer_infos(buffers: Mapping[str, torch.Tensor],
                 page_dims: Mapping[str, int] | None) -> dict[str, BufferInfo]:
    """Each buffer's layout, its page dimension from ``page_dims`` (default 0); TransferError
    when ``page_dims`` names a buffer there is not."""
    dims = dict(page_dims or {})
    unknown = set(dims) - set(buffers)
    if unknown:
        raise TransferError(f"page_dims for unknown buffers {sorted(unknown)}")
    return {k: BufferInfo.from_tensor(k, t, dims.get(k, 0)) for k, t in buffers.items()}


def check_layouts(infos: Mapping[str, BufferInfo], peer: EndpointBlob) -> None:
    """TransferError unless every buffer both sides have is laid out compatibly."""
    for name, remote in peer.buffers.items():
        if name in infos:
            infos[name].check_compatible(remote)


def buffer_pair(infos: Mapping[str, BufferInfo], peer: PeerHandle,
                buffer: str) -> tuple[BufferInfo, BufferInfo]:
    """The local and the peer's layout of ``buffer``; TransferError when either side lacks it."""
    if buffer not in infos:
        raise TransferError(f"unknown local buffer {buffer!r}; have {sorted(infos)}")
    if buffer not in peer.blob.buffers:
        raise TransferError(f"peer {peer.name!r} has no buffer {buffer!r}")
    return infos[buffer], peer.blob.buffers[buffer]
