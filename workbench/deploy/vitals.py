"""What a deployment's processes did besides serving: deaths and hangs, as typed observations.

``EngineDied`` and ``EngineHung`` are evidence, never exceptions: probes that meet a dead or hung
engine carry them in their results (``LoadResult.down``, ``DrainReport.down``,
``SoloReport.down``) and notebooks record them as findings. The evidence is read from what the
processes leave: the exit status (ours to read for the processes we started), the log's last
lines, the Python stacks ``faulthandler`` writes on a fatal signal (every process we launch runs
with ``PYTHONFAULTHANDLER=1``), and vLLM's own line naming a worker that died.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

# faulthandler's header for each fatal signal it catches (CPython's faulthandler.c)
FATAL_HEADERS = {"Segmentation fault": "SIGSEGV", "Illegal instruction": "SIGILL",
                 "Floating-point exception": "SIGFPE", "Aborted": "SIGABRT", "Bus error": "SIGBUS"}
_FATAL = re.compile(r"Fatal Python error: (" + "|".join(map(re.escape, FATAL_HEADERS)) + r")")
# vLLM's MultiprocExecutor when a worker process disappears (vllm/v1/executor/multiproc_executor)
_VLLM_WORKER = re.compile(r"Worker proc (\S+) died unexpectedly(?: \(exit code: (-?\d+|None)\))?")
STACK_LINES = 60


def signal_name(returncode: int | None) -> str | None:
    """``SIGILL`` for a return code of -4 (killed by that signal); None for a normal exit."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def wall(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class EngineDied:
    """A process of the deployment ended while it was being watched.

    ``server`` is the launched server it belongs to (``decode0``); ``process`` names the process
    itself (``decode0`` or a child such as ``decode0/VllmWorker-0``). ``exit_code`` is the
    process's return code where it could be read (negative: killed by ``signal``); ``signal`` may
    also come from the log (faulthandler's header) when the code could not be read.
    It died after ``alive_at`` (the last time it was seen alive) and by ``at`` (when the death
    was seen), both wall-clock seconds (epoch); ``after_launch_s`` is ``at`` since the deployment
    was up. ``in_flight`` counts a load's requests open at ``alive_at`` (None until a load marks
    it).
    """

    server: str
    process: str
    pid: int | None
    exit_code: int | None
    signal: str | None
    at: float
    after_launch_s: float
    log_tail: tuple[str, ...] = ()
    stack: str = ""
    log_path: str = ""
    alive_at: float | None = None
    in_flight: int | None = None

    kind = "died"

    @property
    def since(self) -> float:
        """The earliest moment it may have died."""
        return self.alive_at if self.alive_at is not None else self.at

    def describe(self) -> str:
        how = self.signal or (f"exit code {self.exit_code}" if self.exit_code is not None
                              else "exit status unknown")
        flight = "" if self.in_flight is None else f", {self.in_flight} requests in flight"
        return (f"{self.process} (pid {self.pid}) died: {how}, {self.after_launch_s:.1f} s after "
                f"launch ({wall(self.at)}){flight}")


@dataclass(frozen=True)
class EngineHung:
    """A process alive but not answering its health route for ``unanswered_s`` seconds.

    ``stack`` holds the Python stacks it dumped when asked (faulthandler on ``SIGUSR2``, where
    the process registered it), else ''. ``recovered_after_s`` is set when it answered again.
    """

    server: str
    process: str
    pid: int | None
    at: float
    after_launch_s: float
    unanswered_s: float
    error: str
    stack: str = ""
    recovered_after_s: float | None = None
    in_flight: int | None = None

    kind = "hung"

    @property
    def since(self) -> float:
        return self.at

    def describe(self) -> str:
        back = ("" if self.recovered_after_s is None
                else f", answered again after {self.recovered_after_s:.1f} s")
        return (f"{self.process} (pid {self.pid}) did not answer its health route for "
                f"{self.unanswered_s:.0f} s from {self.after_launch_s:.1f} s after launch "
                f"({self.error}){back}")


@dataclass(frozen=True)
class EngineUnreachable:
    """A server of an attached deployment (no process of ours) stopped answering over HTTP."""

    server: str
    url: str
    at: float
    after_launch_s: float
    error: str
    in_flight: int | None = None

    kind = "unreachable"

    @property
    def since(self) -> float:
        return self.at

    @property
    def process(self) -> str:
        return self.server

    def describe(self) -> str:
        return (f"{self.server} at {self.url} stopped answering {self.after_launch_s:.1f} s after "
                f"attach ({self.error})")


EngineDown = EngineDied | EngineHung | EngineUnreachable


def lasting(down: tuple[EngineDown, ...]) -> tuple[EngineDown, ...]:
    """The observations still in effect: deaths, lost servers and hangs not recovered."""
    return tuple(o for o in down if not (isinstance(o, EngineHung)
                                         and o.recovered_after_s is not None))


@dataclass(frozen=True)
class LogEvidence:
    """What a server's log says about a death: the signal from faulthandler's header, the stack
    it printed, vLLM's worker-death lines (name -> exit code), and the last lines."""

    signal: str | None = None
    stack: str = ""
    workers: dict[str, int | None] = field(default_factory=dict)
    tail: tuple[str, ...] = ()


def read_log(path: Path, start: int = 0, tail_lines: int = 30) -> LogEvidence:
    """Parses ``path`` from byte ``start`` (what was written since a watch began)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return LogEvidence()
    lines = text.splitlines()
    sig, stack = None, ""
    for i, line in enumerate(lines):
        m = _FATAL.search(line)
        if m:
            sig = FATAL_HEADERS[m.group(1)]
            stack = "\n".join(lines[i:i + STACK_LINES])
    workers = {}
    for m in _VLLM_WORKER.finditer(text):
        code = m.group(2)
        workers[m.group(1)] = None if code in (None, "None") else int(code)
    return LogEvidence(sig, stack, workers, tuple(lines[-tail_lines:]))
