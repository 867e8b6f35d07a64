"""Deterministic simulation of an engine under load: a seed is one interleaving, forever.

``run(patches, seed, workload)`` builds an ``Engine`` (HiCache on, so turn 2 loads its prefix
back layer by layer) on an ``engine.sim.SimRuntime`` and plays the same sessions as
``inject_concurrency`` (same transcripts, same conversation rule, greedy) from client threads of
the simulation. Every place the real system interleaves is a seeded decision: each engine step,
each layer of each forward (a virtual duration, ``Workload.layer_us``), each HiCache layer copy
(index-K, K/V), each counter advance, each client's submission; the injected HiCache delays are
virtual durations. Responses are parsed by
the strict parser and judged against ``ReferenceOracle`` exactly like a real load, so the result
is the same ``LoadResult``. ``explore`` runs many seeds, ``replay`` runs one again and checks
tokens and decisions are identical, ``trial`` makes a deterministic bisection/ddmin trial, and
``workbench.shrink.shrink`` reduces a failing run's workload.

Scope: one engine with its HiCache loader (the index-K and K/V races, ``SIMULATED``). The PD
transfer layer, router, HTTP servers and the overlap forward thread run only in real mode so far;
``run`` refuses their patch variants.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import EngineConfig
from engine.core.engine import Engine
from engine.core.sequence import FinishReason, SamplingParams, Sequence, TokenEvent
from engine.model.model import TinyDeepSeek, load_model
from engine.serving.generation import plan_prompt, token_text
from engine.sim import Decision, SimRuntime
from engine.text.chat import ToolCall, ToolSpec
from engine.text.dsml import arguments_json
from engine.text.parsers import get_parser
from workbench.concurrency import LoadResult, load_result
from workbench.load import RequestRecord, call_turn, session_transcript
from workbench.oracle import ReferenceOracle, judge
from workbench.progress import Progress

log = logging.getLogger(__name__)
IDLE_S = 0.001  # virtual seconds an idle engine waits before its next step
SIMULATED = frozenset({"bf16_index_k", "chunk_prev_token_dropped", "hicache_index_k_no_wait",
                       "hicache_kv_no_wait", "hicache_v_after_counter", "index_k_not_backed_up"})
"""Patch variants whose code runs in one engine with its HiCache loader. The PD transfer-layer
variants act in roles the simulation does not build yet, and ``overlap_schedule``'s forward
thread is not driven by the simulator: asking for them raises rather than passing silently."""


def check_simulated(patches: Iterable[str]) -> tuple[str, ...]:
    """``patches`` sorted; ValueError naming any the simulation cannot run."""
    patches = tuple(sorted(patches))
    missing = [p for p in patches if p not in SIMULATED]
    if missing:
        raise ValueError(f"not simulated (real mode only): {', '.join(missing)}; simulated "
                         f"patch variants: {', '.join(sorted(SIMULATED))}")
    return patches


@dataclass(frozen=True)
class Workload:
    """What a simulated run plays: ``sessions`` transcripts of ``inject_concurrency``'s load
    ``load_seed``, ``turns`` rounds each, ``max_tokens`` per response, on an engine configured by
    ``engine`` with seeded ``faults`` (their delays become virtual time)."""

    sessions: int = 6
    turns: int = 2
    max_tokens: int = 64
    load_seed: int = 0
    engine: dict = field(default_factory=lambda: {
        "hicache": True, "hicache_offload_on_finish": True, "num_pages": 512})
    faults: dict = field(default_factory=lambda: {
        "seed": 7, "hicache_ns_per_byte": 2000.0, "hicache_jitter": 0.3})
    layer_us: float = 250.0  # virtual cost of one layer of a forward: fixed part
    layer_us_per_token: float = 2.0  # and per token of the batch

    def __post_init__(self) -> None:
        if self.sessions < 1 or self.turns < 1 or self.max_tokens < 1:
            raise ValueError("sessions, turns and max_tokens must be >= 1")

    def config(self, patches: Iterable[str]) -> EngineConfig:
        return EngineConfig(**self.engine, patches=frozenset(patches), faults=self.faults)


@dataclass(frozen=True)
class SimRun:
    """One simulated schedule: the judged load, every decision, and the forward share of wall
    time (``forward_s``: time inside engine steps)."""

    patches: tuple[str, ...]
    seed: int
    strategy: str
    workload: Workload
    stop_at_flag: bool
    result: LoadResult
    trace: tuple[Decision, ...]
    tokens: tuple[tuple[int, ...], ...]  # every response's token ids, in request order
    wall_s: float
    forward_s: float

    @property
    def flagged(self) -> int:
        return self.result.summary.flagged

    @property
    def fingerprint(self) -> str:
        """A digest of the decision trace and every token: equal fingerprints, equal runs."""
        h = hashlib.sha256()
        for d in self.trace:
            h.update(f"{d.step}|{d.thread}|{d.label}|{d.now:.9f}\n".encode())
        h.update(repr(self.tokens).encode())
        return h.hexdigest()[:16]


@functools.lru_cache(maxsize=2)
def _model(model_dir: str) -> TinyDeepSeek:
    return load_model(Path(model_dir) / "model.safetensors")


@functools.lru_cache(maxsize=4)
def _oracle(cfg: EngineConfig) -> ReferenceOracle:
    return ReferenceOracle(cfg)


class _Simulation:
    """The threads of one run: the engine loop, one client per session, and ``main``."""

    def __init__(self, cfg: EngineConfig, workload: Workload, sim: SimRuntime,
                 stop_at_flag: bool) -> None:
        self.cfg, self.w, self.sim, self.stop_at_flag = cfg, workload, sim, stop_at_flag
        self.stopped = False
        self.oracle = _oracle(cfg)
        self.parser = get_parser("strict")
        self.records: list[tuple[int, RequestRecord]] = []
        self.finished = 0
        self.forward_s = 0.0
        self.engine: Engine | None = None

    def main(self) -> None:
        self.engine = Engine(self.cfg, model=_model(self.cfg.model_dir), runtime=self.sim)
        self.engine.runner.before_layer = self._layer
        self.sim.start_thread(self._engine_loop, "engine")
        for i in range(self.w.sessions):
            self.sim.start_thread(lambda i=i: self._session(i), f"client{i}")
        self.sim.wait_for(None, lambda: self.finished == self.w.sessions, math.inf)

    def _layer(self, li: int, batch) -> None:
        """A forward layer takes virtual time (so loads and forwards really overlap), and the
        loader may run meanwhile."""
        self.sim.sleep((self.w.layer_us + self.w.layer_us_per_token * batch.num_tokens) * 1e-6)

    def _engine_loop(self) -> None:
        while self.finished < self.w.sessions:
            self.sim.point("engine.step")
            t0 = time.perf_counter()
            ran = self.engine.step()
            self.forward_s += time.perf_counter() - t0
            if ran is None:
                self.sim.sleep(IDLE_S)

    def _session(self, i: int) -> None:
        try:
            tr = session_transcript(self.w.load_seed, i)
            tools = [t.to_openai() for t in tr.tools]
            messages = tr.messages()[:1]
            for turn, rnd in enumerate(tr.rounds[: self.w.turns]):
                if self.stopped:
                    return
                messages.append({"role": "user", "content": rnd.ask})
                rec = self._request(i, turn, "call", messages, tools, rnd.call)
                if len(rec.tool_calls) != 1:
                    return
                messages += call_turn(turn, rec.tool_calls[0], rnd.result)
                if self.stopped:
                    return
                rec = self._request(i, turn, "answer", messages, tools, None)
                messages.append({"role": "assistant", "content": rec.content})
        finally:
            self.finished += 1

    def _request(self, i: int, turn: int, kind: str, messages: list[dict], tools: list[dict],
                 expected: ToolCall | None) -> RequestRecord:
        specs = [ToolSpec.from_openai(t) for t in tools]
        ids = plan_prompt(self.engine.tokenizer, messages, specs, None).ids
        events: list[TokenEvent] = []
        seq = Sequence(f"s{i}-t{turn}-{kind}", ids,
                       SamplingParams(max_tokens=self.w.max_tokens, temperature=0.0, seed=i),
                       sink=events.append)
        self.sim.point(f"client{i} submits")
        self.engine.submit(seq)
        self.sim.wait_for(None, lambda: seq.finish_reason is not None, math.inf)
        rec = self._record(i, turn, kind, messages, tools, seq)
        ref = self.oracle.expected(ids, self.w.max_tokens)
        rec.verdict = judge(rec.content, rec.tool_calls, rec.dsml_leaked, expected,
                            rec.token_ids, ref, finish_reason=rec.finish_reason)
        self.records.append((len(self.records), rec))
        self.stopped |= self.stop_at_flag and rec.verdict.flagged
        return rec

    def _record(self, i, turn, kind, messages, tools, seq: Sequence) -> RequestRecord:
        tk = self.engine.tokenizer
        text = "".join(token_text(tk, t) for t in seq.output)
        parsed = self.parser.parse(text, [ToolSpec.from_openai(t) for t in tools] or None)
        calls = [{"name": c.name, "arguments": arguments_json(c.arguments)}
                 for c in parsed.calls]
        finish = ("tool_calls" if calls else
                  "length" if seq.finish_reason is FinishReason.LENGTH else "stop")
        return RequestRecord(i, turn, kind, status=200, finish_reason=finish,
                             content=parsed.content or "", tool_calls=calls,
                             token_ids=list(seq.output), prompt_ids=list(seq.prompt),
                             messages=[dict(m) for m in messages], tools=tools,
                             dsml_leaked=parsed.leaked)


def run(patches: Iterable[str] = (), seed: int = 0, workload: Workload = Workload(),
        strategy: str = "random", stop_at_flag: bool = False) -> SimRun:
    """One schedule of ``workload`` on the code with ``patches``, chosen by ``seed`` and
    ``strategy`` (``"random"`` walk or ``"pct"``); the same arguments give the same run. With
    ``stop_at_flag`` no session starts a request after the first flagged response."""
    patches = check_simulated(patches)
    cfg = workload.config(patches)
    sim = SimRuntime(seed, strategy)
    state = _Simulation(cfg, workload, sim, stop_at_flag)
    t0 = time.perf_counter()
    sim.run(state.main)
    wall = time.perf_counter() - t0
    records = [r for _, r in sorted(state.records, key=lambda x: x[0])]
    tokens = tuple(tuple(r.token_ids or ()) for r in
                   sorted(records, key=lambda r: (r.session, r.turn, r.kind)))
    return SimRun(patches, seed, strategy, workload, stop_at_flag, load_result(records, wall),
                  tuple(sim.trace), tokens, round(wall, 3), round(state.forward_s, 3))


@dataclass(frozen=True)
class Exploration:
    """Schedules explored in seed order; ``failures`` are the runs with a flagged response."""

    runs: tuple[SimRun, ...]

    @property
    def failures(self) -> tuple[SimRun, ...]:
        return tuple(r for r in self.runs if r.flagged)

    @property
    def first_failure(self) -> SimRun | None:
        return next(iter(self.failures), None)


def explore(patches: Iterable[str] = (), seeds: Iterable[int] = range(100),
            workload: Workload = Workload(), strategy: str = "random",
            stop_on_failure: bool = True, progress: bool = True) -> Exploration:
    """Runs one schedule per seed until one fails (``stop_on_failure``: each schedule also stops
    starting requests at its first flag) or the seeds run out."""
    seeds = list(seeds)
    bar = Progress(len(seeds), f"sim {strategy}", enabled=progress)
    runs = []
    for seed in seeds:
        runs.append(run(patches, seed, workload, strategy, stop_at_flag=stop_on_failure))
        bar.update(len(runs), sum(bool(r.flagged) for r in runs))
        if stop_on_failure and runs[-1].flagged:
            break
    bar.close()
    return Exploration(tuple(runs))


def replay(original: SimRun) -> SimRun:
    """Runs ``original``'s schedule again; raises ``ReplayDiverged`` unless every decision and
    every token is identical."""
    again = run(original.patches, original.seed, original.workload, original.strategy,
                original.stop_at_flag)
    if again.fingerprint != original.fingerprint:
        raise ReplayDiverged(f"seed {original.seed}: {original.fingerprint} then "
                             f"{again.fingerprint}")
    return again


def trial(workload: Workload = Workload(), strategy: str = "random"):
    """``trial(patches, seed) -> failed``: one simulated schedule of ``workload`` on the code
    with ``patches`` (stopping at its first flag). The same arguments always give the same
    answer, so a bisection or ddmin driven by it is reproducible from its seed alone; it fits
    ``workbench.ddmin.ddmin`` directly and ``bisect_patch_series(sim=...)``."""
    def simulated(patches: Iterable[str], seed: int) -> bool:
        got = run(patches, seed, workload, strategy, stop_at_flag=True)
        log.info("sim trial %s seed %d: %d flagged", sorted(patches), seed, got.flagged)
        return got.flagged > 0
    return simulated


class ReplayDiverged(AssertionError):
    """A replayed schedule differed from the original (a nondeterminism escaped the seams)."""
