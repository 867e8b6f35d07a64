"""The client side of one chat completion over HTTP, streamed (SSE chunks folded into a
``RequestRecord``) or not (one JSON body), as the request's ``stream`` says."""

from __future__ import annotations

import json
import time

import httpx

from engine.serving.responses import room_of_completion_id
from engine.text import Tokenizer
from workbench.drive.record import RequestRecord

UNKNOWN_LOGPROB = -9999.0  # OpenAI's value for a token whose logprob the server does not know
_TOKENIZER = Tokenizer()


def ids_of_token_texts(texts: list[str]) -> list[int] | None:
    """Token ids from the raw token texts of ``logprobs.content`` (our tokenizer maps each text to
    one id); None when a text is not one of its tokens."""
    ids = [_TOKENIZER.stoi.get(t) for t in texts]
    return None if any(i is None for i in ids) else ids


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
    if chunk.get("usage"):
        rec.usage = dict(chunk["usage"])
    for choice in chunk.get("choices", []):
        _apply_logprobs(choice.get("logprobs"), rec)
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


def _apply_logprobs(logprobs: dict | None, rec: RequestRecord) -> None:
    entries = (logprobs or {}).get("content") or []
    rec.token_texts += [e["token"] for e in entries]
    if entries:
        rec.logprobs = (rec.logprobs or []) + [_known(e.get("logprob")) for e in entries]
    if any("top_logprobs" in e for e in entries):  # one list per token, aligned with texts
        rec.top_logprobs += [[(t["token"], float(t["logprob"])) for t in e.get("top_logprobs")
                              or []] for e in entries]


async def complete_chat(client: httpx.AsyncClient, url: str, body: dict,
                        rec: RequestRecord) -> None:
    """One unstreamed completion into ``rec`` (its whole body at once)."""
    t0 = time.monotonic()
    resp = await client.post(url + "/v1/chat/completions", json=body)
    rec.status = resp.status_code
    rec.room = int(resp.headers["x-bootstrap-room"]) if "x-bootstrap-room" in resp.headers \
        else None
    rec.e2e_s = rec.ttft_s = time.monotonic() - t0
    if resp.status_code != 200:
        rec.error = resp.text[:500]
        return
    data = resp.json()
    if rec.room is None and isinstance(data.get("id"), str):
        rec.room = room_of_completion_id(data["id"])
    rec.usage = dict(data["usage"]) if data.get("usage") else None
    choice = data["choices"][0]
    msg = choice.get("message") or {}
    rec.content = msg.get("content") or ""
    rec.tool_calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                      for c in msg.get("tool_calls") or []]
    rec.finish_reason, rec.dsml_leaked = choice.get("finish_reason"), choice.get("dsml_leaked")
    _apply_logprobs(choice.get("logprobs"), rec)
    rec.token_ids = list(choice["token_ids"]) if choice.get("token_ids") is not None else \
        ids_of_token_texts(rec.token_texts) if rec.token_texts else None


async def send_chat(client: httpx.AsyncClient, url: str, body: dict, rec: RequestRecord) -> None:
    """``body`` sent streamed or not, as its ``stream`` says, into ``rec``."""
    await (stream_chat if body.get("stream") else complete_chat)(client, url, body, rec)


def _known(logprob) -> float | None:
    """A logprob entry's value; None for OpenAI's "unknown" (-9999) or a missing one."""
    return None if logprob is None or logprob <= UNKNOWN_LOGPROB else float(logprob)
