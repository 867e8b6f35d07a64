"""``ProcessWatch``: a thread that watches a deployment's processes and health routes.

For servers we launched it sees every process of the tree: the server's own exit status and,
through ``psutil``, each child (vLLM's engine core and workers) disappearing while its parent
lives. For every server, launched or attached, it probes the health route: a launched process
alive but silent for ``hang_after_s`` is ``EngineHung`` (its Python stacks are asked for with
``SIGUSR2`` when it registered faulthandler there); an attached server that refuses connections is
``EngineUnreachable``. Observations are kept in order and never raised.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace

import httpx
import psutil

from workbench.deploy.exits import ExitListener, listener
from workbench.deploy.process import ServerProcess
from workbench.deploy.vitals import (
    EngineDied,
    EngineDown,
    EngineHung,
    EngineUnreachable,
    read_log,
    signal_name,
)

log = logging.getLogger(__name__)
STACK_SIGNAL = signal.SIGUSR2  # what our servers and vLLM's (site hook) dump their stacks on
SETTLE_S = 1.5  # a child's death is recorded this long after it vanished: its parent logs why
UNREACHABLE_PROBES = 3


@dataclass
class _State:
    """What the watch knows of one server between polls."""

    log_start: int = 0
    pid: int | None = None
    children: dict[int, str] = field(default_factory=dict)
    pending: dict[int, tuple[str, float, float]] = field(default_factory=dict)  # pid ->
    alive_at: float = field(default_factory=time.time)  # (name, alive_at, at) of vanished kids
    dead: bool = False
    silent_since: float | None = None
    failures: int = 0
    next_probe: float = 0.0
    hung: int | None = None  # index of its open EngineHung in the observations
    asked_at: int | None = None  # log size when its stacks were asked for


@dataclass(eq=False)
class ProcessWatch:
    """Watches ``servers`` from ``start()`` until ``stop()``; ``down()`` lists what it saw."""

    servers: list[ServerProcess]
    interval_s: float = 0.25
    health_every_s: float = 1.0
    health_timeout_s: float = 3.0
    hang_after_s: float = 30.0
    t0: float = field(default_factory=time.time)
    _obs: list[EngineDown] = field(default_factory=list)
    _states: dict[str, _State] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _polling: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _exits: ExitListener | None = None

    def start(self) -> ProcessWatch:
        self._exits = listener()
        for srv in self.servers:
            self._states[srv.name] = _fresh(srv)
        self._thread = threading.Thread(target=self._loop, daemon=True, name="ProcessWatch")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops watching (before the deployment is torn down: its exits are not deaths)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._flush(force=True)

    def down(self) -> tuple[EngineDown, ...]:
        """Every death and hang seen so far, earliest first; the processes are looked at once more
        first (a caller that just saw requests fail learns why without waiting for the thread)."""
        if self._thread is not None and not self._stop.is_set():
            self._poll_all(probe=False)
        self._flush(force=True)
        with self._lock:  # in the order they happened (a child is seen dead after its parent)
            return tuple(sorted(self._obs, key=lambda o: o.since))

    def stacks(self, server: str) -> str:
        """Asks the live launched server ``server`` for every thread's Python stack (faulthandler
        on ``SIGUSR2``); '' when it cannot answer (not ours, not registered, dead or stopped)."""
        srv = next((s for s in self.servers if s.name == server), None)
        if srv is None:
            raise KeyError(f"no server {server!r}; watched: {[s.name for s in self.servers]}")
        if srv.proc is None or not srv.stack_signal or not srv.alive():
            return ""
        return _ask_stack(srv)

    def mark_in_flight(self, count, since: float) -> tuple[EngineDown, ...]:
        """Sets ``in_flight`` to ``count(since)`` (a load's open requests) on each observation made
        at or after ``since`` (the load's start, epoch s) and not marked by an earlier load."""
        self._flush(force=True)
        with self._lock:
            self._obs = [replace(o, in_flight=count(o.since))
                         if o.at >= since and o.in_flight is None else o for o in self._obs]
            return tuple(self._obs)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll_all(probe=True)
            self._flush(force=False)

    def _poll_all(self, probe: bool) -> None:
        with self._polling:
            for srv in self.servers:
                try:
                    self._poll(srv, self._states[srv.name], probe)
                except Exception:  # noqa: BLE001 - the watch outlives anything it observes
                    log.exception("watch of %s failed", srv.name)

    def _poll(self, srv: ServerProcess, st: _State, probe: bool) -> None:
        if srv.proc is not None and srv.proc.pid != st.pid:  # restarted on its port
            st = self._states[srv.name] = _fresh(srv)
        if st.dead:
            return
        now = time.time()
        if srv.proc is not None and srv.proc.poll() is not None:
            st.dead = True
            self._died(srv, st, srv.name, srv.proc.pid, srv.proc.returncode, st.alive_at, now)
            return
        if srv.proc is not None:
            now_children = _children(srv)
            for pid, name in st.children.items():
                if pid not in now_children and pid not in st.pending:
                    st.pending[pid] = (name, st.alive_at, now)
            st.alive_at = now
            st.children = {**now_children, **{p: n for p, n in st.children.items()
                                              if p in st.pending}}
        if probe and time.monotonic() >= st.next_probe:
            st.next_probe = time.monotonic() + self.health_every_s
            self._probe(srv, st)

    def _probe(self, srv: ServerProcess, st: _State) -> None:
        try:
            ok = httpx.get(srv.url + srv.health, timeout=self.health_timeout_s).status_code < 500
            error = "" if ok else "health answered 5xx"
        except httpx.HTTPError as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"[:200]
        now = time.time()
        if ok:
            self._answered(srv, st, now)
            return
        st.failures += 1
        st.silent_since = st.silent_since or now
        if srv.proc is None and st.failures >= UNREACHABLE_PROBES and "Connect" in error:
            st.dead = True
            self._add(EngineUnreachable(srv.name, srv.url, now, now - self.t0, error))
        elif now - st.silent_since >= self.hang_after_s and st.hung is None:
            self._hung(srv, st, now, error)

    def _answered(self, srv: ServerProcess, st: _State, now: float) -> None:
        if st.hung is not None:
            # a stopped process dumps the stacks it was asked for once it runs again
            late = _read_from(srv, st.asked_at) if st.asked_at is not None else ""
            with self._lock:
                h = self._obs[st.hung]
                self._obs[st.hung] = replace(h, recovered_after_s=round(now - h.at, 2),
                                             stack=h.stack or late)
        st.failures, st.silent_since, st.hung = 0, None, None

    def _hung(self, srv: ServerProcess, st: _State, now: float, error: str) -> None:
        pid = srv.proc.pid if srv.proc is not None else None
        asking = srv.proc is not None and srv.stack_signal
        st.asked_at = _size(srv) if asking else None
        stack = _ask_stack(srv) if asking else ""
        with self._lock:
            st.hung = len(self._obs)
            self._obs.append(EngineHung(srv.name, srv.name, pid, st.silent_since,
                                        st.silent_since - self.t0, round(now - st.silent_since, 1),
                                        error, stack))
        log.warning("%s", self._obs[st.hung].describe())

    def _died(self, srv: ServerProcess, st: _State, process: str, pid: int | None,
              code: int | None, alive_at: float, at: float) -> None:
        ev = read_log(srv.log_path, st.log_start)
        ended = self._exits.exit_of(pid, wait_s=0.5) if pid is not None else None
        if ended is not None:  # the kernel's own record: exact status and time
            code = -ended.signal if ended.signal else ended.code
            at = alive_at = ended.at
        if code is None and process != srv.name and ev.workers:
            code = _worker_code(ev.workers, process.rsplit("/", 1)[-1])
        if code == 0 and process != srv.name and ended is not None:
            # the kernel saw a child exit cleanly: a helper that finished (a compiler, a
            # grammar worker), not a death; a server that then fails shows by itself
            log.debug("%s (pid %s) exited 0", process, pid)
            return
        sig = signal_name(code) if code is not None else ev.signal
        self._add(EngineDied(srv.name, process, pid, code, sig, at, round(at - self.t0, 2),
                             ev.tail, ev.stack, str(srv.log_path), alive_at))

    def _flush(self, force: bool) -> None:
        with self._polling:
            self._flush_locked(force)

    def _flush_locked(self, force: bool) -> None:
        now = time.time()
        for srv in self.servers:
            st = self._states.get(srv.name)
            if st is None:
                continue
            for pid, (name, alive_at, at) in list(st.pending.items()):
                if force or now - at >= SETTLE_S:
                    del st.pending[pid]
                    st.children.pop(pid, None)
                    self._died(srv, st, f"{srv.name}/{name}", pid, None, alive_at, at)

    def _add(self, obs: EngineDown) -> None:
        with self._lock:
            self._obs.append(obs)
        log.warning("%s", obs.describe())


def _worker_code(workers: dict[str, int | None], name: str) -> int | None:
    """The exit code vLLM logged for the worker called ``name`` (the last one logged when no
    name matches: process titles and vLLM's worker names differ)."""
    for w, code in workers.items():
        if w.lower() in name.lower() or name.lower() in w.lower():
            return code
    return list(workers.values())[-1]


def _fresh(srv: ServerProcess) -> _State:
    return _State(log_start=_size(srv), pid=srv.proc.pid if srv.proc else None,
                  children=_children(srv))


def _size(srv: ServerProcess) -> int:
    try:
        return srv.log_path.stat().st_size
    except FileNotFoundError:
        return 0


def _children(srv: ServerProcess) -> dict[int, str]:
    """pid -> name of every live descendant of a launched server (name: vLLM's process title)."""
    if srv.proc is None:
        return {}
    try:
        kids = psutil.Process(srv.proc.pid).children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for k in kids:
        try:
            if k.status() != psutil.STATUS_ZOMBIE:  # dead, not yet reaped by its parent
                out[k.pid] = k.name()
        except psutil.Error:
            continue
    return out


def _ask_stack(srv: ServerProcess, wait_s: float = 2.0, tries: int = 3) -> str:
    """Asks a live server for the Python stack of the thread the signal lands in (faulthandler on
    ``STACK_SIGNAL``, registered with ``all_threads=False``: dumping every thread from a signal
    handler while they run crashed a resumed prefill with SIGSEGV) and returns what it wrote to
    its log. A signal that lands in a native thread writes nothing, so it is sent up to ``tries``
    times; a stopped process writes nothing until it runs again."""
    start = _size(srv)
    for _ in range(tries):
        try:
            os.kill(srv.proc.pid, STACK_SIGNAL)
        except ProcessLookupError:
            return ""
        deadline, seen = time.monotonic() + wait_s, -1
        while time.monotonic() < deadline:
            time.sleep(0.1)
            text = _read_from(srv, start)
            if "most recent call first" in text:
                if len(text) == seen:
                    return text
                seen = len(text)
    return _read_from(srv, start)


def _read_from(srv: ServerProcess, offset: int, limit: int = 8000) -> str:
    try:
        with open(srv.log_path, "rb") as f:
            f.seek(offset)
            return f.read(limit).decode(errors="replace")
    except FileNotFoundError:
        return ""
