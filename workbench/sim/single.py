"""The simulated clients and the one-engine system they load (``EngineSimulation``).

Clients play the load's own sessions (``session_transcript``, the same conversation rule,
greedy) from threads of the simulation; each response is parsed by the strict parser and judged
against ``ReferenceOracle`` exactly like a real load. A forward layer costs virtual time
(``Workload.layer_us``), so loads and forwards overlap. ``workbench.sim.pd`` swaps the one engine
for a PD pair and keeps the clients.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path

from engine.config import EngineConfig
from engine.core import Engine, FinishReason, SamplingParams, Sequence, TokenEvent
from engine.model import TinyDeepSeek, load_model
from engine.serving.generation import plan_prompt, token_text
from engine.sim import SimRuntime
from engine.text import ToolCall, ToolSpec
from engine.text.dsml import arguments_json
from engine.text.parsers import get_parser
from workbench.drive.load import RequestRecord, call_turn, session_transcript
from workbench.judge import ReferenceOracle, judge
from workbench.sim.workload import SimEvidence, Workload

IDLE_S = 0.001  # virtual seconds an idle engine waits before its next step


@functools.lru_cache(maxsize=2)
def shared_model(model_dir: str) -> TinyDeepSeek:
    return load_model(Path(model_dir) / "model.safetensors")


@functools.lru_cache(maxsize=4)
def _oracle(cfg: EngineConfig) -> ReferenceOracle:
    return ReferenceOracle(cfg)


@dataclass(frozen=True)
class Served:
    """How one request ended for its client: ``seq`` finished, or ``killed`` by the client, or
    ``error`` (the system failed it, or never answered)."""

    seq: Sequence
    room: int | None = None
    killed: bool = False
    error: str = ""
    status: int | None = None  # of an error: 504 a KV timeout, 502 another failure (as HTTP)


class EngineSimulation:
    """The threads of one run: the engine loop, one client per session, and ``main``."""

    def __init__(self, cfg: EngineConfig, workload: Workload, sim: SimRuntime, seed: int,
                 stop_at_flag: bool) -> None:
        self.cfg, self.w, self.sim, self.stop_at_flag = cfg, workload, sim, stop_at_flag
        self.seed = seed
        self.stopped = False
        self.oracle = _oracle(cfg)
        self.parser = get_parser("strict")
        self.records: list[tuple[int, RequestRecord]] = []
        self.finished = 0
        self.forward_s = 0.0
        self.engine: Engine | None = None
        self.evidence = SimEvidence()

    def main(self) -> None:
        self.engine = Engine(self.cfg, model=shared_model(self.cfg.model_dir), runtime=self.sim)
        self.engine.runner.before_layer = self._layer
        self.sim.start_thread(self._engine_loop, "engine")
        self._clients()

    def _clients(self) -> None:
        for i in range(self.w.sessions):
            self.sim.start_thread(lambda i=i: self._session(i), f"client{i}")
        self.sim.wait_for(None, lambda: self.finished == self.w.sessions, math.inf)

    def judge(self, requests) -> SimEvidence:
        """What the system recorded, with buffer-level judging where it has one (a PD pair)."""
        return self.evidence

    def _layer(self, li: int, batch) -> None:
        """A forward layer takes virtual time (so loads and forwards really overlap), and the
        loader may run meanwhile."""
        self.sim.sleep((self.w.layer_us + self.w.layer_us_per_token * batch.num_tokens) * 1e-6)

    def _step(self, engine: Engine) -> object:
        t0 = time.perf_counter()
        ran = engine.step()
        self.forward_s += time.perf_counter() - t0
        return ran

    def _engine_loop(self) -> None:
        while self.finished < self.w.sessions:
            self.sim.point("engine.step")
            if self._step(self.engine) is None:
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
                if len(rec.tool_calls) != 1 or rec.killed or rec.error:
                    return
                messages += call_turn(turn, rec.tool_calls[0], rnd.result)
                if self.stopped:
                    return
                rec = self._request(i, turn, "answer", messages, tools, None)
                if rec.killed or rec.error:
                    return
                messages.append({"role": "assistant", "content": rec.content})
        finally:
            self.finished += 1

    def _serve(self, i: int, rid: str, ids: list[int], events: list[TokenEvent]) -> Served:
        """Submits one request and waits for its end (the system's own way)."""
        seq = Sequence(rid, ids, SamplingParams(max_tokens=self.w.max_tokens, temperature=0.0,
                                                seed=i, logprobs=0), sink=events.append)
        self.sim.point(f"client{i} submits")
        self.engine.submit(seq)
        limit = self.w.request_timeout_s
        if not self.sim.wait_for(None, lambda: seq.finish_reason is not None, limit):
            self.engine.abort(rid)  # the client gives up; a wedged engine is an error, not a hang
            return Served(seq, error=f"no response within {limit:g} s (virtual)")
        return Served(seq)

    def _request(self, i: int, turn: int, kind: str, messages: list[dict], tools: list[dict],
                 expected: ToolCall | None) -> RequestRecord:
        specs = [ToolSpec.from_openai(t) for t in tools]
        ids = plan_prompt(self.engine.tokenizer, messages, specs, None).ids
        served = self._serve(i, f"s{i}-t{turn}-{kind}", ids, [])
        rec = self._record(i, turn, kind, messages, tools, served)
        if not (served.killed or served.error):
            ref = self.oracle.scored(ids, self.w.max_tokens)
            rec.verdict = judge(rec.content, rec.tool_calls, rec.dsml_leaked, expected,
                                rec.token_ids, list(ref.tokens), finish_reason=rec.finish_reason,
                                logprobs=rec.logprobs, ref_logprobs=list(ref.logprobs),
                                tolerance=self.oracle.drift_tolerance)
            self.stopped |= self.stop_at_flag and rec.verdict.flagged
        self.records.append((len(self.records), rec))
        return rec

    def _record(self, i, turn, kind, messages, tools, served: Served) -> RequestRecord:
        seq, tk = served.seq, self.engine.tokenizer
        base = dict(session=i, turn=turn, kind=kind, room=served.room,
                    prompt_ids=list(seq.prompt), messages=[dict(m) for m in messages],
                    tools=tools)
        if served.killed or served.error:
            return RequestRecord(**base, status=served.status, killed=served.killed,
                                 error=served.error)
        text = "".join(token_text(tk, t) for t in seq.output)
        parsed = self.parser.parse(text, [ToolSpec.from_openai(t) for t in tools] or None)
        calls = [{"name": c.name, "arguments": arguments_json(c.arguments)}
                 for c in parsed.calls]
        finish = ("tool_calls" if calls else "length" if seq.finish_reason is FinishReason.LENGTH
                  else "abort" if seq.finish_reason is FinishReason.ABORT else "stop")
        return RequestRecord(**base, status=200, finish_reason=finish,
                             content=parsed.content or "", tool_calls=calls,
                             token_ids=list(seq.output), dsml_leaked=parsed.leaked,
                             logprobs=[None if math.isnan(lp.logprob) else lp.logprob
                                       for lp in seq.logprobs])
