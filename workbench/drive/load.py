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
from dataclasses import asdict, dataclass, field, replace

import httpx

from engine.core.dump import prompt_hash
from engine.model import Scored
from engine.serving.responses import room_of_completion_id
from engine.text import Tokenizer
from engine.training.datagen import EVAL_SEED_BASE, Transcript, make_transcript
from workbench.drive.align import pad_to_boundary
from workbench.judge import ReferenceOracle, Verdict, judge

SESSION_SEED_BASE = EVAL_SEED_BASE + 500_000
UNKNOWN_LOGPROB = -9999.0  # OpenAI's value for a token whose logprob the server does not know
_TOKENIZER = Tokenizer()


def ids_of_token_texts(texts: list[str]) -> list[int] | None:
    """Token ids from the raw token texts of ``logprobs.content`` (our tokenizer maps each text to
    one id); None when a text is not one of its tokens."""
    ids = [_TOKENIZER.stoi.get(t) for t in texts]
    return None if any(i is None for i in ids) else ids


@dataclass
class RequestRecord:
    session: int
    turn: int
    kind: str  # "call" (expects a tool call) or "answer"
    room: int | None = None
    status: int | None = None
    killed: bool = False
    ttft_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None
    finish_reason: str | None = None
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    token_ids: list[int] | None = None
    token_texts: list[str] = field(default_factory=list)  # from logprobs, when ids are not sent
    logprobs: list[float | None] | None = None  # per generated token, None where unknown
    prompt_ids: list[int] | None = None
    messages: list[dict] = field(default_factory=list)  # the request's messages, for replays
    tools: list[dict] = field(default_factory=list)
    dsml_leaked: bool | None = None
    error: str = ""
    started_at: float | None = None  # wall clock (epoch s), to line requests up with deaths
    ended_at: float | None = None
    engine_down: str = ""  # the death or hang of the deployment this request ran into
    verdict: Verdict | None = None
    max_tokens: int | None = None  # what was asked (a replay sends the same)
    ref_token_ids: list[int] | None = None  # the oracle's greedy tokens, when it judged
    ref_logprobs: list[float] | None = None

    def row(self) -> dict:
        out = {k: v for k, v in asdict(self).items()
               if k not in ("verdict", "tool_calls", "token_ids", "token_texts", "prompt_ids",
                            "messages", "tools", "logprobs", "ref_token_ids", "ref_logprobs")}
        out["tool_calls"] = json.dumps(self.tool_calls)
        out["messages"] = json.dumps(self.messages)
        out["tools"] = json.dumps(self.tools)
        out["token_ids"] = json.dumps(self.token_ids)
        for key in ("logprobs", "ref_token_ids", "ref_logprobs"):  # for the explorer's views
            out[key] = json.dumps(getattr(self, key))
        out["prompt_tokens"] = len(self.prompt_ids) if self.prompt_ids is not None else None
        out["prompt_hash"] = prompt_hash(self.prompt_ids) if self.prompt_ids else None
        v = self.verdict
        out.update({f"v_{k}": getattr(v, k) if v else None for k in
                    ("leaked", "dropped", "well_formed", "tool_ok", "args_ok", "ref_match",
                     "first_diff", "oracle_error", "aborted")})
        out["v_logprob_drift"] = v.drifted if v else None  # the flag (issue 25's name)
        out["v_logprob_drift_max"] = v.logprob_drift if v else None  # its value
        out["flagged"] = bool(v and v.flagged)
        out["corrupt_leak"] = bool(v and v.leaked and v.ref_match is False)
        return out


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

    def __post_init__(self) -> None:
        if not 0.0 <= self.kill_fraction <= 1.0 or self.sessions < 1 or self.turns < 1:
            raise ValueError("need sessions >= 1, turns >= 1 and kill_fraction in [0, 1]")


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict, rec: RequestRecord) -> None:
    """Streams one completion into ``rec`` (a kill cancels this coroutine mid-stream)."""
    t0, last, gaps = time.monotonic(), None, []
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        rec.status = resp.status_code
        rec.room = int(resp.headers["x-bootstrap-room"]) if "x-bootstrap-room" in resp.headers \
            else None
        if resp.status_code != 200:
            rec.error = (await resp.aread()).decode(errors="replace")[:500]
            return
        calls: dict[int, dict] = {}
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if not _apply_chunk(json.loads(line[6:]), rec, calls):
                continue  # role-only / empty chunks carry no token
            now = time.monotonic()
            if last is not None:
                gaps.append(now - last)
            rec.ttft_s = rec.ttft_s if rec.ttft_s is not None else now - t0
            last = now
        rec.tool_calls = [calls[i] for i in sorted(calls)]
        if rec.token_ids is None and rec.token_texts:
            rec.token_ids = ids_of_token_texts(rec.token_texts)
    rec.e2e_s = time.monotonic() - t0
    rec.itl_s = sum(gaps) / len(gaps) if gaps else None


