"""Deaths and hangs as evidence (issue 26), the parts that need no server: reading what a log
and the kernel say about a process that died."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from workbench.deploy.exits import decode, listener
from workbench.deploy.vitals import EngineDied, EngineHung, lasting, read_log, signal_name

FAULTHANDLER_LOG = """INFO started
(EngineCore pid=3535) ERROR 12-05 01:20:52 [multiproc_executor.py:315] Worker proc VllmWorker-0 \
died unexpectedly (exit code: -4), shutting down executor.
Fatal Python error: Illegal instruction

Thread 0x00007fc83dffb6c0 (most recent call first):
  File "/x/vllm/v1/attention/backends/cpu_attn.py", line 425 in forward
INFO after
"""


def test_a_log_names_the_signal_the_stack_and_vllms_worker(tmp_path):
    path = tmp_path / "decode0.log"
    path.write_text("old line from before the watch\n" + FAULTHANDLER_LOG)
    ev = read_log(path, start=len("old line from before the watch\n"))
    assert ev.signal == "SIGILL"
    assert "cpu_attn.py" in ev.stack and ev.stack.startswith("Fatal Python error")
    assert ev.workers == {"VllmWorker-0": -4}
    assert ev.tail[-1] == "INFO after" and "old line" not in "\n".join(ev.tail)
    assert read_log(tmp_path / "missing.log").signal is None


def test_wait_statuses_and_signal_names():
    assert decode(0x4, 7, 1.0).signal == signal.SIGILL and decode(0x4, 7, 1.0).code is None
    assert decode(0x8B, 7, 1.0).core_dumped and decode(0x8B, 7, 1.0).signal == 11
    assert decode(3 << 8, 7, 1.0).code == 3 and decode(3 << 8, 7, 1.0).signal is None
    assert signal_name(-4) == "SIGILL" and signal_name(0) is None and signal_name(None) is None


def test_observations_describe_themselves_and_recovered_hangs_do_not_last():
    died = EngineDied("decode0", "decode0/VLLM::Worker", 12, -4, "SIGILL", 100.0, 1.5,
                      alive_at=99.8, in_flight=2)
    text = died.describe()
    assert "decode0/VLLM::Worker" in text and "SIGILL" in text and "2 requests in flight" in text
    assert died.since == 99.8
    hung = EngineHung("prefill0", "prefill0", 13, 50.0, 1.0, 30.0, "ReadTimeout")
    back = EngineHung("prefill0", "prefill0", 13, 50.0, 1.0, 30.0, "ReadTimeout",
                      recovered_after_s=4.0)
    assert lasting((died, hung, back)) == (died, hung)
    assert "answered again after 4.0 s" in back.describe()


def test_the_kernel_reports_a_grandchilds_signal_and_time():
    """The proc connector sees the exit of a process that is not our child (here: our child's
    child, killed with SIGILL), with the signal; skipped where the host refuses the socket."""
    exits = listener()
    if not exits.available:
        pytest.skip("no CAP_NET_ADMIN for the proc connector here")
    code = ("import os, signal, subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
            "print(p.pid, flush=True); time.sleep(0.2); os.kill(p.pid, signal.SIGILL); p.wait()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    pid = int(out.stdout.split()[0])
    ended = exits.exit_of(pid, wait_s=5.0)
    assert ended is not None and ended.signal == signal.SIGILL and ended.code is None


def test_a_watch_names_a_child_killed_by_a_signal_and_its_parents_own_exit(tmp_path):
    """A launched process's child (as a vLLM worker is its server's grandchild) killed with
    SIGILL, then the process itself exiting 3: both recorded, with the signal, code and time."""
    import time

    import psutil

    from workbench.deploy import ProcessWatch, ServerProcess

    script = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "time.sleep(3); sys.exit(3)")
    srv = ServerProcess("server0", [sys.executable, "-c", script], tmp_path).start()
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(srv.proc.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        watch = ProcessWatch([srv], health_every_s=60.0).start()
        child = psutil.Process(srv.proc.pid).children()[0]
        t0 = time.time()
        child.send_signal(signal.SIGILL)
        while len(watch.down()) < 2 and time.monotonic() < deadline + 10:
            time.sleep(0.1)
        watch.stop()
    finally:
        srv.stop()
    kid, parent = watch.down()
    assert kid.process.startswith("server0/") and kid.pid == child.pid
    if listener().available:
        assert kid.signal == "SIGILL" and kid.exit_code == -signal.SIGILL
        assert t0 <= kid.at <= time.time()
    assert parent.process == "server0" and parent.exit_code == 3 and parent.signal is None
