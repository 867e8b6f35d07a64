"""SGLang's real Rust PD router (PyPI ``sglang-router``) in front of our prefill and decode servers:
chat (plain, streaming, structured tool calls), ``/generate``, aborts, the info routes it probes,
SGLang's request fields, and bootstrap errors that fail at once. The router runs with the
deployment secret as its ``--api-key`` (the only credential it passes to workers): clients send it,
and neither the router nor our servers serve a room to anyone else."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from engine.http import SECRET_ENV, SECRET_HEADER
from engine.serving.responses import room_of_completion_id
from engine.training import make_transcript
from workbench import inject_concurrency, launch_pd_pair
from workbench.drive.client import ids_of_token_texts
from workbench.judge import ReferenceOracle

pytestmark = [pytest.mark.slow, pytest.mark.servers, pytest.mark.nixl, pytest.mark.sglang]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with launch_pd_pair(router="sglang", engine={"debug_capture": 32},
                        log_dir=tmp_path_factory.mktemp("sglang-pair")) as p:
        yield p


def call_body(seed: int, **extra) -> dict:
    tr = make_transcript(900_100 + seed)
    return {"messages": tr.messages(upto_round=0), "tools": [t.to_openai() for t in tr.tools],
            "max_tokens": 120, **extra}


def test_chat_tool_call_through_the_real_router_matches_the_reference(pair):
    body = call_body(1, logprobs=True)
    r = httpx.post(pair.url + "/v1/chat/completions", json=body, timeout=120,
                   headers=pair.headers)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and not choice["dsml_leaked"]
    assert len(choice["message"]["tool_calls"]) == 1
    json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
    room = room_of_completion_id(out["id"])
    assert room is not None and 0 <= room < 2**63  # drawn by SGLang's router, not ours
    ids = ids_of_token_texts([e["token"] for e in choice["logprobs"]["content"]])
    oracle = ReferenceOracle(pair.spec.engine_config())
    prompt = oracle.prompt_ids(body["messages"], body["tools"])
    assert ids == oracle.expected(prompt, body["max_tokens"])  # the first token came over NIXL
    assert all(e["logprob"] <= 0.0 for e in choice["logprobs"]["content"])
    captured = pair.debug("/debug/requests", pair.decode[0])["captured"]
    assert f"room-{room}" in captured


def test_streaming_chat_and_openai_sdk_through_the_real_router(pair):
    from openai import OpenAI

    client = OpenAI(base_url=pair.url + "/v1", api_key=pair.client_token, max_retries=0)
    body = call_body(2)
    stream = client.chat.completions.create(model="tiny-deepseek", messages=body["messages"],
                                            tools=body["tools"], max_tokens=120, stream=True)
    names, args, finish = [], "", None
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or []:
            names += [tc.function.name] if tc.function.name else []
            args += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(names) == 1 and json.loads(args)
    plain = client.chat.completions.create(model="tiny-deepseek", messages=body["messages"],
                                           tools=body["tools"], max_tokens=120)
    assert plain.choices[0].message.tool_calls[0].function.name == names[0]
    assert json.loads(plain.choices[0].message.tool_calls[0].function.arguments) == json.loads(args)


def test_generate_through_the_real_router(pair):
    req = {"text": "<｜User｜>What is the weather in Paris?<｜Assistant｜>",
           "sampling_params": {"max_new_tokens": 12, "temperature": 0.0}}
    r = httpx.post(pair.url + "/generate", json=req, timeout=120, headers=pair.headers)
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    assert len(out["output_ids"]) == meta["completion_tokens"] > 0
    assert meta["finish_reason"]["type"] in ("stop", "length") and meta["id"].startswith("room-")
    chunks = []
    with httpx.stream("POST", pair.url + "/generate", json={**req, "stream": True},
                      timeout=120, headers=pair.headers) as s:
        assert s.status_code == 200
        chunks = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    last = json.loads(chunks[-2])
    assert last["text"] == out["text"] and last["output_ids"] == out["output_ids"]
    texts = [json.loads(c)["text"] for c in chunks[:-1]]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # cumulative


def test_aborts_through_the_real_router_leave_nothing_behind(pair):
    async def killed(i: int) -> None:
        async with httpx.AsyncClient(timeout=60, headers=pair.headers) as client:
            try:
                await asyncio.wait_for(client.post(pair.url + "/v1/chat/completions",
                                                   json=call_body(10 + i, stream=True)), 0.3)
            except asyncio.TimeoutError:
                pass

    async def storm() -> None:
        await asyncio.gather(*(killed(i) for i in range(6)))
    asyncio.run(storm())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        q = pair.debug("/debug/queues", pair.decode[0])
        if not (q["prealloc"] or q["transfer"] or q["running"] or q["quarantine"]):
            break
        time.sleep(0.5)
    assert not (q["prealloc"] or q["transfer"] or q["running"] or q["quarantine"]), q
    res = inject_concurrency(pair, sessions=3, turns=1, seed=5, max_tokens=120, progress=False)
    s = res.summary
    assert s.completed == 6 and s.flagged == 0 and s.ref_mismatch == 0  # 3 x (call + answer)
    assert res.requests["room"].null_count() == 0  # rooms read back from completion ids
    assert res.requests["v_ref_match"].null_count() == 0  # ids recovered from logprobs
    assert res.requests["v_logprob_drift_max"].null_count() == 0 and s.drifted == 0  # values too


def test_info_routes_fields_and_bootstrap_errors_on_our_servers(pair):
    p, d = pair.prefill[0], pair.decode[0]
    info = httpx.get(p.url + "/server_info").json()
    assert info["disaggregation_mode"] == "prefill"
    assert info["disaggregation_bootstrap_port"] == p.port
    assert httpx.get(d.url + "/get_server_info").json()["disaggregation_mode"] == "decode"
    assert httpx.get(d.url + "/model_info").json()["architectures"] == ["TinyDeepSeek"]
    load = httpx.get(d.url + "/get_load").json()
    assert isinstance(load, list) and {"num_reqs", "num_tokens"} <= load[0].keys()
    assert httpx.get(d.url + "/health_generate", timeout=30).status_code == 200
    secret = {SECRET_HEADER: p.env[SECRET_ENV]}
    t0 = time.monotonic()
    r = httpx.post(d.url + "/v1/chat/completions",
                   json=call_body(3, bootstrap_host="127.0.0.1", bootstrap_port=None,
                                  bootstrap_room=5), timeout=30, headers=secret)
    assert r.status_code == 400 and "bootstrap_port" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 5.0
    r = httpx.post(d.url + "/generate", json={"text": "hi", "bootstrap_host": "not a host",
                                              "bootstrap_port": p.port, "bootstrap_room": 6},
                   headers=secret)
    assert r.status_code == 400 and r.json()["error"]["param"] == "bootstrap_host"
    r = httpx.post(pair.url + "/v1/chat/completions",
                   json=call_body(4, continue_final_message=True, max_tokens=4), timeout=60,
                   headers=pair.headers)
    assert r.status_code == 200 and r.headers["x-unsupported-fields"] == "continue_final_message"
    r = httpx.post(pair.url + "/v1/chat/completions", json=call_body(4, no_such_field=1),
                   headers=pair.headers, timeout=60)
    assert r.status_code == 200  # SGLang's router drops fields it does not know ...
    r = httpx.post(p.url + "/v1/chat/completions", json=call_body(4, no_such_field=1),
                   headers=secret)
    assert r.status_code == 400 and "no_such_field" in r.text  # ... our servers refuse them


def test_no_room_is_served_without_the_deployment_secret(pair):
    """A squatter naming a room on a worker, or a client without the router's key: 401."""
    p, d = pair.prefill[0], pair.decode[0]
    squat = call_body(5, bootstrap_host="127.0.0.1", bootstrap_port=p.port, bootstrap_room=7)
    for url in (p.url, d.url):
        for path, body in (("/v1/chat/completions", squat), ("/generate", {"text": "hi",
                                                                           **squat})):
            r = httpx.post(url + path, json=body, timeout=30)
            assert r.status_code == 401 and "PD router" in r.text, (url, path, r.text)
    r = httpx.post(pair.url + "/v1/chat/completions", json=call_body(5), timeout=30)
    assert r.status_code == 401  # SGLang's router itself refuses a client without its key
    wrong = {"Authorization": "Bearer " + "x" * 48}
    assert httpx.post(p.url + "/generate", json={"text": "hi", **squat}, headers=wrong,
                      timeout=30).status_code == 401
