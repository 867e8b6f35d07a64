"""Real two-process NIXL tests for engine.transfer.

The test process owns a "prefill" source endpoint; a child process started from this very file
(``python tests/test_transfer.py --child``) owns a "decode" destination endpoint. For every
round the parent WRITEs pages with the round name as notification tag; the child checks that
exactly the chosen destination pages changed (bit-exact), resets its buffers and answers with a
JSON notification. Every wait is bounded and the child is always terminated.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from engine.transfer.endpoint import (
    BufferInfo,
    ByteRange,
    ChannelError,
    EndpointBlob,
    MetadataChannel,
    PageWrite,
    TransferEndpoint,
    TransferError,
    TransferStatus,
    coalesce,
    fetch_peer,
)

TIMEOUT_S = 20.0
CHILD_LIFETIME_S = 90.0
SRC_PAGES, DST_PAGES = 8, 12  # the decode pool may be larger than the prefill pool
SENTINEL = 0xAB
PAGE_DIMS = {"kv": 1, "idx": 1, "scale": 0}
REPO = Path(__file__).resolve().parents[1]

ROUNDS: dict[str, list[PageWrite]] = {
    "kv_one_layer": [PageWrite("kv", [0, 1, 2, 5], [3, 4, 5, 11], layer=1)],
    "kv_all_layers": [PageWrite("kv", [7, 6], [0, 1])],
    "kv_full_pool": [PageWrite("kv", list(range(SRC_PAGES)), list(range(SRC_PAGES)))],
    "bf16_and_uint8": [PageWrite("idx", [1, 2, 3], [9, 10, 11], layer=0),
                       PageWrite("scale", [0, 4], [6, 2])],
}
EXPECTED_DESCS = {"kv_one_layer": 2, "kv_all_layers": 4, "kv_full_pool": 2, "bf16_and_uint8": 3}


def make_buffers(num_pages: int, source: bool) -> dict[str, torch.Tensor]:
    """KV float32 [2, P, 4, 16], index-K bf16 [2, P, 4, 8], scales uint8 [P, 32].

    Sources hold seeded random bytes; destinations hold ``SENTINEL`` bytes.
    """
    shapes = {"kv": ((2, num_pages, 4, 16), torch.float32),
              "idx": ((2, num_pages, 4, 8), torch.bfloat16),
              "scale": ((num_pages, 32), torch.uint8)}
    gen = torch.Generator().manual_seed(1234)
    out = {}
    for name, (shape, dtype) in shapes.items():
        t = torch.empty(shape, dtype=dtype)
        raw = as_bytes(t)
        if source:
            raw.copy_(torch.randint(0, 256, raw.shape, generator=gen, dtype=torch.uint8))
        else:
            raw.fill_(SENTINEL)
        out[name] = t
    return out


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Flat uint8 view sharing storage with ``t``."""
    return t.view(-1).view(torch.uint8)


def page_bytes_view(t: torch.Tensor, info: BufferInfo) -> torch.Tensor:
    """[n_outer, num_pages, page_bytes] uint8 view."""
    return as_bytes(t).view(info.n_outer, info.num_pages, info.page_bytes)


