"""Overlap scheduling (patch variant ``overlap_schedule``), after SGLang's ``event_loop_overlap``.

One overlap step k on the engine thread, while forward k-1 may still run on the worker thread:

1. drain the inbox (new requests, aborts, ``call_soon`` functions) and run ``poll()`` (PD queues);
2. resolve forward k-1: wait for it, mark its computed positions, and keep its sampled tokens as
   *future tokens* (on CPU the stand-in for SGLang's future-token map: known, not yet processed);
3. schedule batch k, prepare its inputs (reading future tokens) and launch forward k on the worker;
4. process step k-1's results while forward k runs: append tokens, deliver ``TokenEvent``s, stop
   and length checks, finish deferred aborts, release pages / cache them in the radix tree.

Invariants:

- At most one forward is in flight. Admission (page allocation by the scheduler) only runs while
  none is; ``poll()`` and inbox functions do run during forward k-1, as SGLang's do.
- A sequence that finishes in step 4 was already scheduled in batch k: forward k computes one extra
  token for it, discarded when resolved, and its pages are freed a step later than without overlap.
  Forward k may still write that token's K/V (at position ``num_computed``, never in a page the
  radix cache took) into its last, already freed page; only a PD decode's ``poll()`` can hand that
  page out again before forward k is resolved (SGLang's window too).
- Aborts of running sequences are deferred to step 4 (SGLang's ``to_finish``), so an aborted
  sequence also runs once more; waiting sequences are dropped at once.
- Only the worker thread runs the model; only the engine thread touches the scheduler and pages.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.model_runner import BatchInputs, ModelRunner, StepOutput
from engine.scheduler import Batch
from engine.sequence import FinishReason, Sequence, Status

if TYPE_CHECKING:
    from engine.engine import Engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwardJob:
    """One launched batch with its inputs prepared on the engine thread."""

    batch: Batch
    inputs: BatchInputs
    result: Future  # Future[StepOutput]


@dataclass(frozen=True)
class Resolved:
    """A finished forward whose results are not processed yet."""

    batch: Batch
    out: StepOutput


@dataclass
class OverlapStats:
    launched: int = 0
    discarded_tokens: int = 0  # extra tokens computed for sequences finished a step earlier
    deferred_aborts: int = 0


class ForwardWorker:
    """A daemon thread that runs ``runner.run`` on launched batches, in launch order."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._jobs: queue.Queue[ForwardJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="forward-worker", daemon=True)
        self._thread.start()

    def launch(self, batch: Batch, inputs: BatchInputs) -> ForwardJob:
        job = ForwardJob(batch, inputs, Future())
        self._jobs.put(job)
        return job

    def close(self) -> None:
        self._jobs.put(None)

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job.result.set_result(self.runner.run(job.batch, job.inputs))
            except BaseException as exc:  # noqa: BLE001 - re-raised on the engine thread
                job.result.set_exception(exc)


@dataclass
class OverlapLoop:
    """The overlap step of one engine (see the module docstring for its order and invariants)."""

    engine: Engine
    stats: OverlapStats = field(default_factory=OverlapStats)
    inflight: ForwardJob | None = field(default=None, init=False)
    to_abort: list[Sequence] = field(default_factory=list, init=False)
    _worker: ForwardWorker | None = field(default=None, init=False)

    def step(self) -> StepOutput | None:
        """Runs one overlap step; None when nothing was in flight and nothing was launched."""
        eng = self.engine
        eng._drain_inbox()
        eng.poll()
        t0 = time.perf_counter()
        last = self._resolve()
        future = {s.seq: s.token for s in last.out.sampled} if last else {}
        batch = eng.scheduler.schedule()
        if batch:
            self._launch(batch, future)
        if last is not None:
            self._process(last)
        self._finish_deferred_aborts()
        if last is None and not batch:
            return None
        eng.stats.busy_seconds += time.perf_counter() - t0
        return last.out if last is not None else StepOutput((), 0)

    def abort(self, seq: Sequence) -> None:
        """Defers the abort of a running sequence to the end of the step; drops others now."""
        if seq.status is Status.RUNNING:
            if seq not in self.to_abort:
                self.to_abort.append(seq)
                self.stats.deferred_aborts += 1
        else:
            self.engine._finish(seq, FinishReason.ABORT)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def _resolve(self) -> Resolved | None:
        """Waits for the forward in flight; re-raises its error after forgetting it."""
        job, self.inflight = self.inflight, None
        if job is None:
            return None
        out = job.result.result()
        for it in job.batch.items:
            if it.seq.status is Status.RUNNING:
                it.seq.num_computed = it.start + it.num_tokens
        live = tuple(s for s in out.sampled if s.seq.status is Status.RUNNING)
        self.stats.discarded_tokens += len(out.sampled) - len(live)
        return Resolved(job.batch, StepOutput(live, out.num_tokens))

    def _launch(self, batch: Batch, future: dict[Sequence, int]) -> None:
        if self._worker is None:
            self._worker = ForwardWorker(self.engine.runner)
        inputs = self.engine.runner.prepare(batch, future)
        self.inflight = self._worker.launch(batch, inputs)
        self.stats.launched += 1
        self.engine.stats.steps += 1

    def _process(self, done: Resolved) -> None:
        for s in done.out.sampled:
            self.engine._accept(s.seq, s.token)

    def _finish_deferred_aborts(self) -> None:
        pending, self.to_abort = self.to_abort, []
        for seq in pending:
            if seq.status is Status.RUNNING:
                self.engine._finish(seq, FinishReason.ABORT)
