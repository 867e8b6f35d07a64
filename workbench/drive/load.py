"""Concurrency injection: seeded multi-turn agentic sessions over streaming HTTP, with kills.

``inject_concurrency(target, sessions=64, ...)`` plays held-out transcripts concurrently against
any OpenAI-compatible URL (or a ``PDPair``), kills a seeded fraction of requests mid-stream, and
judges every completed response with the oracle. Every random choice derives from ``seed``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, replace

import httpx

from engine.model import Scored
from engine.training.datagen import EVAL_SEED_BASE, Transcript, make_transcript
from workbench.drive.align import pad_to_boundary
from workbench.drive.client import send_chat
from workbench.drive.dialects import DIALECTS, RequestParams, Turn
from workbench.drive.record import RequestRecord
from workbench.drive.verdicts import compared_tokens, feature_verdict, judged_reference
from workbench.judge import ReferenceOracle, Verdict, judge

SESSION_SEED_BASE = EVAL_SEED_BASE + 500_000
__all__ = ["LoadConfig", "RequestRecord", "SessionRunner", "call_turn", "chat_body",
           "session_transcript"]


@dataclass(frozen=True)
class LoadConfig:
    sessions: int = 64
    turns: int = 2
    kill_fraction: float = 0.0
    duration_s: float = 300.0
    seed: int = 0
    max_tokens: int = 160
    request_timeout_s: float = 180.0
    kill_window_s: float = 1.5  # a killed request is cancelled at uniform(0, window) seconds
    logprobs: bool = False  # also ask for logprobs (token ids through routers that drop ours)
    model: str | None = None  # sent as the request's "model" (servers such as vLLM require it)
    align_to: int | None = None  # pad prompts to end on a multiple of this many tokens
    dialect: str = "greedy"  # how each request calls the API (workbench.drive.dialects)

    def __post_init__(self) -> None:
        if not 0.0 <= self.kill_fraction <= 1.0 or self.sessions < 1 or self.turns < 1:
            raise ValueError("need sessions >= 1, turns >= 1 and kill_fraction in [0, 1]")
        DIALECTS.get(self.dialect)  # unknown names list the valid ones


def chat_body(cfg: LoadConfig, messages: list[dict], tools: list[dict], seed: int,
              stream: bool = True, params: RequestParams | None = None) -> dict:
    """The request body a probe sends: seeded, asking for token ids; greedy and ``stream`` as
    given unless ``params`` (a dialect's draw) says otherwise."""
    p = params or RequestParams(stream=stream)
    body = {"messages": messages, "tools": tools, "max_tokens": p.max_tokens or cfg.max_tokens,
            "return_token_ids": True, "seed": p.seed if p.seed is not None else seed, **p.body()}
    if cfg.logprobs or p.top_logprobs:
        body["logprobs"] = True
    if cfg.model is not None:
        body["model"] = cfg.model
    return body


def call_turn(turn: int, call: dict, result: str) -> list[dict]:
    """The messages a session appends after turn ``turn``'s call: the assistant's call
    (``{"name", "arguments"}`` as received) and the tool's result."""
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{turn}", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": f"call_{turn}", "content": result}]


def session_transcript(load_seed: int, session: int) -> Transcript:
    """The transcript session ``session`` of a load seeded ``load_seed`` plays."""
    return make_transcript(SESSION_SEED_BASE + load_seed * 10_007 + session)


