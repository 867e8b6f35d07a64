"""PD that keeps serving (issue 14): each role killed with SIGKILL under load and restarted on its
port, and a SIGSTOP/SIGCONT pause. After each fault the pair must serve oracle-correct responses,
leave no room in any queue and no page unaccounted for; what clients got during the fault is
recorded (never a hang)."""

from __future__ import annotations

import logging
import signal
import threading
import time

import httpx
import pytest

from workbench.deploy import launch_pd_pair
from workbench.deploy.process import ServerProcess, python_module
from workbench.drive import inject_concurrency

pytestmark = [pytest.mark.slow, pytest.mark.servers, pytest.mark.nixl]
log = logging.getLogger(__name__)


QUEUES = ("prealloc", "transfer", "quarantine", "bootstrap", "waiting", "inflight", "running")


def _busy(queues: dict) -> bool:
    return any(queues.get(k) for k in QUEUES)


def _load_during(pair, target, fault, seed: int):
    """Runs a load and calls ``fault()`` once ``target`` (a server of the pair) holds a request
    in one of its queues, so the fault lands mid-flight however fast the pair serves; returns
    the load's result."""
    fired, stop = threading.Event(), threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                busy = _busy(pair.debug("/debug/queues", target))
            except httpx.HTTPError:
                busy = False
            if busy:
                fault()
                fired.set()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        res = inject_concurrency(pair, sessions=4, turns=2, seed=seed, max_tokens=100,
                                 oracle=False, progress=False)
    finally:
        stop.set()
        watcher.join(10)
    assert fired.is_set(), f"{target.name} never held a request during the load"
    return res


def _settled(pair, timeout_s: float = 40.0) -> dict:
    """Waits until no room is queued anywhere and every page is free or cached."""
    deadline, last = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        last = {s.name: pair.debug("/debug/queues", s) for s in [*pair.prefill, *pair.decode]}
        busy = any(_busy(q) for q in last.values())
        pages_ok = all(q["pages"]["free"] + q["pages"]["cached"] == q["pages"]["total"]
                       for q in last.values())
        if not busy and pages_ok:
            return last
        time.sleep(0.5)
    raise AssertionError(f"did not settle in {timeout_s}s: {last}")


def _serves_correctly(pair, seed: int) -> None:
    res = inject_concurrency(pair, sessions=3, turns=2, seed=seed, max_tokens=100,
                             progress=False)
    s = res.summary
    assert s.completed == s.requests >= 6 and s.errors == 0, res.requests
    assert s.flagged == 0, res.requests.filter(res.requests["flagged"])


@pytest.mark.parametrize("role", ["decode", "prefill"])
def test_a_role_killed_under_load_and_restarted_is_served_again(tmp_path, role):
    with launch_pd_pair(log_dir=tmp_path / "logs") as pair:
        srv = (pair.decode if role == "decode" else pair.prefill)[0]
        during = _load_during(pair, srv, lambda: srv.proc.send_signal(signal.SIGKILL), seed=11)
        t0 = time.monotonic()
        srv.start()
        srv.wait_healthy(120)
        _serves_correctly(pair, seed=12)
        recovered_s = time.monotonic() - t0
        _settled(pair)
    s, df = during.summary, during.requests
    aborted = int((df["finish_reason"] == "abort").sum())
    statuses = sorted(int(x) for x in df.filter(df["error"] != "")["status"].to_list())
    log.info("%s SIGKILL: %d requests, %d completed, %d errors %s, %d 200-abort; recovered in "
             "%.1fs", role, s.requests, s.completed, s.errors, statuses, aborted, recovered_s)
    assert s.requests > 0 and s.errors > 0  # the fault really hit requests
    assert s.errors + s.completed + s.killed == s.requests  # every request got an answer
    assert aborted == 0, "an internal failure reached a client as 200 finish_reason abort"
    assert all(st >= 500 for st in statuses), statuses


def test_a_paused_prefill_recovers(tmp_path):
    with launch_pd_pair(log_dir=tmp_path / "logs") as pair:
        proc = pair.prefill[0].proc

        def pause() -> None:
            proc.send_signal(signal.SIGSTOP)
            threading.Timer(5.0, lambda: proc.send_signal(signal.SIGCONT)).start()
        _load_during(pair, pair.prefill[0], pause, seed=21)
        _serves_correctly(pair, seed=22)
        _settled(pair)


def test_a_failing_engine_step_fails_its_requests_with_500_and_the_server_goes_on(tmp_path):
    faults = '{{"fail_steps": [3, 6]}}'  # braces doubled for str.format: requests 1 and 2 fail
    # at their 3rd step (prefill, 2 decode steps)
    srv = ServerProcess("engine", python_module("engine", "serve", "--port", "{port}", "--set",
                                                f"faults={faults}"), tmp_path)
    srv.start()
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    try:
        srv.wait_healthy(timeout=120)
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            one = c.post("/v1/chat/completions", json=body)
            with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                events = [ln.removeprefix("data: ") for ln in r.iter_lines() if ln]
            three = c.post("/v1/chat/completions", json=body)
            health = c.get("/health")
    finally:
        srv.stop()
    assert one.status_code == 500
    assert "engine step 3" in one.json()["error"]["message"]
    assert one.json()["error"]["type"] == "server_error"
    error = httpx.Response(200, content=events[-2]).json()["error"]
    assert r.status_code == 200 and events[-1] == "[DONE]" and error["code"] == 500
    assert "engine step 6" in error["message"]
    assert not any('"finish_reason": "abort"' in e for e in events)
    assert three.status_code == 200 and health.status_code == 200
    assert three.json()["choices"][0]["finish_reason"] in ("stop", "length")