def _apply_chunk(chunk: dict, rec: RequestRecord, calls: dict[int, dict]) -> bool:
    """Folds one SSE chunk into ``rec``; True when it carried generated text or a call."""
    carried = False
    if isinstance(chunk.get("error"), dict):  # the stream broke upstream and says so
        rec.error = str(chunk["error"].get("message", "stream error"))[:500]
        rec.status = int(chunk["error"].get("code") or 502)
        return False
    if rec.room is None and isinstance(chunk.get("id"), str):
        rec.room = room_of_completion_id(chunk["id"])
    for choice in chunk.get("choices", []):
        entries = (choice.get("logprobs") or {}).get("content") or []
        rec.token_texts += [e["token"] for e in entries]
        if entries:
            rec.logprobs = (rec.logprobs or []) + [_known(e.get("logprob")) for e in entries]
        delta = choice.get("delta", {})
        carried |= bool(delta.get("content") or delta.get("tool_calls"))
        rec.content += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            call = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
            fn = tc.get("function", {})
            call["name"] += fn.get("name") or ""
            call["arguments"] += fn.get("arguments") or ""
        if choice.get("token_ids"):  # per chunk: the ids generated since the previous one
            rec.token_ids = (rec.token_ids or []) + list(choice["token_ids"])
        if choice.get("finish_reason"):
            rec.finish_reason = choice["finish_reason"]
            rec.dsml_leaked = choice.get("dsml_leaked")
    return carried


def _known(logprob) -> float | None:
    """A logprob entry's value; None for OpenAI's "unknown" (-9999) or a missing one."""
    return None if logprob is None or logprob <= UNKNOWN_LOGPROB else float(logprob)


def chat_body(cfg: LoadConfig, messages: list[dict], tools: list[dict], seed: int,
              stream: bool = True) -> dict:
    """The request body every probe sends: greedy, seeded, asking for token ids."""
    body = {"messages": messages, "tools": tools, "max_tokens": cfg.max_tokens,
            "temperature": 0.0, "stream": stream, "return_token_ids": True, "seed": seed}
    if cfg.logprobs:
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
        self.deadline, self.sink = deadline, sink
        self.tools = [t.to_openai() for t in self.tr.tools]

    async def run(self, client: httpx.AsyncClient) -> None:
        messages = self.tr.messages()[:1]
        for turn, rnd in enumerate(self.tr.rounds[: self.cfg.turns]):
            if time.monotonic() > self.deadline:
                return
            messages.append({"role": "user", "content": rnd.ask})
            rec = await self.request(client, self._aligned(messages), turn, "call", rnd.call)
            if rec.killed or rec.status != 200 or len(rec.tool_calls) != 1:
                return
            messages += call_turn(turn, rec.tool_calls[0], rnd.result)
            rec = await self.request(client, self._aligned(messages), turn, "answer", None)
            if rec.killed or rec.status != 200:
                return
            messages.append({"role": "assistant", "content": rec.content})

    def _aligned(self, messages: list[dict]) -> list[dict]:
        """``messages`` padded in place (the history keeps the padding, so later turns still hit
        the prefix cache) when the load aligns prompts."""
        if self.cfg.align_to:
            pad_to_boundary(messages, self.tools, self.cfg.align_to)
        return messages

    async def request(self, client, messages, turn, kind, expected) -> RequestRecord:
        if self.cfg.align_to:
            expected = None  # padding changes the turn: the transcript's call is no longer owed
        rec = RequestRecord(self.session, turn, kind, messages=json.loads(json.dumps(messages)),
                            tools=self.tools, max_tokens=self.cfg.max_tokens)
        body = chat_body(self.cfg, messages, self.tools, self.session)
        kill = self.rng.random() < self.cfg.kill_fraction
        kill_at = self.rng.uniform(0.0, self.cfg.kill_window_s) if kill else None
        oracle_error = ""
        if self.oracle is not None:
            try:
                rec.prompt_ids = self.oracle.prompt_ids(messages, self.tools)
            except Exception as exc:  # noqa: BLE001 - an oracle failure flags this request only
                oracle_error = f"{type(exc).__name__}: {exc}"[:300]
        rec.started_at = time.time()
        try:
            await asyncio.wait_for(stream_chat(client, self.url, body, rec), timeout=kill_at)
        except (TimeoutError, asyncio.TimeoutError):
            rec.killed = True
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"[:500]
        rec.ended_at = time.time()
        if not rec.killed and rec.status == 200 and not rec.error:
            ref = None
            if self.oracle is not None and not oracle_error:
                try:
                    ref = await asyncio.to_thread(self.oracle.scored, rec.prompt_ids,
                                                  self.cfg.max_tokens)
                except Exception as exc:  # noqa: BLE001 - flags this request, the run goes on
                    oracle_error = f"{type(exc).__name__}: {exc}"[:300]
            rec.verdict = self.verdict(rec, expected, ref, oracle_error)
            if ref is not None:
                rec.ref_token_ids, rec.ref_logprobs = list(ref.tokens), list(ref.logprobs)
            if self.cfg.align_to and rec.verdict.ref_match:
                # padding takes the model off its transcripts: markup the reference writes too
                # is the model's, not the server's
                rec.verdict = replace(rec.verdict, leaked=False)
        self.sink(rec)
        return rec

    def verdict(self, rec: RequestRecord, expected, ref: Scored | None,
                oracle_error: str) -> Verdict:
        """``rec``'s verdict against the reference ``ref`` (None: none), logprob drift included
        when the server sent logprobs; the tolerance is the oracle's (None: drift not flagged)."""
        tol = self.oracle.drift_tolerance if self.oracle is not None else None
        return judge(rec.content, rec.tool_calls, rec.dsml_leaked, expected, rec.token_ids,
                     list(ref.tokens) if ref else None, oracle_error, rec.finish_reason,
                     logprobs=rec.logprobs, ref_logprobs=list(ref.logprobs) if ref else None,
                     tolerance=tol)
