"""Ground truth for the zoo bugs only request features reach, with no workbench code: one
engine server per patch (``python -m engine serve``), plain HTTP requests that use the feature,
and the symptom checked by hand; the unpatched server shows none of them."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.servers]
ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "What is the weather in Paris today?"}]
ANSWER = [{"role": "user", "content": "What is the weather in Paris today?"},
          {"role": "assistant", "content": None, "tool_calls": [{"id": "c0", "type": "function",
           "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
          {"role": "tool", "tool_call_id": "c0", "content": "{\"result\": \"sunny 21\"}"}]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, patches: str) -> None:
        port = _port()
        self.url = f"http://127.0.0.1:{port}"
        args = [sys.executable, "-m", "engine", "serve", "--port", str(port)]
        if patches:
            args += ["--set", f"patches={patches}"]
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env={**os.environ})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        self.close()
        raise RuntimeError("engine server did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)

    def chat(self, **body) -> dict:
        body = {"messages": ANSWER, "return_token_ids": True, **body}
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=60).json()

    def stream(self, **body) -> tuple[str, list[int], dict | None]:
        import json

        body = {"messages": ANSWER, "return_token_ids": True, "stream": True, **body}
        text, ids, usage = "", [], None
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body,
                          timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                for c in chunk["choices"]:
                    text += c["delta"].get("content") or ""
                    ids += c.get("token_ids") or []
        return text, ids, usage


@pytest.fixture(scope="module")
def servers():
    made: dict[str, Server] = {}

    def get(patches: str = "") -> Server:
        if patches not in made:
            made[patches] = Server(patches)
        return made[patches]
    yield get
    for s in made.values():
        s.close()


def _stop_streamed(srv: Server) -> tuple[str, str]:
    whole = srv.chat()["choices"][0]["message"]["content"]
    stop = whole[8:11]  # three characters: several tokens, so a match spans token boundaries
    streamed, _, _ = srv.stream(stop=[stop])
    return streamed, whole[:whole.index(stop)]


def _cut(srv: Server) -> tuple[str, str, list[int], str]:
    body = srv.chat(max_tokens=6)
    choice = body["choices"][0]
    streamed, _, _ = srv.stream(max_tokens=6)
    return choice["message"]["content"], streamed, choice["token_ids"], choice["finish_reason"]


def _usage(srv: Server) -> tuple[int, int]:
    _, ids, usage = srv.stream(stream_options={"include_usage": True})
    return usage["completion_tokens"], len(ids)


def _seeded(srv: Server) -> tuple[list, list]:
    bodies = [{"messages": MESSAGES, "temperature": 1.0, "seed": s, "max_tokens": 24,
               "return_token_ids": True} for s in range(8)]

    async def burst():
        async with httpx.AsyncClient(timeout=60) as c:
            rs = await asyncio.gather(*(c.post(srv.url + "/v1/chat/completions", json=b)
                                        for b in bodies))
        return [r.json()["choices"][0]["token_ids"] for r in rs]
    together = asyncio.run(burst())
    alone = [srv.chat(**b)["choices"][0]["token_ids"] for b in bodies]
    return together, alone


def test_the_unpatched_server_honours_every_feature(servers):
    srv = servers()
    streamed, want = _stop_streamed(srv)
    assert streamed == want
    unstreamed, streamed, ids, finish = _cut(srv)
    assert unstreamed == streamed and len(ids) == 6 and finish == "length"
    reported, got = _usage(srv)
    assert reported == got
    together, alone = _seeded(srv)
    assert together == alone


def test_stream_stop_prefix_released_streams_the_start_of_the_stop(servers):
    streamed, want = _stop_streamed(servers("stream_stop_prefix_released"))
    assert streamed != want and streamed.startswith(want)


def test_unstreamed_last_piece_dropped_cuts_a_truncated_answer(servers):
    unstreamed, streamed, ids, _ = _cut(servers("unstreamed_last_piece_dropped"))
    assert len(ids) == 6 and unstreamed != streamed and streamed.startswith(unstreamed)


def test_max_tokens_budget_one_short_ends_a_token_early(servers):
    _, _, ids, finish = _cut(servers("max_tokens_budget_one_short"))
    assert len(ids) == 5 and finish == "length"


def test_stream_usage_counts_first_token_twice(servers):
    reported, got = _usage(servers("stream_usage_counts_first_token_twice"))
    assert reported == got + 1


def test_sampling_generator_shared_in_batch_breaks_seeds_under_concurrency(servers):
    together, alone = _seeded(servers("sampling_generator_shared_in_batch"))
    assert sum(a != b for a, b in zip(together, alone, strict=True)) >= 2
