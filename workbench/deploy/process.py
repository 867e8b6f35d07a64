"""Server subprocesses: free ports, captured logs, health waits, guaranteed teardown."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import httpx

log = logging.getLogger(__name__)
KILL_WAIT_S = 60.0  # how long stop() waits for a SIGKILLed process group to exit
PR_SET_PDEATHSIG = 1  # prctl(2)
_LIVE: weakref.WeakSet = weakref.WeakSet()


class LaunchError(RuntimeError):
    """A server process failed to become healthy; the message names it and tails its log."""


_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now and never handed out before by this process.

    Servers are given ports before they bind, so the kernel could offer a port twice (a prefill
    and a decode launched together then collide on bind); remembering the ports handed out rules
    that out. Another process can still take the port before the server binds it.
    """
    with _HANDED_OUT_LOCK:
        while True:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


@dataclass(eq=False)
class ServerProcess:
    """One server: ``argv`` is run with ``{port}`` substituted; health is polled at ``health``."""

    name: str
    argv: list[str]
    log_dir: Path
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    health: str = "/health"
    env: dict[str, str] = field(default_factory=dict, repr=False)  # may hold secrets
    format_argv: bool = True
    cwd: Path | None = None  # run from this folder (a source tree), else the caller's
    stack_signal: bool = False  # it dumps its Python stacks on SIGUSR2 (ours, vLLM's site hook)
    core_dumps: bool = False  # lift RLIMIT_CORE to its hard limit (cores land per core_pattern)
    die_with_parent: bool = field(default_factory=lambda: _BOUND)  # see die_with_this_process
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def start(self) -> ServerProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = self.argv
        if self.format_argv:
            argv = [a.format(port=self.port, host=self.host) for a in argv]
        # faulthandler prints the Python stacks of a process (and its children) killed by a
        # fatal signal into the log, where workbench.deploy.vitals reads them
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **self.env}
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=self.cwd,
                                         preexec_fn=_preexec(self.core_dumps,
                                                             self.die_with_parent))
        _LIVE.add(self)
        log.info("started %s pid %d on %s", self.name, self.proc.pid, self.url)
        return self

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise LaunchError(f"{self.name} exited with {self.proc.returncode}; log tail:\n"
                                  f"{tail(self.log_path)}")
            try:
                if httpx.get(self.url + self.health, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise LaunchError(f"{self.name} not healthy after {timeout:.0f}s at {self.url}; log "
                          f"tail:\n{tail(self.log_path)}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:  # a killed process that still unmaps a large heap can take a while to exit
                self.proc.wait(timeout=max(timeout, KILL_WAIT_S))
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) still running %g s after SIGKILL", self.name,
                          self.proc.pid, max(timeout, KILL_WAIT_S))
                return
        log.info("stopped %s", self.name)


_BOUND = False


def die_with_this_process() -> None:
    """Every server this process starts from now on is SIGKILLed by the kernel when this
    process dies, however it dies (``PR_SET_PDEATHSIG``): for hosts that can be killed without
    running ``atexit``, such as a Ray actor whose driver died. The signal follows the thread
    that started the server, so call it only where that thread lives as long as the process
    (a Ray actor's), never in a process that starts servers from short-lived threads."""
    global _BOUND
    _BOUND = True


def _preexec(cores: bool, die_with_parent: bool):
    if not (cores or die_with_parent):
        return None
    parent = os.getpid()

    def child() -> None:
        if cores:
            _allow_cores()
        if die_with_parent:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
    return child


def _allow_cores() -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop(timeout=5.0)
