"""The seams where the engine's threads interleave, so a simulator can drive them.

Engine code that starts a thread, sleeps, blocks on a condition or a queue, reads the clock of a
timeout, or reaches a point where the real system may switch threads, goes through a
``Runtime``. ``THREADS`` is plain threading and wall-clock time (real mode);
``engine.sim.SimRuntime`` implements the same calls with exactly one runnable thread at a time
and virtual time, so a seed fixes the interleaving.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class Runtime:
    """Real threads and wall-clock time; every call is the plain threading equivalent."""

    def start_thread(self, target: Callable[[], None], name: str) -> None:
        """Starts ``target`` on a new daemon thread."""
        threading.Thread(target=target, name=name, daemon=True).start()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait_for(self, cond: threading.Condition, predicate: Callable[[], bool],
                 timeout: float) -> bool:
        """``cond.wait_for``; the caller holds ``cond`` (as with ``threading.Condition``)."""
        return cond.wait_for(predicate, timeout=timeout)

    def get(self, q: queue.Queue[T]) -> T:
        """A blocking ``q.get()``."""
        return q.get()

    def result(self, fut: Future[T]) -> T:
        """A blocking ``fut.result()`` (re-raises what the future's work raised)."""
        return fut.result()

    def point(self, label: str) -> None:
        """A place where the real system may switch threads (a no-op in real mode)."""

    def monotonic(self) -> float:
        """The clock of timeouts and deadlines (``time.monotonic`` in real mode)."""
        return time.monotonic()

    def wall(self) -> float:
        """The clock two processes compare (a prealloc's validity): ``time.time`` in real
        mode."""
        return time.time()


THREADS = Runtime()
