"""The PD control plane is closed (issue 14): a per-deployment secret on ``/disagg/*``, bodies
validated, preallocs only from connected peers and never onto another live room's pages, debug
routes closed without a token, bootstrap addresses limited to the deployment's prefills, rooms
unpredictable even when seeded, preallocs signed by their decode, numbered and time-limited
(issue 29); and the pair keeps serving correct responses afterwards."""

from __future__ import annotations

import httpx
import pytest

from engine.disagg.control import (
    CLOCK_SKEW_S,
    SECRET_ENV,
    SECRET_HEADER,
    PeerBook,
    RejectedPrealloc,
    check_prealloc,
)
from engine.disagg.messages import PeerIdentity, Prealloc
from engine.router import RouterConfig
from engine.router.app import Router
from workbench.deploy import launch_pd_pair
from workbench.drive import inject_concurrency

ROUTES = [("get", "/disagg/endpoint"), ("post", "/disagg/connect"), ("post", "/disagg/prealloc"),
          ("post", "/disagg/abort")]


def test_a_prealloc_must_come_from_a_peer_and_own_its_pages():
    live = {7: Prealloc(7, "decode-1", [4, 5, 6], 0)}
    check_prealloc(Prealloc(8, "decode-1", [7, 8], 1), {"decode-1"}, live)
    check_prealloc(Prealloc(8, "decode-2", [4, 5], 0), {"decode-1", "decode-2"}, live)
    bad = [(Prealloc(8, "forged", [7], 1), 409, "unknown peer"),
           (Prealloc(8, "decode-1", [6, 7], 1), 409, "live room 7"),
           (Prealloc(8, "decode-1", [9], 0), 409, "live room 7"),  # the aux slot is taken
           (Prealloc(8, "decode-1", [9, 9], 1), 400, "repeats"),
           (Prealloc(8, "decode-1", [], 1), 400, "bad page list"),
           (Prealloc(8, "decode-1", [-1], 1), 400, "bad page list")]
    for msg, status, text in bad:
        with pytest.raises(RejectedPrealloc, match=text) as exc:
            check_prealloc(msg, {"decode-1", "decode-2"}, live)
        assert exc.value.status == status


def test_router_rooms_are_unpredictable_even_when_seeded_and_its_secrets_are_not_logged():
    def rooms(seed):
        r = Router(RouterConfig(("http://127.0.0.1:1",), ("http://127.0.0.1:2",), seed))
        return [r.assign().room for _ in range(3)]
    assert rooms(5) != rooms(5)
    assert rooms(None) != rooms(None)
    cfg = RouterConfig(("http://127.0.0.1:1",), ("http://127.0.0.1:2",), 5,
                       debug_token="tok-" + "t" * 20, secret="sec-" + "s" * 20)
    assert "t" * 20 not in repr(cfg) and "s" * 20 not in repr(cfg)


def signed(room, seq, key, *, issued=1000.0, ttl=30.0, pages=(4, 5), peer="decode-1"):
    return Prealloc(room, peer, list(pages), 0, seq, issued, ttl).signed(key)


def test_a_prealloc_is_accepted_only_signed_by_its_bound_peer_fresh_and_once():
    key, other = b"k" * 32, b"o" * 32
    book = PeerBook()
    book.bind("decode-1", key)
    book.bind("decode-1", key)  # the same decode connecting again
    with pytest.raises(RejectedPrealloc, match="bound to another key"):
        book.bind("decode-1", other)
    book.accept(signed(1, 1, key), now=1000.5)
    bad = [(signed(2, 2, other), "not signed"),  # a forger with the shared secret only
           (signed(1, 1, key), "replays"),  # the same message again
           (signed(3, 1, key), "replays"),  # an older number
           (signed(4, 5, key, issued=900.0), "outside its validity"),  # expired
           (signed(5, 6, key, issued=1000.5 + CLOCK_SKEW_S + 1), "outside its validity"),
           (signed(6, 7, key, peer="decode-2"), "unknown peer")]
    for msg, why in bad:
        with pytest.raises(RejectedPrealloc, match=why):
            book.accept(msg, now=1000.5)
    tampered = Prealloc(**{**signed(7, 8, key).to_json(), "dst_pages": [9, 10]})
    with pytest.raises(RejectedPrealloc, match="not signed"):
        book.accept(tampered, now=1000.5)
    book.accept(Prealloc.from_json(signed(8, 9, key).to_json()), now=1000.5)  # wire round trip
    assert "key" not in repr(PeerIdentity("decode-1", key)) and "kkkk" not in repr(
        PeerIdentity("decode-1", key))


