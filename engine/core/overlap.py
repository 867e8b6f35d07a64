"""Overlap scheduling state (patch variant ``overlap_schedule``), after SGLang's
``event_loop_overlap``; the step itself is ``Engine._overlap_step``.

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

import queue
from concurrent.futures import Future
from dataclasses import dataclass, field

from engine.core.model_runner import BatchInputs, ModelRunner
from engine.core.scheduler import Batch
from engine.core.sequence import Sequence
from engine.runtime import THREADS, Runtime


@dataclass(frozen=True)
class ForwardJob:
    """One launched batch with its inputs prepared on the engine thread."""

    batch: Batch
    inputs: BatchInputs
    result: Future  # Future[StepOutput]


@dataclass
class OverlapStats:
    launched: int = 0
    discarded_tokens: int = 0  # extra tokens computed for sequences finished a step earlier
    deferred_aborts: int = 0


class ForwardWorker:
    """A daemon thread that runs ``runner.run`` on launched batches, in launch order."""

    def __init__(self, runner: ModelRunner, runtime: Runtime = THREADS) -> None:
        self.runner, self.runtime = runner, runtime
        self._jobs: queue.Queue[ForwardJob | None] = queue.Queue()
        runtime.start_thread(self._loop, "forward-worker")

    def launch(self, batch: Batch, inputs: BatchInputs) -> ForwardJob:
        job = ForwardJob(batch, inputs, Future())
        self._jobs.put(job)
        return job

    def close(self) -> None:
        self._jobs.put(None)

    def _loop(self) -> None:
        while (job := self.runtime.get(self._jobs)) is not None:
            try:
                job.result.set_result(self.runner.run(job.batch, job.inputs))
            except BaseException as exc:  # noqa: BLE001 - re-raised on the engine thread
                job.result.set_exception(exc)


@dataclass
class OverlapState:
    """What the overlap step keeps between steps: the forward in flight and deferred aborts."""

    stats: OverlapStats = field(default_factory=OverlapStats)
    inflight: ForwardJob | None = None
    to_abort: list[Sequence] = field(default_factory=list)
    resolved: tuple = ()  # every token of the last resolved forward, discarded ones included
    worker: ForwardWorker | None = None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
