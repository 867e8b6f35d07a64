"""A dying engine is a finding (issue 26), on our own servers: a launched pair's processes are
watched; a server killed mid-load (SIGSEGV, SIGKILL) or paused is recorded with its process,
signal, time and stack, the load's rows name it, and no probe raises."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import polars as pl
import pytest

from workbench import dump_buffers, inject_concurrency
from workbench.deploy import EngineDied, EngineHung, EngineUnreachable, attach, launch_pd_pair
from workbench.drive import kill_storm, solo_reference, wedge_probe
from workbench.observe import EngineDownError, drain_check, gauges
from workbench.studies.storm import StormConfig, findings, run_storm

pytestmark = [pytest.mark.slow, pytest.mark.servers, pytest.mark.nixl]


def _when_busy(pair, fault) -> threading.Event:
    """Calls ``fault()`` once the decode holds a request (the load is mid-flight)."""
    fired = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                q = pair.debug("/debug/queues", pair.decode[0])
            except httpx.HTTPError:
                return
            if q["transfer"] or q["running"]:
                fault()
                fired.set()
                return
            time.sleep(0.02)
    threading.Thread(target=watch, daemon=True).start()
    return fired


def test_servers_killed_mid_load_are_findings_and_no_probe_raises(tmp_path):
    with launch_pd_pair(log_dir=tmp_path / "logs") as pair:
        decode, prefill = pair.decode[0], pair.prefill[0]
        seen = attach(pair.url, prefill=[prefill.url], decode=[decode.url])  # HTTP only
        fired = _when_busy(pair, lambda: (decode.proc.send_signal(signal.SIGSEGV),
                                          prefill.proc.send_signal(signal.SIGKILL)))
        t0 = time.time()
        report = run_storm(pair, StormConfig(sessions=6, turns=2, storm=4, seed=3))
        assert fired.is_set()
        died = {o.process: o for o in report.down if isinstance(o, EngineDied)}
        assert died["decode0"].signal == "SIGSEGV" and died["prefill0"].signal == "SIGKILL"
        assert died["decode0"].exit_code == -signal.SIGSEGV
        assert all(t0 <= o.at <= time.time() for o in died.values())
        assert "Fatal Python error: Segmentation fault" in died["decode0"].stack
        assert died["decode0"].in_flight and died["decode0"].in_flight > 0
        rows = report.load.requests
        failed = rows.filter((pl.col("error") != "") & ~pl.col("killed"))
        assert len(failed) and (failed["engine_down"] != "").all(), failed
        assert (rows.filter(pl.col("error") == "")["engine_down"] == "").all()
        assert set(report.skipped) == {"solo", "storm", "transfers"}
        health = findings(report)[0]
        assert all(health.checks.values()) and "died" in health.title
        assert len(findings(report)) == 1  # nothing the death cut short is claimed

        # every probe, asked directly, answers with evidence rather than an exception
        base = gauges(pair)
        drain = drain_check(pair, base, timeout_s=5)
        assert not drain.settled and drain.unreadable and drain.down
        solo = solo_reference(pair, report.load, progress=False)
        assert solo.judged == 0 and solo.down
        assert not wedge_probe(pair, timeout_s=5)
        assert kill_storm(pair, n=2) >= 0
        with pytest.raises(EngineDownError, match="decode0"):
            dump_buffers(pair, room=1)
        again = inject_concurrency(pair, sessions=2, turns=1, progress=False)
        assert again.summary.errors == again.summary.requests
        assert (again.requests["engine_down"] != "").all() and again.down

        deadline = time.monotonic() + 20  # the attached view: servers refusing connections
        while len(seen.down()) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        lost = {o.server for o in seen.down() if isinstance(o, EngineUnreachable)}
        assert lost == {"decode0", "prefill0"}, seen.down()
        seen.close()


def test_a_paused_server_is_hung_then_recovered_and_a_live_one_gives_its_stacks(tmp_path):
    with launch_pd_pair(log_dir=tmp_path / "logs") as pair:
        stacks = pair.watch.stacks("decode0")
        assert "most recent call first" in stacks and 'File "' in stacks
        pair.watch.stop()
        pair.start_watch(hang_after_s=3.0, health_every_s=0.5, health_timeout_s=2.0)
        proc = pair.prefill[0].proc

        def prefill_hang():  # (on a busy host another server may look hung too, briefly)
            return next((o for o in pair.down() if o.process == "prefill0"), None)
        proc.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 60
            while prefill_hang() is None and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGCONT)
        hung = prefill_hang()
        assert isinstance(hung, EngineHung), pair.down()
        assert hung.unanswered_s >= 3.0 and hung.recovered_after_s is None
        deadline = time.monotonic() + 60
        while prefill_hang().recovered_after_s is None and time.monotonic() < deadline:
            time.sleep(0.5)
        back = prefill_hang()
        assert back.recovered_after_s is not None
        assert not [o for o in pair.down() if isinstance(o, EngineDied)]  # asking harmed nothing
        assert wedge_probe(pair, timeout_s=60)
