"""The OpenAI-compatible server as a real subprocess, driven over HTTP and by the openai SDK."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from support.metrics_check import metric_families

from engine.training.datagen import EVAL_SEED_BASE, make_transcript
from workbench.deploy.process import ServerProcess, python_module

pytestmark = [pytest.mark.slow, pytest.mark.servers]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess("engine", python_module("engine", "serve", "--port", "{port}"),
                        tmp_path_factory.mktemp("logs"))
    srv.start()
    try:
        srv.wait_healthy(timeout=120)
        yield srv
    finally:
        srv.stop()


def agentic_case(i: int = 3):
    tr = make_transcript(EVAL_SEED_BASE + i)
    return tr, tr.messages(upto_round=0), [t.to_openai() for t in tr.tools]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_sdk_non_streaming_gets_structured_tool_calls(server):
    tr, messages, tools = agentic_case()
    resp = client(server).chat.completions.create(model="tiny-deepseek", messages=messages,
                                                  tools=tools, max_tokens=160)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == tr.rounds[0].call.name
    assert json.loads(call.function.arguments).keys() == tr.rounds[0].call.arguments.keys()
    assert choice.model_extra["dsml_leaked"] is False
    assert resp.usage.prompt_tokens > 100


def test_sdk_streaming_assembles_the_same_call(server):
    _, messages, tools = agentic_case()
    sdk = client(server)
    full = sdk.chat.completions.create(model="tiny-deepseek", messages=messages, tools=tools,
                                       max_tokens=160)
    name, args, finish = "", "", None
    for chunk in sdk.chat.completions.create(model="tiny-deepseek", messages=messages,
                                             tools=tools, max_tokens=160, stream=True):
        for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    want = full.choices[0].message.tool_calls[0].function
    assert (name, args, finish) == (want.name, want.arguments, "tool_calls")


def test_multi_turn_conversation_with_tool_result(server):
    tr, messages, tools = agentic_case()
    sdk = client(server)
    first = sdk.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=160)
    call = first.choices[0].message.tool_calls[0]
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": tr.rounds[0].result}]
    second = sdk.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=80)
    assert tr.rounds[0].result in (second.choices[0].message.content or "")
    assert second.usage.prompt_tokens_details.cached_tokens > 0


BAD_BODIES = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"messages": []}).encode(), "messages"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "bogus": 1}).encode(), "bogus"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}).encode(),
     "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}).encode(),
     "max_tokens"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "bad name!"}}]}).encode(),
     "tools"),
    (json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode(), "prompt"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}).encode(),
     "temperature"),
]


@pytest.mark.parametrize("body,needle", BAD_BODIES)
def test_bad_input_is_a_clear_4xx_and_server_keeps_serving(server, body, needle):
    r = httpx.post(server.url + "/v1/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=30)
    assert 400 <= r.status_code < 500
    assert needle in r.json()["error"]["message"]
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


def test_models_and_metrics(server):
    assert httpx.get(server.url + "/v1/models").json()["data"][0]["id"] == "tiny-deepseek"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).is_success
    families = metric_families(server.url)
    assert families["pdwb_requests"].type == "counter"
    assert families["pdwb_free_pages"].type == "gauge"
    assert families["pdwb_generated_tokens"].type == "counter"
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                 "e2e_request_latency_seconds"):
        fam = families[f"pdwb_{name}"]
        assert fam.type == "histogram" and fam.documentation
        count = next(s.value for s in fam.samples if s.name.endswith("_count"))
        assert count >= 1, name


def test_debug_routes_are_loopback_only_and_token_protected():
    from fastapi.testclient import TestClient

    from engine.config import EngineConfig
    from engine.core import Engine
    from engine.serving import create_app

    app = create_app(Engine(EngineConfig()), debug_token="s3cret")
    with TestClient(app) as local, TestClient(app, client=("10.0.0.5", 5000)) as remote:
        assert remote.get("/debug/config", headers={"x-debug-token": "s3cret"}).status_code == 403
        assert local.get("/debug/config").status_code == 401
        assert local.get("/debug/queues", headers={"x-debug-token": "wrong"}).status_code == 401
        ok = {"x-debug-token": "s3cret"}
        assert local.get("/debug/config", headers=ok).json()["patches"] == []
        assert [p["enabled"] for p in local.get("/debug/patches", headers=ok).json()["patches"]]
        assert local.get("/debug/hicache", headers=ok).json() == {"jobs": []}
        missing = local.get("/debug/dump", headers=ok, params={"rid": "nope"})
        assert missing.status_code == 404 and "neither live nor captured" in missing.text
        assert local.get("/debug/dump", headers=ok).status_code == 404
        assert local.post("/debug/config", headers=ok).status_code == 405


def test_sglang_parser_variant_serves_calls_and_fails_closed(tmp_path):
    """``--set tool_parser=sglang``: the variant is reported, parses a good call like ours, and a
    forced-then-truncated call (markup with no closer) vanishes instead of leaking."""
    srv = ServerProcess("sglang-parser", python_module(
        "engine", "serve", "--port", "{port}", "--debug-token", "t", "--set",
        "tool_parser=sglang"), tmp_path)
    srv.start()
    try:
        srv.wait_healthy(timeout=120)
        cfg = httpx.get(srv.url + "/debug/config", headers={"x-debug-token": "t"}).json()
        assert cfg["tool_parser"] == "sglang"
        tr, messages, tools = agentic_case()
        ok = client(srv).chat.completions.create(model="m", messages=messages, tools=tools,
                                                 max_tokens=160)
        call = ok.choices[0].message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == (
            tr.rounds[0].call.name, tr.rounds[0].call.arguments)
        cut = client(srv).chat.completions.create(model="m", messages=messages, tools=tools,
                                                  max_tokens=12, tool_choice="required")
        choice = cut.choices[0]
        assert choice.message.tool_calls is None and not choice.model_extra["dsml_leaked"]
        assert "DSML" not in (choice.message.content or "")
    finally:
        srv.stop()


def test_a_poison_seed_fails_only_itself(server):
    """seed >= 2**64 with temperature > 0 used to overflow inside the engine step and abort every
    request in flight; it is now a 400, and the request beside it completes."""
    tr, messages, tools = agentic_case(5)
    with httpx.Client(timeout=120) as c, c.stream(
            "POST", server.url + "/v1/chat/completions",
            json={"messages": messages, "tools": tools, "max_tokens": 120,
                  "stream": True}) as live:
        bad = c.post(server.url + "/v1/chat/completions",
                     json={"messages": messages, "temperature": 0.8, "seed": 2**64})
        assert bad.status_code == 400 and "seed" in bad.json()["error"]["message"]
        chunks = [json.loads(line[6:]) for line in live.iter_lines()
                  if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_choice_none_never_returns_a_call(server):
    tr, messages, tools = agentic_case(7)
    r = client(server).chat.completions.create(model="m", messages=messages, tools=tools,
                                               max_tokens=60, tool_choice="none")
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")


def test_oversized_and_hostile_bodies_are_refused_and_the_server_keeps_serving(server):
    url = server.url + "/v1/chat/completions"
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (9 << 20) + b'"}]}'
    r = httpx.post(url, content=big, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "exceeds" in r.json()["error"]["message"]

    def chunked():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * (1 << 20)
        yield b'"}]}'
    r = httpx.post(url, content=chunked(), timeout=60)  # no Content-Length: counted as it comes
    assert r.status_code == 413
    for raw in (b'{"messages": [], "x": NaN}', b'{"a": "\\ud800"}', b"[" * 5000):
        assert httpx.post(url, content=raw, timeout=30).status_code == 400
    tr, messages, tools = agentic_case(8)
    ok = client(server).chat.completions.create(model="m", messages=messages, tools=tools,
                                                max_tokens=160)
    assert ok.choices[0].finish_reason == "tool_calls"


def test_stop_strings_end_the_output_before_the_first_match(server):
    body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "max_tokens": 40, "ignore_eos": True, "tool_choice": "none"}
    full = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    text = full["choices"][0]["message"]["content"]
    assert text and len(text) > 8, full
    stop = text[5:8]
    want = text[:text.find(stop)]
    r = httpx.post(server.url + "/v1/chat/completions", json={**body, "stop": [stop, "\x00"]},
                   timeout=60).json()["choices"][0]
    assert (r["message"]["content"] or "") == want and r["finish_reason"] == "stop"
    streamed, finish = "", None
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60,
                      json={**body, "stop": stop, "stream": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                streamed += choice["delta"].get("content") or ""
                finish = choice.get("finish_reason") or finish
    assert streamed == want and finish == "stop"


def test_a_large_body_is_tokenized_off_the_event_loop(server):
    """A 7.5 MB prompt (refused after tokenization) must not stall other routes meanwhile."""
    body = {"model": "m", "messages": [{"role": "user", "content": "word " * 1_500_000}],
            "max_tokens": 4}
    done: dict[str, httpx.Response] = {}
    big = threading.Thread(target=lambda: done.setdefault(
        "r", httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)))
    big.start()
    answered = 0
    with httpx.Client(base_url=server.url, timeout=60) as c:
        while big.is_alive():
            answered += c.get("/health").status_code == 200 and big.is_alive()
    big.join()
    assert done["r"].status_code == 400 and "tokens" in done["r"].json()["error"]["message"]
    assert answered >= 2  # on the loop, tokenizing stalled /health until the request ended
