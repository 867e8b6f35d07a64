"""The serving engine: scheduler + model runner driven by one background thread.

Thread model: ``submit`` and ``abort`` may be called from any thread; they only enqueue. The loop
thread owns the scheduler, pools and model; it delivers ``TokenEvent``s through each request's
sink (which must be cheap and thread-safe, e.g. ``loop.call_soon_threadsafe``). ``step`` runs
the normal step, or with the ``overlap_schedule`` patch the overlap step: the model forward runs
on a worker thread, one step ahead of the result processing (order and invariants in
``engine.core.overlap``). Both share the inbox, ``poll``, ``_accept`` and ``_finish``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.cache import HiRadixCache, KVPool, PageAllocator, RadixCache
from engine.config import EngineConfig
from engine.core.dump import BoundedMap, CaptureRing
from engine.core.inbox import MESSAGE_TYPES, AbortRequest, AddRequest, CallSoon, InboxMessage
from engine.core.model_runner import ModelRunner, StepOutput
from engine.core.overlap import ForwardWorker, OverlapState
from engine.core.scheduler import Scheduler
from engine.core.sequence import (
    Failure,
    FailureKind,
    FinishReason,
    Sequence,
    Status,
    TokenEvent,
    TokenLogprob,
)
from engine.core.variants import CoreHooks
from engine.core.views import EngineViews
from engine.faults import FaultInjector
from engine.model import TinyDeepSeek, load_model
from engine.runtime import THREADS, Runtime
from engine.text import Tokenizer
from engine.variants import hooks_for

log = logging.getLogger(__name__)


class PromptTooLongError(ValueError):
    """The prompt (plus max_tokens) does not fit the engine's limits."""


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_tokens: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in FinishReason})
    busy_seconds: float = 0.0


