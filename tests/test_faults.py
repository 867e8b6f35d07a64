"""PD that keeps serving (issue 14): each role killed with SIGKILL under load and restarted on its
port, and a SIGSTOP/SIGCONT pause. After each fault the pair must serve oracle-correct responses,
leave no room in any queue and no page unaccounted for; what clients got during the fault is
recorded (never a hang)."""

from __future__ import annotations

import logging
import signal
import threading
import time

import pytest

from workbench.concurrency import inject_concurrency
from workbench.launch import launch_pd_pair

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)


def _load_during(pair, fault, seed: int):
    """Runs a load and calls ``fault()`` 1.5 s into it; returns the load's result."""
    timer = threading.Timer(1.5, fault)
    timer.start()
    try:
        return inject_concurrency(pair, sessions=4, turns=2, seed=seed, max_tokens=100,
                                  oracle=False, progress=False)
    finally:
        timer.cancel()


def _settled(pair, timeout_s: float = 40.0) -> dict:
    """Waits until no room is queued anywhere and every page is free or cached."""
    deadline, last = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        last = {s.name: pair.debug("/debug/queues", s) for s in [*pair.prefill, *pair.decode]}
        busy = any(q.get(k) for q in last.values() for k in
                   ("prealloc", "transfer", "quarantine", "bootstrap", "waiting", "inflight",
                    "running"))
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
        during = _load_during(pair, lambda: srv.proc.send_signal(signal.SIGKILL), seed=11)
        t0 = time.monotonic()
        srv.start()
        srv.wait_healthy(120)
        _serves_correctly(pair, seed=12)
        recovered_s = time.monotonic() - t0
        _settled(pair)
    s = during.summary
    log.info("%s SIGKILL: %d requests, %d completed, %d errors, %d aborted; recovered in %.1fs",
             role, s.requests, s.completed, s.errors, s.aborted, recovered_s)
    assert s.requests > 0 and s.errors + s.aborted > 0  # the fault really hit requests
    assert s.errors + s.completed + s.killed == s.requests  # every request got an answer


def test_a_paused_prefill_recovers(tmp_path):
    with launch_pd_pair(log_dir=tmp_path / "logs") as pair:
        proc = pair.prefill[0].proc

        def pause() -> None:
            proc.send_signal(signal.SIGSTOP)
            threading.Timer(5.0, lambda: proc.send_signal(signal.SIGCONT)).start()
        _load_during(pair, pause, seed=21)
        _serves_correctly(pair, seed=22)
        _settled(pair)