def expected_after(round_name: str, dst: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the destination buffers must hold after ``round_name`` lands on fresh buffers."""
    src = make_buffers(SRC_PAGES, source=True)
    want = {k: v.clone() for k, v in dst.items()}
    for req in ROUNDS[round_name]:
        s_info = BufferInfo.from_tensor(req.buffer, src[req.buffer], PAGE_DIMS[req.buffer])
        d_info = BufferInfo.from_tensor(req.buffer, want[req.buffer], PAGE_DIMS[req.buffer])
        s_view = page_bytes_view(src[req.buffer], s_info)
        d_view = page_bytes_view(want[req.buffer], d_info)
        outers = range(s_info.n_outer) if req.layer is None else [req.layer]
        for o in outers:
            for s, d in zip(req.src_pages, req.dst_pages, strict=True):
                d_view[o, d] = s_view[o, s]
    return want


def verify_round(round_name: str, dst: dict[str, torch.Tensor]) -> list[str]:
    """Mismatching (buffer, outer, page) triples, empty when the round landed exactly."""
    want = expected_after(round_name, make_buffers(DST_PAGES, source=False))
    bad = []
    for name, got in dst.items():
        info = BufferInfo.from_tensor(name, got, PAGE_DIMS[name])
        diff = (page_bytes_view(got, info) != page_bytes_view(want[name], info)).any(dim=-1)
        bad += [f"{name}[{o}, {p}]" for o, p in diff.nonzero().tolist()]
    return bad


def done_round_bad(r: str, dst: dict[str, torch.Tensor]) -> list[str]:
    """Layers of DONE_WRITE's destination pages not holding round ``r``'s byte everywhere."""
    view = as_bytes(dst["kv"]).view(2, DST_PAGES, -1)
    want = done_round_byte(int(r))
    return [f"kv[{o}, {p}]" for o in range(2) for p in DONE_WRITE.dst_pages
            if not bool((view[o, p] == want).all())]


def done_round_byte(r: int) -> int:
    return r % 200 + 1


DONE_WRITE = PageWrite("kv", [7, 6], [0, 1])  # per layer, with the round's byte everywhere


def child_main() -> int:
    """Destination side: serve the blob, verify each round, reply, exit on ``quit``."""
    dst = make_buffers(DST_PAGES, source=False)
    with TransferEndpoint("decode-test", dst, page_dims=PAGE_DIMS) as ep:
        channel = MetadataChannel(ep.blob())
        print(f"PORT {channel.serve()}", flush=True)
        peer = ep.connect(channel.wait_for_peer(TIMEOUT_S))
        channel.close()
        deadline = time.monotonic() + CHILD_LIFETIME_S
        layer_notes: dict[str, int] = {}
        while time.monotonic() < deadline:
            for n in ep.notifications():
                if n.tag == b"quit":
                    return 0
                tag = n.tag.decode()
                if tag.startswith("L:"):  # a layer WRITE's notification: only counted
                    layer_notes[tag.split(":")[2]] = layer_notes.get(tag.split(":")[2], 0) + 1
                    continue
                if tag.startswith("D:"):  # the sender's done: every layer's bytes must be here
                    r = tag[2:]
                    ep.send_notif(peer, json.dumps({"tag": tag, "bad": done_round_bad(r, dst),
                                                    "notes_before": layer_notes.get(r, 0)})
                                  .encode())
                    continue
                reply = {"tag": n.tag.decode(), "peer": n.peer}
                if n.tag != b"ping":
                    reply["bad"] = verify_round(n.tag.decode(), dst)
                    for name, t in make_buffers(DST_PAGES, source=False).items():
                        dst[name].copy_(t)
                ep.send_notif(peer, json.dumps(reply).encode())
            time.sleep(0.002)
    return 1


@dataclasses.dataclass
class Session:
    """The parent's endpoint connected to the child's."""

    ep: TransferEndpoint
    peer: object
    proc: subprocess.Popen
    lines: queue.Queue


def _read_port(lines: queue.Queue, proc: subprocess.Popen) -> int:
    seen, deadline = [], time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        seen.append(line)
        if line.startswith("PORT "):
            return int(line.split()[1])
    raise RuntimeError(f"child gave no port (rc={proc.poll()}):\n{''.join(seen)}")


@pytest.fixture(scope="module")
def session():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, __file__, "--child"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    src = make_buffers(SRC_PAGES, source=True)
    src["src_only"] = torch.zeros(4, 16, dtype=torch.uint8)
    ep = TransferEndpoint("prefill-test", src, page_dims=PAGE_DIMS)
    try:
        port = _read_port(lines, proc)
        peer = ep.connect(fetch_peer("127.0.0.1", port, ep.blob(), TIMEOUT_S))
        yield Session(ep, peer, proc, lines)
        ep.send_notif(peer, b"quit")
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        ep.close()


def wait_reply(s: Session, tag: str) -> dict:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        for n in s.ep.notifications():
            reply = json.loads(n.tag)
            if reply["tag"] == tag:
                return reply
        time.sleep(0.002)
    raise TimeoutError(f"no reply to {tag!r} within {TIMEOUT_S}s")


@pytest.mark.slow
@pytest.mark.nixl
@pytest.mark.parametrize("round_name", list(ROUNDS))
def test_pages_land_exactly(session: Session, round_name: str) -> None:
    h = session.ep.write_pages(session.peer, ROUNDS[round_name], notif=round_name.encode())
    assert h.num_descs == EXPECTED_DESCS[round_name]
    assert session.ep.wait(h, TIMEOUT_S) is TransferStatus.DONE
    session.ep.release(h)
    reply = wait_reply(session, round_name)
    assert reply["peer"] == "prefill-test"
    assert reply["bad"] == []


@pytest.mark.slow
@pytest.mark.nixl
def test_verifier_catches_wrong_pages(session: Session) -> None:
    """Sanity check of the checker itself: pages of one round announced as another."""
    h = session.ep.write_pages(session.peer, ROUNDS["kv_all_layers"], notif=b"kv_one_layer")
    assert session.ep.wait(h, TIMEOUT_S) is TransferStatus.DONE
    session.ep.release(h)
    bad = wait_reply(session, "kv_one_layer")["bad"]
    assert "kv[0, 0]" in bad and "kv[1, 3]" in bad


@pytest.mark.slow
@pytest.mark.nixl
def test_standalone_notif(session: Session) -> None:
    session.ep.send_notif(session.peer, b"ping")
    assert wait_reply(session, "ping")["peer"] == "prefill-test"


BAD_REQUESTS = {
    "unknown local buffer": PageWrite("nope", [0], [0]),
    "has no buffer": PageWrite("src_only", [0], [0]),
    r"src pages \[8\] out of range": PageWrite("kv", [8], [0]),
    r"dst pages \[12\] out of range": PageWrite("kv", [0], [12]),
    r"src pages \[-1\] out of range": PageWrite("kv", [-1], [0]),
    "layer 2 out of range": PageWrite("kv", [0], [0], layer=2),
    "layer 1 out of range": PageWrite("scale", [0], [0], layer=1),
    "equal, non-empty": PageWrite("kv", [0, 1], [0]),
    "duplicate dst": PageWrite("kv", [0, 1], [3, 3]),
    "must be integers": PageWrite("kv", [0.5], [1]),
}


@pytest.mark.slow
@pytest.mark.nixl
@pytest.mark.parametrize("match", list(BAD_REQUESTS))
def test_bad_requests_raise(session: Session, match: str) -> None:
    with pytest.raises(TransferError, match=match):
        session.ep.write_pages(session.peer, [BAD_REQUESTS[match]], notif=b"never")


@pytest.mark.slow
@pytest.mark.nixl
def test_layout_mismatch_rejected(session: Session) -> None:
    blob = session.peer.blob
    kv = dataclasses.replace(blob.buffers["kv"], shape=(2, DST_PAGES, 4, 8))
    bad = dataclasses.replace(blob, buffers={**blob.buffers, "kv": kv})
    with pytest.raises(TransferError, match="layout mismatch"):
        session.ep.connect(bad)


def test_coalesce_merges_only_adjacent_on_both_sides() -> None:
    ranges = [ByteRange(0, 100, 10), ByteRange(10, 110, 10), ByteRange(20, 200, 10),
              ByteRange(30, 210, 5)]
    assert coalesce(ranges) == [ByteRange(0, 100, 20), ByteRange(20, 200, 15)]


def test_buffer_info_layout_and_errors() -> None:
    t = torch.zeros(3, 5, 4, 2, dtype=torch.bfloat16)
    info = BufferInfo.from_tensor("kv", t, page_dim=1)
    assert (info.n_outer, info.num_pages, info.page_bytes, info.mem_type) == (3, 5, 16, "DRAM")
    assert info.page_addr(2, 3) == t[2, 3].data_ptr()
    with pytest.raises(TransferError, match="contiguous"):
        BufferInfo.from_tensor("x", t.transpose(0, 1), page_dim=0)
    with pytest.raises(TransferError, match="page_dim"):
        BufferInfo.from_tensor("x", t, page_dim=4)


def test_closed_endpoint_rejects_calls() -> None:
    ep = TransferEndpoint("closing-test", {"b": torch.zeros(2, 4)})
    assert set(ep.blob().buffers) == {"b"}
    ep.close()
    ep.close()
    with pytest.raises(TransferError, match="closed"):
        ep.blob()


def test_blob_json_roundtrip() -> None:
    info = BufferInfo.from_tensor("kv", torch.zeros(2, 4, 8), page_dim=1)
    blob = EndpointBlob("a", b"\x00meta\xff", {"kv": info})
    assert EndpointBlob.from_json(json.loads(json.dumps(blob.to_json()))) == blob
    with pytest.raises(ChannelError, match="malformed"):
        EndpointBlob.from_json({"agent_name": "a"})


def test_channel_exchange_and_timeouts() -> None:
    mine, theirs = EndpointBlob("srv", b"m1"), EndpointBlob("cli", b"m2")
    channel = MetadataChannel(mine)
    try:
        port = channel.serve()
        assert fetch_peer("127.0.0.1", port, theirs, timeout_s=5) == mine
        assert channel.wait_for_peer(timeout_s=5) == theirs
        with pytest.raises(ChannelError, match="no peer blob"):
            channel.wait_for_peer(timeout_s=0.1)
    finally:
        channel.close()
    start = time.monotonic()
    with pytest.raises(ChannelError, match="timed out"):
        fetch_peer("127.0.0.1", port, None, timeout_s=0.3)
    assert time.monotonic() - start < 2.0


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    sys.exit(child_main())


LISTENERS = """
import os, torch
from engine.transfer.endpoint import TransferEndpoint
ep = TransferEndpoint("listen-test", {"b": torch.zeros(2, 4)})
links = []
for fd in os.listdir("/proc/self/fd"):
    try:
        links.append(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:  # the listing's own descriptor, closed by now
        pass
inodes = {int(x[8:-1]) for x in links if x.startswith("socket:[")}
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and int(f[9]) in inodes:  # LISTEN, owned by this process
            print("LISTEN", f[1].split(":")[0])
ep.close()
"""


def test_ucx_listens_on_loopback_only() -> None:
    env = {k: v for k, v in os.environ.items() if k != "UCX_NET_DEVICES"}
    out = subprocess.run([sys.executable, "-c", LISTENERS], capture_output=True, text=True,
                         timeout=60, env=env, check=True).stdout.splitlines()
    out = [ln.split()[1] for ln in out if ln.startswith("LISTEN ")]  # NIXL logs to stdout too
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 (hex, LE)
    assert out and set(out) <= loopback, out


@pytest.mark.slow
@pytest.mark.nixl
def test_done_after_completed_writes_means_the_bytes_landed(session: Session) -> None:
    """The prefill's protocol: one WRITE per layer (each with its notification), wait for every
    handle, then a separate ``done`` notification. At the moment the receiver sees ``done``,
    every layer's bytes are in its pages, even when ``done`` overtook layer notifications (NIXL
    orders neither). So a layer notification arriving after the decode freed a room's pages on
    ``done`` is a late notification, not a late write (issue 14: the fixed variant's
    ``late_writes`` under kills)."""
    src = session.ep._tensors["kv"]  # the registered source tensor, rewritten each round
    rounds, overtaken = 150, 0
    for r in range(rounds):
        as_bytes(src).view(2, SRC_PAGES, -1)[:, DONE_WRITE.src_pages] = done_round_byte(r)
        handles = [session.ep.write_pages(session.peer, [dataclasses.replace(
            DONE_WRITE, layer=layer)], notif=f"L:{layer}:{r}".encode()) for layer in range(2)]
        assert all(session.ep.wait(h, TIMEOUT_S) is TransferStatus.DONE for h in handles)
        for h in handles:
            session.ep.release(h)
        session.ep.send_notif(session.peer, f"D:{r}".encode())
        reply = wait_reply(session, f"D:{r}")
        assert reply["bad"] == [], (r, reply)
        overtaken += reply["notes_before"] < 2
    print(f"done overtook a layer notification in {overtaken}/{rounds} rounds; "
          f"bytes complete at done in {rounds}/{rounds}")


def _api_module():
    from nixl._api import nixl_agent

    return sys.modules[nixl_agent.__module__]


def test_pacing_floors_the_progress_delay_of_new_agents_and_zero_restores_nixl() -> None:
    from engine.transfer.progress import DEFAULT_DELAY_US, pace

    api = _api_module()
    try:
        pace(api, 2500)
        cfg = api.nixlBind.nixlAgentConfig()
        cfg.pthrDelay = 0  # what nixl_agent.__init__ writes
        assert cfg.pthrDelay == 2500
        cfg.pthrDelay = 9000
        assert cfg.pthrDelay == 9000
        assert api.nixlBind.nixlAgent is api.nixlBind._real.nixlAgent  # the rest passes through
        pace(api, 0)
        assert type(api.nixlBind).__name__ == "module"
        assert api.nixlBind.nixlAgentConfig().pthrDelay == 0
        with pytest.raises(ValueError, match=">= 0"):
            pace(api, -1)
    finally:
        pace(api, DEFAULT_DELAY_US)


def test_delay_env_is_checked() -> None:
    from engine.transfer.progress import DEFAULT_DELAY_US, DELAY_ENV, delay_from_env

    assert delay_from_env({}) == DEFAULT_DELAY_US and delay_from_env({DELAY_ENV: "0"}) == 0
    with pytest.raises(ValueError, match=DELAY_ENV):
        delay_from_env({DELAY_ENV: "1ms"})


SITE_CHECK = """
import sys
from nixl._api import nixl_agent
api = sys.modules[nixl_agent.__module__]
cfg = api.nixlBind.nixlAgentConfig()
cfg.pthrDelay = 0
print(type(api.nixlBind).__name__, cfg.pthrDelay)
"""


@pytest.mark.parametrize("delay, want", [("250", "_PacedBindings 250"), ("0", "module 0")])
def test_vllm_site_hook_paces_nixl_when_it_is_imported(delay: str, want: str) -> None:
    """The sitecustomize a vLLM server runs with paces whichever ``nixl*._api`` loads, lazily."""
    site = Path(__file__).resolve().parents[1] / "workbench" / "deploy" / "vllm_site"
    env = {**os.environ, "PYTHONPATH": str(site), "PDWB_NIXL_PROGRESS_DELAY_US": delay}
    out = subprocess.run([sys.executable, "-c", SITE_CHECK], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == want
