"""Nobody corrupts another user's answer, and the servers' counters tell the truth (issue 29).

Attacks run through ``bench.attacks`` (a recording tap on the decode-prefill path gives the
attacker a man in the middle's knowledge): room squats, forged and replayed preallocs, each with
and without the deployment secret, judged by their victims against solo greedy references. The
page-reuse race at a small decode pool must give no prealloc conflict. A known mix of requests
(served, refused, client kills, a peer failure mid-stream) is counted exactly on the router,
the prefill and the decode, and no log of the deployment holds its secret or debug token.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.attacks import reuse_race, run_attacks
from engine.http import SECRET_ENV, SECRET_HEADER
from engine.training import make_transcript
from workbench.deploy import launch_pd_pair

pytestmark = [pytest.mark.slow, pytest.mark.servers, pytest.mark.nixl]


def test_no_attack_corrupts_a_victim_with_or_without_the_secret(tmp_path):
    results = {(r.attack, r.with_secret): r for r in run_attacks(2, log_dir=tmp_path)}
    for (_, with_secret), r in results.items():
        assert r.victims == 2 and r.corrupted == 0, r
        assert r.failed == 0, r  # an attack may not even deny service here
        if not with_secret:
            assert set(r.answers) <= {401}, r  # nothing reaches a room without the secret
    assert results["forge", True].answers[403] == 2  # not signed by the decode's own key
    assert results["replay", True].answers[409] == 2  # an earlier seq: a replay


def test_a_small_decode_pool_reuses_pages_without_prealloc_conflicts(tmp_path):
    race = reuse_race(requests=200, workers=32, num_pages=160, log_dir=tmp_path)
    assert race.conflicts == 0 and race.ok == race.requests, race


def counts(url: str, family: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            return {s.labels["status"]: s.value for s in fam.samples
                    if s.name.endswith("_total")}
    return {}


def body(i: int, max_tokens: int = 8, **extra) -> dict:
    tr = make_transcript(321_000 + i)
    return {"messages": tr.messages(upto_round=0), "max_tokens": max_tokens, **extra}


def stream_until_room(url: str, req: dict):
    """A streaming request held open after its first event (the decode waits on the KV): the
    client, the response and the rest of its lines."""
    client = httpx.Client(timeout=60)
    resp = client.send(client.build_request("POST", url + "/v1/chat/completions", json=req),
                       stream=True)
    assert resp.status_code == 200
    lines = resp.iter_lines()
    next(lines)
    return client, resp, lines


def test_every_role_counts_each_request_once_by_how_it_ended(tmp_path):
    # each layer's KV write is held 300 ms, so kills and aborts land while the KV is on the way
    with launch_pd_pair(faults={"transfer_fixed_ms": 300.0}, log_dir=tmp_path) as pair:
        p, d, url = pair.prefill[0], pair.decode[0], pair.url
        for i in range(3):
            assert httpx.post(url + "/v1/chat/completions", json=body(i),
                              timeout=60).status_code == 200
        with httpx.stream("POST", url + "/v1/chat/completions", json=body(3, stream=True),
                          timeout=60) as s:
            assert s.status_code == 200 and list(s.iter_lines())[-2] == "data: [DONE]"
        for i in (4, 5):
            r = httpx.post(url + "/v1/chat/completions", json=body(i, max_tokens=-1), timeout=60)
            assert r.status_code == 400
        assert httpx.post(url + "/v1/chat/completions", content=b"{",
                          timeout=60).status_code == 400
        for i in (6, 7):  # client kills while the KV is on the way
            client, resp, _ = stream_until_room(url, body(i, 200, stream=True, ignore_eos=True))
            resp.close()
            client.close()
        client, resp, lines = stream_until_room(url, body(8, 200, stream=True, ignore_eos=True))
        room = int(resp.headers["x-bootstrap-room"])
        httpx.post(p.url + "/disagg/abort", json={"room": room}, timeout=10,
                   headers={SECRET_HEADER: p.env[SECRET_ENV]}).raise_for_status()
        events = [line for line in lines if line.startswith("data: ")]
        client.close()
        assert json.loads(events[-2][6:])["error"]["code"] == 502 and events[-1] == "data: [DONE]"
        want = {"200": 4, "400": 2, "499": 2, "502": 1}
        got = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            got = {"router": counts(url, "pdwb_router_requests"),
                   "decode": counts(d.url, "pdwb_requests"),
                   "prefill": counts(p.url, "pdwb_requests")}
            if got == {"router": {**want, "400": 3}, "decode": want, "prefill": want}:
                break
            time.sleep(0.5)
        assert got == {"router": {**want, "400": 3}, "decode": want, "prefill": want}
        ctype = httpx.get(d.url + "/metrics").headers["content-type"]
        assert ctype.startswith("text/plain; version=0.0.4")
        secrets = (p.env[SECRET_ENV], pair.spec.debug_token)
    logs = {f.name: f.read_text(errors="replace") for f in tmp_path.glob("*.log")}
    assert set(logs) >= {"prefill0.log", "decode0.log", "router.log"}
    leaked = [(name, s[:6]) for name, text in logs.items() for s in secrets if s in text]
    assert leaked == []


def test_a_paused_then_resumed_prefill_is_left_holding_no_room(tmp_path):
    """A prefill stopped for 10 s under load: the decode gives up its rooms (heartbeats, the
    bootstrap timeout), keeps the aborts it could not deliver and sends them once the prefill
    answers again, so nothing waits for the 300 s bootstrap timeout."""
    with launch_pd_pair(log_dir=tmp_path) as pair:
        p = pair.prefill[0]
        with ThreadPoolExecutor(8) as pool:
            futs = [pool.submit(httpx.post, pair.url + "/v1/chat/completions",
                                json=body(20 + i, 120), timeout=90) for i in range(8)]
            time.sleep(0.2)
            os.kill(p.proc.pid, signal.SIGSTOP)
            time.sleep(10)
            os.kill(p.proc.pid, signal.SIGCONT)
            statuses = sorted(f.result().status_code for f in futs)
        left, deadline = None, time.monotonic() + 30
        while time.monotonic() < deadline:
            left = pair.debug("/debug/queues", p)
            if not (left["bootstrap"] or left["waiting"] or left["inflight"]):
                break
            time.sleep(0.5)
        assert not (left["bootstrap"] or left["waiting"] or left["inflight"]), (left, statuses)
        r = httpx.post(pair.url + "/v1/chat/completions", json=body(40), timeout=60)
        assert r.status_code == 200, r.text
