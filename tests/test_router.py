"""The PD router as a real subprocess in front of two real upstream HTTP servers.

``tests/support/upstream_app.py`` plays prefill and decode: it records every body it gets (bootstrap
fields included) and whether its client went away, and shows them at ``GET /seen``. Routers:
``main`` (seed 7) and ``twin`` (seed 7 too, but half its servers are a dead port) still draw
different, unpredictable rooms; ``hasty`` (seed 11) times out after 1 s. Every wait is bounded,
every process stopped.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from support.metrics_check import metric_families
from support.upstream_app import sse_chunk

from engine.registry import UnknownVariantError
from engine.router.cli import main as router_main
from engine.router.state import RandomChoice, RoomAssignment, RoomLog, RoundRobin, RouterConfig
from workbench.deploy.process import ServerProcess, free_port, python_module

pytestmark = [pytest.mark.slow, pytest.mark.servers]
UPSTREAM = str(Path(__file__).parent / "support" / "upstream_app.py")
DEAD = f"http://127.0.0.1:{free_port()}"
MESSAGES = [{"role": "user", "content": "hi"}]


def seeded_rooms(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(63) for _ in range(n)]


def router(name: str, log_dir: Path, prefill: list[str], decode: list[str], seed: int,
           timeout_s: float, health_s: float = 1.0) -> ServerProcess:
    return ServerProcess(name, python_module(
        "engine.router", "--port", "{port}", "--seed", str(seed), "--timeout-s", str(timeout_s),
        "--debug-open", "--health-interval-s", str(health_s),
        "--prefill", *prefill, "--decode", *decode), log_dir)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("router-logs")
    up = {n: ServerProcess(n, [sys.executable, UPSTREAM, "--port", "{port}", "--name", n], logs)
          for n in ("prefill", "decode")}
    p, d = up["prefill"].url, up["decode"].url
    procs = {**up, "main": router("main", logs, [p], [d], 7, 30),
             "twin": router("twin", logs, [DEAD, p], [d, DEAD], 7, 30, health_s=0),
             "hasty": router("hasty", logs, [p], [d], 11, 1)}
    with contextlib.ExitStack() as stack:
        for proc in procs.values():
            stack.callback(proc.stop)
            proc.start()
        for proc in procs.values():
            proc.wait_healthy(timeout=30)
        with httpx.Client(timeout=10, trust_env=False) as client:
            yield {k: v.url for k, v in procs.items()}, client


def seen(cluster, role: str, tag: str) -> dict | None:
    urls, client = cluster
    hits = [s for s in client.get(urls[role] + "/seen").json() if s["body"].get("tag") == tag]
    return hits[-1] if hits else None


def wait_for(check, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while (value := check()) is None or value is False:
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return value


def rooms(cluster, name: str) -> list[dict]:
    urls, client = cluster
    return client.get(urls[name] + "/debug/rooms", params={"limit": 4096}).json()


def chat(cluster, name: str, **body) -> httpx.Response:
    urls, client = cluster
    body.setdefault("tag", uuid.uuid4().hex)
    return client.post(urls[name] + "/v1/chat/completions", json={"messages": MESSAGES, **body})


def test_config_and_policies_in_process(capsys):
    with pytest.raises(UnknownVariantError, match="valid: random, round_robin"):
        RouterConfig(("http://a:1",), ("http://b:2",), policy="fastest")
    with pytest.raises(ValueError, match="http"):
        RouterConfig(("a:1",), ("http://b:2",))
    with pytest.raises(SystemExit):
        router_main(["--prefill", "http://a:1", "--decode", "http://b:2", "--policy", "nope"])
    assert "valid: random, round_robin" in capsys.readouterr().err
    rr = RoundRobin(random.Random(0))
    assert [rr.pick(["x", "y"]) for _ in range(3)] == ["x", "y", "x"]
    picks = [[RandomChoice(random.Random(3)).pick("abcd") for _ in range(2)] for _ in range(2)]
    assert picks[0] == picks[1]
    log = RoomLog(2)
    for room in range(3):
        log.add(RoomAssignment(room, "p", "d", started=0.0))
    log.finish(2, 200)
    log.finish(2, 499)
    assert [(a.room, a.status) for a in log.recent(10)] == [(1, None), (2, 200)]


def test_stream_passes_through_and_both_get_one_room(cluster):
    urls, client = cluster
    tag, t0, arrivals = uuid.uuid4().hex, time.monotonic(), []
    body = {"messages": MESSAGES, "tag": tag, "stream": True, "chunks": 5,
            "chunk_delay_s": 0.15, "stream_options": {"include_usage": True}}
    with client.stream("POST", urls["main"] + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        room = int(resp.headers["x-bootstrap-room"])
        for raw in resp.iter_raw():
            arrivals.append((time.monotonic() - t0, raw))
    data = b"".join(raw for _, raw in arrivals).decode()
    body_seen = {"bootstrap_room": room}
    assert data == "".join(sse_chunk("decode", body_seen, i) for i in range(5)) + "data: [DONE]\n\n"
    first = next(t for t, raw in arrivals if b'"i": 0' in raw)
    last = next(t for t, raw in arrivals if b'"i": 4' in raw)
    assert last - first > 0.35, f"stream was buffered, not passed through: {arrivals}"
    pre, dec = wait_for(lambda: seen(cluster, "prefill", tag)), seen(cluster, "decode", tag)
    boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": int(urls["prefill"].rsplit(":")[-1]),
            "bootstrap_room": room}
    assert {k: pre["body"][k] for k in boot} == boot == {k: dec["body"][k] for k in boot}
    assert pre["body"]["stream"] is False and "stream_options" not in pre["body"]
    assert dec["body"]["stream"] is True and dec["body"]["stream_options"] == body["stream_options"]
    assert pre["body"]["messages"] == dec["body"]["messages"] == MESSAGES and dec["done"]
    entry = next(a for a in rooms(cluster, "main") if a["room"] == room)
    assert (entry["prefill"], entry["decode"], entry["status"]) == (urls["prefill"],
                                                                   urls["decode"], 200)
    assert entry["finished"] >= entry["started"]


def test_non_streaming_answers_decode_json(cluster):
    resp = chat(cluster, "main")
    assert resp.status_code == 200
    assert resp.json()["from"] == "decode"
    assert resp.json()["room"] == int(resp.headers["x-bootstrap-room"])


def test_decode_error_status_and_body_are_forwarded(cluster):
    for stream in (False, True):
        resp = chat(cluster, "main", status=422, stream=stream)
        assert resp.status_code == 422
        assert resp.json()["error"]["message"] == "decode says no"
        assert "x-bootstrap-room" in resp.headers
    metrics = cluster[1].get(cluster[0]["main"] + "/metrics").text
    assert 'reason="http_422",role="decode"' in metrics


def test_bad_json_is_400_and_draws_no_room(cluster):
    urls, client = cluster
    before = len(rooms(cluster, "main"))
    for raw, why in ((b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object"),
                     (b'{"a": NaN}', "NaN"), (b'{"a": "\\udfff"}', "surrogate"),
                     (b'{"a":' + b"[" * 2000 + b"]" * 2000 + b"}", "not valid JSON")):
        resp = client.post(urls["main"] + "/v1/chat/completions", content=raw)
        assert resp.status_code == 400
        err = resp.json()["error"]
        assert why in err["message"] and err["type"] == "invalid_request_error"
        assert err["code"] == 400
    big = client.post(urls["main"] + "/v1/chat/completions", content=b"{" + b" " * (9 << 20))
    assert big.status_code == 413 and big.json()["error"]["code"] == 413
    assert len(rooms(cluster, "main")) == before


def test_rooms_are_unpredictable_even_for_routers_with_the_same_seed(cluster):
    heads = {name: [int(chat(cluster, name).headers["x-bootstrap-room"]) for _ in range(3)]
             for name in ("main", "twin", "hasty")}
    logs = {name: [a["room"] for a in rooms(cluster, name)] for name in heads}
    for name, seed in (("main", 7), ("twin", 7), ("hasty", 11)):
        assert logs[name][-3:] == heads[name]
        assert not set(logs[name]) & set(seeded_rooms(seed, 4096))  # never the seed's sequence
    every = [r for log in logs.values() for r in log]
    assert len(set(every)) == len(every) and all(0 <= r < 2**63 for r in every)


def test_unreachable_upstream_is_502_naming_it(cluster):
    urls, client = cluster
    tags = [uuid.uuid4().hex for _ in range(2)]
    answers = {tag: chat(cluster, "twin", tag=tag, delay_s=1.0) for tag in tags}
    log = {a["room"]: a for a in rooms(cluster, "twin")}
    for tag, resp in answers.items():
        assert resp.status_code == 502
        a = log[int(resp.headers["x-bootstrap-room"])]
        role, live = ("prefill", "decode") if a["prefill"] == DEAD else ("decode", "prefill")
        assert f"cannot reach {role} server {DEAD}" in resp.json()["error"]["message"]
        assert a["status"] == 502
        if seen(cluster, live, tag) is not None:  # it got the request, so it saw the cancel
            wait_for(lambda live=live, tag=tag: seen(cluster, live, tag)["disconnected"])
    metrics = client.get(urls["twin"] + "/metrics").text
    for role in ("prefill", "decode"):
        assert f'reason="connect",role="{role}",server="{DEAD}"' in metrics


def test_slow_upstream_times_out_as_504(cluster):
    resp = chat(cluster, "hasty", delay_s=5)
    assert resp.status_code == 504
    assert "timed out after 1s" in resp.json()["error"]["message"]


def test_client_gone_mid_stream_cancels_both_upstreams(cluster):
    urls, client = cluster
    tag, got = uuid.uuid4().hex, 0
    body = {"messages": MESSAGES, "tag": tag, "stream": True, "chunks": 400,
            "chunk_delay_s": 0.05, "delay_s": 60}
    with client.stream("POST", urls["main"] + "/v1/chat/completions", json=body) as resp:
        room = int(resp.headers["x-bootstrap-room"])
        for line in resp.iter_lines():
            got += line.startswith("data:")
            if got == 2:
                break
    assert_cancelled(cluster, tag, room)


def test_client_gone_while_waiting_cancels_both_upstreams(cluster):
    urls, _ = cluster
    tag = uuid.uuid4().hex
    with httpx.Client(timeout=0.5, trust_env=False) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post(urls["main"] + "/v1/chat/completions",
                       json={"messages": MESSAGES, "tag": tag, "delay_s": 60})
    room = wait_for(lambda: seen(cluster, "decode", tag))["body"]["bootstrap_room"]
    assert_cancelled(cluster, tag, room)


def assert_cancelled(cluster, tag: str, room: int) -> None:
    urls, client = cluster
    for role in ("prefill", "decode"):
        rec = wait_for(lambda role=role: seen(cluster, role, tag), timeout=3)
        assert rec["body"]["bootstrap_room"] == room
        wait_for(lambda role=role: seen(cluster, role, tag)["disconnected"], timeout=3)
        assert not seen(cluster, role, tag)["done"]
    entry = wait_for(lambda: next((a for a in rooms(cluster, "main")
                                   if a["room"] == room and a["status"]), None), timeout=3)
    assert entry["status"] == 499
    wait_for(lambda: "pdwb_router_in_flight_requests 0" in
             client.get(urls["main"] + "/metrics").text, timeout=3)


def test_health_models_and_metrics(cluster):
    urls, client = cluster
    health = client.get(urls["main"] + "/health").json()
    assert health["status"] == "ok" and all(u["healthy"] for u in health["upstreams"])
    assert client.get(urls["main"] + "/v1/models").json()["data"][0]["id"] == "decode"
    chat(cluster, "main")
    metrics = client.get(urls["main"] + "/metrics").text
    assert 'pdwb_router_requests_total{status="200"}' in metrics
    assert metric_families(urls["main"])["pdwb_router_requests"].type == "counter"
    assert "# TYPE pdwb_router_in_flight_requests gauge" in metrics
    assert client.get(urls["main"] + "/debug/rooms", params={"limit": 1}).json()[0]["status"]


def _upstream_health(client: httpx.Client, url: str, server: str) -> bool:
    return next(u["healthy"] for u in client.get(url + "/health").json()["upstreams"]
                if u["url"] == server)


def test_router_skips_an_unhealthy_server_and_resumes_when_it_is_back(tmp_path):
    """A decode that is down gets no requests (they go to the healthy one); once it answers
    /health again it gets its share; a pool with no healthy server answers 503 at once."""
    late = ServerProcess("late", [sys.executable, UPSTREAM, "--port", "{port}", "--name", "late"],
                         tmp_path)
    up = {n: ServerProcess(n, [sys.executable, UPSTREAM, "--port", "{port}", "--name", n],
                           tmp_path) for n in ("prefill", "decode")}
    main = router("healing", tmp_path, [up["prefill"].url], [up["decode"].url, late.url], 3, 30,
                  health_s=0.2)
    lonely = router("lonely", tmp_path, [DEAD], [up["decode"].url], 3, 30, health_s=0.2)
    with contextlib.ExitStack() as stack, httpx.Client(timeout=10, trust_env=False) as client:
        for proc in (*up.values(), main, lonely):
            stack.callback(proc.stop)
            proc.start()
        for proc in (*up.values(), main, lonely):
            proc.wait_healthy(timeout=30)
        wait_for(lambda: not _upstream_health(client, main.url, late.url))
        body = {"messages": MESSAGES}
        for _ in range(4):
            assert client.post(main.url + "/v1/chat/completions", json=body).status_code == 200
        picked = [a["decode"] for a in client.get(main.url + "/debug/rooms").json()]
        assert picked == [up["decode"].url] * 4
        stack.callback(late.stop)
        late.start()
        late.wait_healthy(timeout=30)
        wait_for(lambda: _upstream_health(client, main.url, late.url))
        for _ in range(4):
            assert client.post(main.url + "/v1/chat/completions", json=body).status_code == 200
        picked = [a["decode"] for a in client.get(main.url + "/debug/rooms").json()][4:]
        assert late.url in picked and up["decode"].url in picked
        wait_for(lambda: not _upstream_health(client, lonely.url, DEAD))
        resp = client.post(lonely.url + "/v1/chat/completions", json=body)
        assert resp.status_code == 503 and "no healthy prefill" in resp.json()["error"]["message"]


def test_a_slow_health_probe_is_not_a_dead_server():
    """Timeouts and 5xx need FAILURE_THRESHOLD probes in a row (a busy decode on 2 cores once
    missed a 1 s probe and the router answered 503 meanwhile); a refused connection counts at
    once; one good probe resets the count."""
    from engine.router.health import FAILURE_THRESHOLD, HealthTable

    t = HealthTable(["a", "b"])
    for _ in range(FAILURE_THRESHOLD - 1):
        t.probed("a", False, "ReadTimeout")
    t.probed("a", True)
    for _ in range(FAILURE_THRESHOLD - 1):
        t.probed("a", False, "ReadTimeout")
    assert t.healthy(["a", "b"]) == ("a", "b")
    t.probed("a", False, "ReadTimeout")
    t.probed("b", False, "ConnectError", refused=True)
    assert t.healthy(["a", "b"]) == ()
    t.probed("b", True)
    assert t.healthy(["a", "b"]) == ("b",)


def test_long_lived_clients_drop_idle_connections_before_the_servers_close_them():
    """Router -> servers and decode -> prefill reuse pooled connections; one reused just as the
    server's keep-alive closes it fails with ReadError, so the client's expiry must be shorter."""
    from engine.http import CLIENT_KEEPALIVE_EXPIRY_S, SERVER_KEEP_ALIVE_S

    assert 0 < CLIENT_KEEPALIVE_EXPIRY_S < SERVER_KEEP_ALIVE_S
