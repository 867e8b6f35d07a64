"""What the servers and the workbench read off a running engine: liveness, buffer captures and
dumps, queue and page tables, and calls run on the engine thread. Mixed into ``Engine``; every
method that touches scheduler state runs on the engine thread (``on_loop``) or says so."""

from __future__ import annotations

import threading
import time

from engine.core.dump import prompt_hash, snapshot_buffers
from engine.core.sequence import Sequence


class EngineViews:
    @property
    def alive(self) -> bool:
        """Whether the engine loop runs (True before ``start`` for in-process use)."""
        return self._thread is None or self._thread.is_alive()

    def capture(self, seq: Sequence) -> None:
        """Keeps a copy of a finishing request's buffers for later dumps (engine thread)."""
        if self.captures.enabled and seq.pages:
            self.captures.put(seq.rid, snapshot_buffers(self, seq))

    def name_room(self, room: int, rid: str, prompt: list[int]) -> None:
        """Records that request ``rid`` with ``prompt`` named bootstrap ``room`` (any thread; a
        dump of the room reports every request that named it)."""
        self.room_requests[room] = (*(self.room_requests.get(room) or ()),
                                    (rid, prompt_hash(prompt)))

    def dump(self, rid: str) -> dict | None:
        seq = self.scheduler.find(rid)
        return snapshot_buffers(self, seq) if seq is not None else self.captures.get(rid)

    def on_loop(self, fn, timeout: float = 30.0):
        """Runs ``fn`` on the engine thread (or inline when no loop runs) and returns its value."""
        if self._thread is None or not self._thread.is_alive():
            return fn()
        done, box = threading.Event(), {}

        def run() -> None:
            try:
                box["value"] = fn()
            except Exception as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc
            done.set()
        self.call_soon(run)
        if not done.wait(timeout):
            raise TimeoutError("engine loop did not answer")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def queue_snapshot(self) -> dict:
        sched = self.scheduler
        return {"waiting": [{"rid": s.rid, "prompt": len(s.prompt)} for s in sched.waiting],
                "running": [{"rid": s.rid, "tokens": s.num_tokens} for s in sched.running]}

    def page_counts(self) -> dict[str, int]:
        """KV pages: ``total``, ``free`` and ``cached`` (held only by the prefix cache); a page
        in none of the last two is owned by a live request or a quarantine (engine thread)."""
        cached = self.cache.num_pages if self.cache is not None else 0
        return {"total": self.allocator.num_pages, "free": self.allocator.num_free,
                "cached": cached}

    def request_table(self) -> dict:
        seqs = [*self.scheduler.running, *self.scheduler.waiting]
        return {"requests": [{"rid": s.rid, "status": s.status.value, "pages": list(s.pages),
                              "num_computed": s.num_computed, "num_cached": s.num_cached}
                             for s in seqs]}

    def generate(self, prompt: list[int], params) -> list[int]:
        """Synchronous single-request helper (no background thread must be running)."""
        seq = self.submit(Sequence(rid=f"gen-{time.monotonic_ns()}", prompt=prompt, params=params))
        self.run_until_idle()
        return seq.output
