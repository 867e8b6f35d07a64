"""One sampling thread for the probes that watch a pair over time (queues, metrics)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(eq=False, kw_only=True)
class PeriodicSampler:
    """Calls ``sample(t_s)`` every ``interval_s`` on a thread while active (``with ...:``) and
    keeps the rows; ``max_samples`` (None: no bound) stops sampling once that many rows are held.
    Subclasses define ``sample`` and check their capability in ``start``."""

    interval_s: float = 0.25
    max_samples: int | None = None
    rows: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0

    def sample(self, t_s: float) -> list[dict]:
        raise NotImplementedError

    def start(self) -> None:
        """Runs before the thread starts (capability checks)."""

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def full(self) -> bool:
        """Whether sampling has held ``max_samples`` rows (then the thread ends)."""
        return self.max_samples is not None and len(self.rows) >= self.max_samples

    def __enter__(self):
        self.start()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=type(self).__name__)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.full():
            self.rows += self.sample(self.elapsed())
            self._stop.wait(self.interval_s)