@pytest.mark.slow
@pytest.mark.servers
@pytest.mark.nixl
def test_forged_control_plane_calls_are_refused_and_the_pair_keeps_serving(tmp_path):
    with launch_pd_pair(log_dir=tmp_path / "logs") as pair:
        prefill, decode = pair.prefill[0], pair.decode[0]
        secret = prefill.env[SECRET_ENV]
        assert decode.env[SECRET_ENV] == secret and len(secret) >= 32
        with httpx.Client(base_url=prefill.url, timeout=10) as c:
            for method, path in ROUTES:  # no secret, or a wrong one: 401, nothing done
                body = {} if method == "post" else None
                assert c.request(method, path, json=body).status_code == 401, path
                r = c.request(method, path, json=body, headers={SECRET_HEADER: "x" * 48})
                assert r.status_code == 401, path
            ok = {SECRET_HEADER: secret}
            for path in ("/disagg/connect", "/disagg/prealloc", "/disagg/abort"):
                assert c.post(path, json={}, headers=ok).status_code == 400, path
                assert c.post(path, content=b"[1", headers=ok).status_code == 400, path
            forged = Prealloc(12345, "attacker", [0, 1, 2], 0).to_json()
            r = c.post("/disagg/prealloc", json=forged, headers=ok)
            assert r.status_code == 409 and "unknown peer" in r.json()["error"]
            assert c.post("/disagg/abort", json={"room": "1"}, headers=ok).status_code == 400
        for srv in (prefill, decode, pair.router):  # debug routes need the pair's token
            path = "/debug/rooms" if srv is pair.router else "/debug/config"
            assert httpx.get(srv.url + path).status_code == 401, srv.name
        ssrf = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "bootstrap_host": "127.0.0.1", "bootstrap_port": pair.router.port,
                "bootstrap_room": 99}
        r = httpx.post(decode.url + "/v1/chat/completions", json=ssrf, timeout=10)
        assert r.status_code == 401 and "PD router" in r.text  # no room without the secret
        r = httpx.post(decode.url + "/v1/chat/completions", json=ssrf, timeout=10,
                       headers={SECRET_HEADER: secret})
        assert r.status_code == 400 and "not an allowed prefill" in r.text
        res = inject_concurrency(pair, sessions=2, turns=2, seed=1, max_tokens=60,
                                 progress=False)
        queues = pair.debug("/debug/queues")
    s = res.summary
    assert s.completed == s.requests >= 4 and s.errors == 0 and s.flagged == 0
    assert queues["transfer"] == [] and queues["prealloc"] == []


def test_finished_rooms_are_forgotten_after_the_grace_and_failed_ones_stay_failed():
    from engine.disagg.state import RoomState, TransferStateTable

    table = TransferStateTable(grace_s=0.0)
    for room in range(100):
        table.update(room, RoomState.BOOTSTRAPPING)
        table.update(room, RoomState.SUCCESS if room % 2 else RoomState.FAILED)
    table.update(1000, RoomState.BOOTSTRAPPING)
    assert len(table) <= 2  # only the live room (and the last finished one) kept
    assert table.get(1000) is RoomState.BOOTSTRAPPING
    assert table.get(4) is RoomState.FAILED  # remembered; never resurrected
    assert table.update(4, RoomState.TRANSFERRING) is RoomState.FAILED
    assert table.get(5) is None