class SessionRunner:
    """Plays one transcript: per round, the tool-call request then the final-answer request."""

    def __init__(self, cfg: LoadConfig, url: str, session: int, oracle: ReferenceOracle | None,
                 deadline: float, sink) -> None:
        if oracle is not None and not cfg.logprobs:  # the oracle judges logprobs too
            cfg = replace(cfg, logprobs=True)
        self.cfg, self.url, self.session, self.oracle = cfg, url, session, oracle
        self.tr: Transcript = session_transcript(cfg.seed, session)
        self.rng = random.Random(f"{cfg.seed}:{session}")
        self.dialect_rng = random.Random(f"{cfg.seed}:{session}:{cfg.dialect}")
        self.off_script = bool(cfg.align_to)  # the history is no longer the transcript's
        self.deadline, self.sink = deadline, sink
        self.tools = [t.to_openai() for t in self.tr.tools]

    async def run(self, client: httpx.AsyncClient) -> None:
        messages = self.tr.messages()[:1]
        for turn, rnd in enumerate(self.tr.rounds[: self.cfg.turns]):
            if time.monotonic() > self.deadline:
                return
            messages.append({"role": "user", "content": rnd.ask})
            rec = await self.request(client, self._aligned(messages), turn, "call", rnd.call,
                                     rnd.answer)
            if rec.killed or rec.status != 200 or len(rec.tool_calls) != 1:
                return
            messages += call_turn(turn, rec.tool_calls[0], rnd.result)
            rec = await self.request(client, self._aligned(messages), turn, "answer", None,
                                     rnd.answer)
            if rec.killed or rec.status != 200:
                return
            messages.append({"role": "assistant", "content": rec.content})

    def _aligned(self, messages: list[dict]) -> list[dict]:
        """``messages`` padded in place (the history keeps the padding, so later turns still hit
        the prefix cache) when the load aligns prompts."""
        if self.cfg.align_to:
            pad_to_boundary(messages, self.tools, self.cfg.align_to)
        return messages

    def _params(self, kind: str, expected, answer: str) -> RequestParams:
        turn = Turn(kind, expected.name if expected is not None else None, answer,
                    self.cfg.max_tokens)
        return DIALECTS.get(self.cfg.dialect).draw(self.dialect_rng, turn)

    async def request(self, client, messages, turn, kind, expected, answer: str = ""
                      ) -> RequestRecord:
        params = self._params(kind, expected, answer)
        if self.off_script or params.sampled:
            expected = None  # padded or sampled (now or before): the transcript's call is not owed
        rec = RequestRecord(self.session, turn, kind, messages=json.loads(json.dumps(messages)),
                            tools=self.tools, max_tokens=params.max_tokens or self.cfg.max_tokens,
                            params=params)
        body = chat_body(self.cfg, messages, self.tools, self.session, params=params)
        kill = self.rng.random() < self.cfg.kill_fraction
        kill_at = self.rng.uniform(0.0, self.cfg.kill_window_s) if kill else None
        await send_judged(client, self.url, body, rec, self.oracle, kill_at, expected,
                          self.off_script)
        self.off_script |= params.sampled
        self.sink(rec)
        return rec


async def judge_record(oracle: ReferenceOracle | None, rec: RequestRecord, expected,
                       oracle_error: str, off_script: bool) -> None:
    """Sets ``rec``'s verdict and feature verdict against the greedy reference (where one
    applies to its params). ``off_script``: its history left the transcript (padding, an
    earlier sampled turn, a replayed trace), so markup the reference writes too is the
    model's, not the server's."""
    ref = None
    if oracle is not None and not oracle_error and judged_reference(rec.params):
        try:
            ref = await asyncio.to_thread(oracle.scored, rec.prompt_ids, rec.max_tokens)
        except Exception as exc:  # noqa: BLE001 - flags this request, the run goes on
            oracle_error = f"{type(exc).__name__}: {exc}"[:300]
    rec.verdict = verdict(oracle, rec, expected, ref, oracle_error)
    rec.features = feature_verdict(rec, ref)
    if ref is not None:
        rec.ref_token_ids, rec.ref_logprobs = list(ref.tokens), list(ref.logprobs)
    if off_script and rec.verdict.ref_match:
        rec.verdict = replace(rec.verdict, leaked=False)
    if rec.params.sampled:  # no reference to hold it to: judged alone, by its seed
        rec.verdict = replace(rec.verdict, leaked=False, well_formed=None)


def verdict(oracle: ReferenceOracle | None, rec: RequestRecord, expected, ref: Scored | None,
            oracle_error: str) -> Verdict:
    """``rec``'s verdict against the reference ``ref`` (None: none), logprob drift included
    when the server sent logprobs; the tolerance is the oracle's (None: drift not flagged)."""
    tol = oracle.drift_tolerance if oracle is not None else None
    reference, tokens = compared_tokens(rec, ref)
    return judge(rec.content, rec.tool_calls, rec.dsml_leaked, expected, tokens,
                 reference, oracle_error, rec.finish_reason,
                 logprobs=rec.logprobs, ref_logprobs=list(ref.logprobs) if ref else None,
                 tolerance=tol)


async def send_judged(client: httpx.AsyncClient, url: str, body: dict, rec: RequestRecord,
                      oracle: ReferenceOracle | None, kill_at: float | None, expected,
                      off_script: bool) -> None:
    """Sends ``body`` into ``rec`` (cancelled as a kill after ``kill_at`` seconds; an HTTP or
    JSON failure is the request's error) and judges an answered one (``judge_record``)."""
    oracle_error = ""
    if oracle is not None:
        try:
            rec.prompt_ids = oracle.prompt_ids(body["messages"], body.get("tools") or [])
        except Exception as exc:  # noqa: BLE001 - an oracle failure flags this request only
            oracle_error = f"{type(exc).__name__}: {exc}"[:300]
    rec.started_at = time.time()
    try:
        await asyncio.wait_for(send_chat(client, url, body, rec), timeout=kill_at)
    except (TimeoutError, asyncio.TimeoutError):
        rec.killed = True
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:500]
    rec.ended_at = time.time()
    if not rec.killed and rec.status == 200 and not rec.error:
        await judge_record(oracle, rec, expected, oracle_error, off_script)