class Engine(EngineViews):
    def __init__(self, cfg: EngineConfig, model: TinyDeepSeek | None = None,
                 runtime: Runtime = THREADS) -> None:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.cfg = cfg
        self.runtime = runtime  # threads and time of the HiCache loader (engine.sim drives it)
        self.tokenizer = Tokenizer()
        self.model = (model or load_model(Path(cfg.model_dir) / "model.safetensors")).to(cfg.device)
        self.pool = KVPool.create(self.model.cfg, cfg)
        self.allocator = PageAllocator(cfg.num_pages)
        self.faults = FaultInjector(cfg.faults)
        self.hooks = hooks_for(CoreHooks, cfg.patches)  # variants, chosen once
        self.cache = self._make_cache() if cfg.prefix_cache else None
        self.scheduler = Scheduler(cfg, self.allocator, self.cache)
        self.runner = ModelRunner(self.model, self.pool, cfg, self.hooks)
        self.stats = EngineStats()
        self._inbox: queue.Queue[InboxMessage] = queue.Queue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.idle_wait_s = 0.05
        self.captures = CaptureRing(cfg.debug_capture)
        self.rid_of_room: BoundedMap[int, str] = BoundedMap(max(1024, cfg.debug_capture))
        self.room_requests: BoundedMap[int, tuple] = BoundedMap(max(1024, cfg.debug_capture))
        self.overlap = OverlapState() if self.hooks.overlap else None

    def _make_cache(self) -> RadixCache:
        if self.cfg.hicache:
            return HiRadixCache(self.allocator, self.pool, self.cfg.hicache_host_pages,
                                self.faults, not self.hooks.waits_index_k,
                                backup_index_k=self.hooks.backs_up_index_k,
                                runtime=self.runtime,
                                v_after_counter=self.hooks.v_after_counter,
                                partial_page_min=self.hooks.partial_page_min)
        return RadixCache(self.allocator, self.cfg.page_size, self.hooks.partial_page_min)

    def validate(self, prompt: list[int], max_tokens: int) -> None:
        limit = min(self.cfg.max_prompt_tokens, self.model.cfg.max_seq_len - max_tokens)
        if len(prompt) > limit:
            raise PromptTooLongError(
                f"prompt has {len(prompt)} tokens; limit with max_tokens={max_tokens} is {limit}")
        if max_tokens > self.cfg.max_new_tokens:
            raise PromptTooLongError(f"max_tokens {max_tokens} > {self.cfg.max_new_tokens}")

    def submit(self, seq: Sequence) -> Sequence:
        self.validate(seq.prompt, seq.params.max_tokens)
        self._post(AddRequest(seq))
        return seq

    def abort(self, rid: str) -> None:
        self._post(AbortRequest(rid))

    def pending(self) -> bool:
        """Whether inbox messages wait for the next step (any thread)."""
        return not self._inbox.empty()

    def call_soon(self, fn) -> None:
        """Runs ``fn()`` on the engine thread before the next step (thread-safe)."""
        self._post(CallSoon(fn))

    def _post(self, msg: InboxMessage) -> None:
        if not isinstance(msg, MESSAGE_TYPES):
            raise TypeError(f"not an inbox message: {msg!r}")
        self._inbox.put(msg)
        self._wake.set()

    def _drain_inbox(self) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            match msg:
                case AddRequest(seq):
                    self.scheduler.add(seq)
                    self.stats.prompt_tokens += len(seq.prompt)
                case AbortRequest(rid):
                    self._abort(rid)
                case CallSoon(fn):
                    fn()

    def _abort(self, rid: str) -> None:
        seq = self.scheduler.find(rid)
        if seq is None:
            return
        if self.overlap is not None and seq.status is Status.RUNNING:
            if seq not in self.overlap.to_abort:  # deferred to the end of the overlap step
                self.overlap.to_abort.append(seq)
                self.overlap.stats.deferred_aborts += 1
        else:
            self._finish(seq, FinishReason.ABORT)

    def poll(self) -> None:
        """Hook run on the engine thread at every step (PD queues override it)."""

    def _finish(self, seq: Sequence, reason: FinishReason, release: bool = True) -> None:
        """Ends ``seq`` (captured first, for dumps); ``release=False`` leaves its pages to the
        caller."""
        self.capture(seq)
        self.scheduler.finish(seq, reason, release)
        self.stats.finished[reason.value] += 1
        seq.sink(TokenEvent(seq.rid, None, reason, seq.num_cached, failure=seq.failure))

    def step(self) -> StepOutput | None:
        """Runs one scheduling step; returns None when there was nothing to run.

        With overlap scheduling the step's forward is still running when it returns; its results
        are processed by the next step.
        """
        self._drain_inbox()
        self.poll()
        t0 = time.perf_counter()
        out = self._normal_step() if self.overlap is None else self._overlap_step(self.overlap)
        if out is not None:
            self.stats.busy_seconds += time.perf_counter() - t0
        return out

    def _normal_step(self) -> StepOutput | None:
        batch = self.scheduler.schedule()
        if not batch:
            return None
        self.faults.step()
        out = self.runner.run(batch)
        for it in batch.items:
            it.seq.num_computed = it.start + it.num_tokens
        for s in self.hooks.route_tokens(out.sampled):
            self._accept(s.seq, s.token, s.logprob)
        self.stats.steps += 1
        return out

    def _overlap_step(self, ov: OverlapState) -> StepOutput | None:
        last = self._resolve(ov)
        future = self.hooks.future_tokens(last.sampled, ov.resolved) if last else {}
        batch = self.scheduler.schedule()
        if batch:
            self.faults.step()
            if ov.worker is None:
                ov.worker = ForwardWorker(self.runner, self.runtime)
            ov.inflight = ov.worker.launch(batch, self.runner.prepare(batch, future))
            ov.stats.launched += 1
            self.stats.steps += 1
        for s in self.hooks.route_tokens(last.sampled) if last else ():
            self._accept(s.seq, s.token, s.logprob)
        pending, ov.to_abort = ov.to_abort, []
        for seq in pending:
            if seq.status is Status.RUNNING:
                self._finish(seq, FinishReason.ABORT)
        if last is None and not batch:
            return None
        return last if last is not None else StepOutput((), 0)

    def _resolve(self, ov: OverlapState) -> StepOutput | None:
        """Waits for the forward in flight (re-raising its error after forgetting it); its
        tokens for sequences still running, not yet processed."""
        job, ov.inflight = ov.inflight, None
        if job is None:
            return None
        out = self.runtime.result(job.result)
        for it in job.batch.items:
            if it.seq.status is Status.RUNNING:
                it.seq.num_computed = it.start + it.num_tokens
        live = tuple(s for s in out.sampled if s.seq.status is Status.RUNNING)
        ov.resolved = out.sampled
        ov.stats.discarded_tokens += len(out.sampled) - len(live)
        return StepOutput(live, out.num_tokens)

    def _accept(self, seq: Sequence, token: int, logprob: TokenLogprob | None = None) -> None:
        if seq.status is not Status.RUNNING:
            return
        seq.output.append(token)
        if logprob is not None:
            seq.logprobs.append(logprob)
        self.stats.generated_tokens += 1
        if len(seq.output) == 1:
            self.stats.cached_tokens += seq.num_cached
        seq.sink(TokenEvent(seq.rid, token, None, seq.num_cached, logprob))
        eos = token == self.tokenizer.eos_id and not seq.params.ignore_eos
        stop = eos or token in seq.params.stop_token_ids
        if stop or len(seq.output) >= seq.params.max_tokens:
            self._finish(seq, FinishReason.STOP if stop else FinishReason.LENGTH)

    def run_until_idle(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if self.step() is None and self._inbox.empty():
                return

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.overlap is not None:
            self.overlap.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ran = self.step()
            except Exception as exc:  # noqa: BLE001 - the loop outlives any one step
                log.exception("engine step failed; failing running requests")
                self._abort_all(Failure(FailureKind.ENGINE, f"engine step failed: "
                                                            f"{type(exc).__name__}: {exc}"))
                ran = None
            if ran is None:
                self._wake.wait(timeout=self.idle_wait_s)
                self._wake.clear()

    def _abort_all(self, failure: Failure) -> None:
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            try:
                seq.failure = seq.failure or failure
                self._finish(seq, FinishReason.ERROR)
            except Exception:  # noqa: BLE001 - one request's cleanup never ends the loop
                log.exception("abort of %s failed", seq.rid)
