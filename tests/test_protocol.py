"""Tests for engine.protocol: request validation, error messages, SDK-compatible responses."""

from __future__ import annotations

import json

import pytest
from openai._models import construct_type
from openai.types.chat import ChatCompletion as SDKCompletion
from openai.types.chat import ChatCompletionChunk as SDKChunk
from pydantic import ValidationError

from engine.http.errors import ErrorResponse, validation_error_message
from engine.serving.protocol import ChatCompletionRequest, tool_specs
from engine.serving.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    Delta,
    DeltaFunction,
    DeltaToolCall,
    FunctionCallOut,
    ResponseMessage,
    ToolCallOut,
    Usage,
    delta_of,
)
from engine.serving.responses import Choice as RespChoice
from engine.text import Schema, ToolSpec, parse_tool_calls, render_prompt
from engine.text.dsml import ToolCallDelta
from engine.text.parsers import get_parser

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "description": "City name"},
                                  "days": {"type": "integer"}}}}}
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "weather in "}, {"type": "text",
                                                                           "text": "Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
]


def request(**overrides) -> dict:
    return {"messages": MESSAGES, "tools": [WEATHER_TOOL], **overrides}


def test_valid_request_parses_with_defaults():
    req = ChatCompletionRequest.model_validate(request(stop="\n", max_completion_tokens=64))
    assert req.model == "tiny-deepseek" and req.temperature == 0 and req.top_p == 1
    assert req.max_tokens == 64 and req.stop == ["\n"] and req.n == 1 and not req.stream
    assert req.messages[1].content == "weather in Paris?"
    assert tool_specs(req) == [ToolSpec("get_weather", (("city", Schema.of("str")),
                                                        ("days", Schema.of("int"))))]
    prompt = render_prompt(req.message_dicts(), tool_specs(req))
    assert "get_weather(city:str, days:int)" in prompt and "Paris?" in prompt


def test_full_request_round_trip():
    body = request(model="m", tool_choice={"type": "function", "function": {"name": "get_weather"}},
                   stream=True, stream_options={"include_usage": True}, max_tokens=4096,
                   temperature=2, top_p=0.5, seed=7, n=1, stop=["a", "b", "c", "d"])
    req = ChatCompletionRequest.model_validate(body)
    assert req.tool_choice.function.name == "get_weather" and req.stream_options.include_usage
    assert ChatCompletionRequest.model_validate_json(json.dumps(body)) == req
    for choice in ("auto", "none", "required"):
        req = ChatCompletionRequest.model_validate(request(tool_choice=choice))
        assert req.tool_choice == choice
    assert tool_specs(ChatCompletionRequest.model_validate({"messages": MESSAGES[:2]})) == []


PROPS = "tools[0].function.parameters.properties"


def _schema(properties: dict, **keywords) -> dict:
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": properties, **keywords}}}]}


BAD_REQUESTS = {
    "unknown_field": ({"logit_bias": {}}, "logit_bias"),
    "empty_messages": ({"messages": []}, "messages"),
    "bad_role": ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    "user_without_content": ({"messages": [{"role": "user"}]}, "messages[0]"),
    "tool_calls_on_user": ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
                           "messages[0]"),
    "bad_content_part": ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                         "messages[0].content"),
    "arguments_not_json": ({"messages": [{"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "{oops"}}]}]},
        "messages[0].tool_calls[0].function.arguments"),
    "tool_bad_name": ({"tools": [{"type": "function", "function": {"name": "get weather"}}]},
                      "tools[0].function.name"),
    "tool_bad_type": ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]},
                      "tools[0].type"),
    "schema_not_object": ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "array"}}}]}, "tools[0].function.parameters.type"),
    "schema_bad_prop_type": ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "tuple"}}}}}]},
        "tools[0].function.parameters.properties.x.type"),
    "schema_empty_type_list": (_schema({"x": {"type": []}}), f"{PROPS}.x.type"),
    "schema_repeated_type": (_schema({"x": {"type": ["string", "string"]}}), f"{PROPS}.x.type"),
    "schema_type_not_a_name": (_schema({"x": {"type": 3}}), f"{PROPS}.x.type"),
    "schema_prop_not_object": (_schema({"x": "string"}), f"{PROPS}.x"),
    "schema_nested_bad_type": (_schema({"x": {"type": "array", "items": {"type": "tuple"}}}),
                               f"{PROPS}.x.items.type"),
    "schema_deep_bad_type": (_schema({"x": {"properties": {"y": {"items": [{"type": "int"}]}}}}),
                             f"{PROPS}.x.properties.y.items[0].type"),
    "schema_anyof_empty": (_schema({"x": {"anyOf": []}}), f"{PROPS}.x.anyOf"),
    "schema_anyof_bad_member": (_schema({"x": {"anyOf": [{"type": "integer"}, {"type": "nil"}]}}),
                                f"{PROPS}.x.anyOf[1].type"),
    "schema_enum_empty": (_schema({"x": {"enum": []}}), f"{PROPS}.x.enum"),
    "schema_enum_not_list": (_schema({"x": {"enum": "a"}}), f"{PROPS}.x.enum"),
    "schema_additional_bad": (_schema({"x": {"additionalProperties": "yes"}}),
                              f"{PROPS}.x.additionalProperties"),
    "schema_nested_required_unknown": (_schema({"x": {"properties": {"a": {}}, "required": ["b"]}}),
                                       f"{PROPS}.x"),
    "schema_ref_unresolved": (_schema({"x": {"$ref": "#/$defs/Nope"}}, **{"$defs": {"A": {}}}),
                              "tools[0].function.parameters"),
    "schema_ref_remote": (_schema({"x": {"items": {"$ref": "https://x/s.json"}}}),
                          "tools[0].function.parameters"),
    "schema_defs_bad": (_schema({}, **{"$defs": {"A": {"type": "tuple"}}}),
                        "tools[0].function.parameters.$defs.A.type"),
    "schema_required_unknown": ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"properties": {}, "required": ["x"]}}}]},
        "tools[0].function.parameters"),
    "duplicate_tools": ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools"),
    "tool_choice_bad_string": ({"tool_choice": "always"}, "tool_choice"),
    "tool_choice_missing_name": ({"tool_choice": {"type": "function", "function": {}}},
                                 "tool_choice.function.name"),
    "tool_choice_undeclared": ({"tool_choice": {"type": "function", "function": {"name": "x"}}},
                               "tool_choice"),
    "required_without_tools": ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    "stream_not_bool": ({"stream": "yes"}, "stream"),
    "stream_options_without_stream": ({"stream_options": {"include_usage": True}},
                                      "stream_options"),
    "max_tokens_zero": ({"max_tokens": 0}, "max_tokens"),
    "max_tokens_too_big": ({"max_completion_tokens": 4097}, "max_completion_tokens"),
    "max_tokens_string": ({"max_tokens": "10"}, "max_tokens"),
    "max_tokens_both": ({"max_tokens": 5, "max_completion_tokens": 5}, "max_tokens"),
    "temperature_high": ({"temperature": 2.5}, "temperature"),
    "top_p_zero": ({"top_p": 0}, "top_p"),
    "seed_float": ({"seed": 1.5}, "seed"),
    "n_two": ({"n": 2}, "n"),
    "too_many_stops": ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    "empty_stop": ({"stop": [""]}, "stop[0]"),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_names_field(case):
    overrides, field = BAD_REQUESTS[case]
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(request(**overrides))
    message = validation_error_message(info.value)
    assert message.startswith(field + ": "), message
    assert "\n" not in message and "Value error" not in message
    body = ErrorResponse.from_validation_error(info.value).model_dump()
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"] == message and body["error"]["param"] == field


def test_n_error_is_explicit():
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(request(n=3))
    assert validation_error_message(info.value) == "n: only n=1 is supported"


def completion(finish_reason: str = "tool_calls") -> ChatCompletion:
    result = parse_tool_calls("Checking." + "<｜DSML｜function_calls>\n<｜DSML｜invoke name="
                              '"get_weather">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>')
    calls = [ToolCallOut(id=i, function=FunctionCallOut(name=c.name, arguments="{}"))
             for i, c in zip(result.call_ids(), result.calls, strict=True)]
    choice = RespChoice(message=ResponseMessage(content=result.content, tool_calls=calls),
                        finish_reason=finish_reason, dsml_leaked=result.leaked)
    return ChatCompletion(id="chatcmpl-1", created=1700000000, model="tiny-deepseek",
                          choices=[choice], usage=Usage(prompt_tokens=5, completion_tokens=3,
                                                        total_tokens=8))


def chunks() -> list[ChatCompletionChunk]:
    def chunk(delta: Delta, **kw) -> ChatCompletionChunk:
        return ChatCompletionChunk(id="chatcmpl-1", created=1700000000, model="tiny-deepseek",
                                   choices=[ChunkChoice(delta=delta, **kw)])
    head = DeltaToolCall(index=0, id="call_0_abc", type="function",
                         function=DeltaFunction(name="get_weather", arguments=""))
    return [
        chunk(Delta(role="assistant", content="")),
        chunk(Delta(content="Checking.")),
        chunk(Delta(tool_calls=[head])),
        chunk(Delta(tool_calls=[DeltaToolCall(index=0, function=DeltaFunction(arguments="{}"))])),
        chunk(Delta(), finish_reason="tool_calls", dsml_leaked=False),
        ChatCompletionChunk(id="chatcmpl-1", created=1700000000, model="tiny-deepseek",
                            choices=[], usage=Usage(prompt_tokens=5, completion_tokens=3,
                                                    total_tokens=8)),
    ]


@pytest.mark.parametrize("exclude_none", [False, True])
def test_openai_sdk_accepts_completion(exclude_none):
    ours = completion()
    sdk = SDKCompletion.model_validate(ours.model_dump(exclude_none=exclude_none))
    assert sdk.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert sdk.choices[0].message.content == "Checking." and sdk.usage.total_tokens == 8
    assert sdk.choices[0].model_extra == {"dsml_leaked": False}
    assert SDKCompletion.model_validate_json(ours.model_dump_json()).id == "chatcmpl-1"


@pytest.mark.parametrize("exclude_none", [False, True])
def test_openai_sdk_accepts_chunks(exclude_none):
    parsed = [SDKChunk.model_validate(c.model_dump(exclude_none=exclude_none)) for c in chunks()]
    assert parsed[2].choices[0].delta.tool_calls[0].id == "call_0_abc"
    assert parsed[4].choices[0].finish_reason == "tool_calls"
    assert parsed[-1].choices == [] and parsed[-1].usage.completion_tokens == 3


def test_abort_finish_reason_survives_sdk_parsing():
    """'abort' is outside the SDK's Literal, so strict validation rejects it, but the SDK's
    client-side parsing (``construct_type``, used for HTTP responses) keeps it as-is."""
    data = completion("abort").model_dump()
    with pytest.raises(ValidationError):
        SDKCompletion.model_validate(data)
    assert construct_type(type_=SDKCompletion, value=data).choices[0].finish_reason == "abort"
    chunk = chunks()[4].model_copy(update={"choices": [ChunkChoice(delta=Delta(),
                                                                   finish_reason="abort")]})
    parsed = construct_type(type_=SDKChunk, value=chunk.model_dump())
    assert parsed.choices[0].finish_reason == "abort"


SGLANG_ROUTER_CHAT = {  # what SGLang's router 0.3.2 sends for a plain OpenAI chat request
    "model": "unknown", "messages": [{"role": "user", "content": "hi"}],
    "max_completion_tokens": 8, "stream": False, "logprobs": False, "no_stop_trim": False,
    "ignore_eos": False, "continue_final_message": False, "skip_special_tokens": True,
    "separate_reasoning": True, "stream_reasoning": True, "return_hidden_states": False,
    "bootstrap_host": "127.0.0.1", "bootstrap_port": None, "bootstrap_room": 2**63 - 1}


def test_sglang_router_chat_body_is_accepted_and_its_fields_honoured():
    req = ChatCompletionRequest.model_validate(SGLANG_ROUTER_CHAT)
    assert req.max_tokens == 8 and req.unsupported() == [] and req.logprobs_n() is None
    req = ChatCompletionRequest.model_validate({**SGLANG_ROUTER_CHAT, "logprobs": True,
                                                "top_logprobs": 3, "return_hidden_states": True})
    assert req.logprobs_n() == 3 and req.unsupported() == ["return_hidden_states"]
    with pytest.raises(ValidationError, match="top_logprobs"):
        ChatCompletionRequest.model_validate({**SGLANG_ROUTER_CHAT, "top_logprobs": 2})
    with pytest.raises(ValidationError, match="return_token_idz"):
        ChatCompletionRequest.model_validate({**SGLANG_ROUTER_CHAT, "return_token_idz": True})


def test_generate_requests_are_validated():
    from engine.http import BadRequestError
    from engine.serving.native import parse_generate_request

    ok = parse_generate_request(json.dumps(
        {"text": "hi", "sampling_params": {"max_new_tokens": 4, "top_k": 5}, "stream": True,
         "model": None, "log_metrics": True, "return_bytes": False}).encode())
    assert ok.sampling_params.max_new_tokens == 4 and ok.unsupported() == ["sampling_params.top_k"]
    bad = [({"text": ["a", "b"]}, "batched"), ({"text": "a", "input_ids": [1]}, "exactly one"),
           ({}, "exactly one"), ({"input_ids": []}, "input_ids"),
           ({"text": "a", "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
           ({"text": "a", "sampling_params": {"bogus": 1}}, "bogus"), ({"text": "a", "x": 1}, "x")]
    for body, msg in bad:
        with pytest.raises(BadRequestError, match=msg):
            parse_generate_request(json.dumps(body).encode())


@pytest.mark.parametrize("raw, why", [
    (b'{"a": NaN}', "NaN"), (b'{"a": -Infinity}', "Infinity"), (b'{"a": "\\ud800"}', "surrogate"),
    (b'{"a": 1e999}', "non-finite number \\(1e999\\)"), (b'{"a": [-1E400]}', "non-finite"),
    (b'{"a":' + b"[" * 3000 + b"]" * 3000 + b"}", "not valid JSON"),
    (b'{"a":' + b"[" * 70 + b"]" * 70 + b"}", "deeper than 64"), (b"[1]", "JSON object")])
def test_hostile_bodies_are_refused_with_a_reason(raw, why):
    from engine.http import BadRequestError, json_object

    with pytest.raises(BadRequestError, match=why):
        json_object(raw)


def test_seed_is_bounded_to_the_generators_range():
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.8}
    assert ChatCompletionRequest.model_validate({**body, "seed": 2**64 - 1}).seed == 2**64 - 1
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises(ValidationError, match="seed"):
            ChatCompletionRequest.model_validate({**body, "seed": bad})


def test_common_openai_fields_are_accepted_and_unhonoured_ones_named():
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": None, "top_p": None,
            "user": "u-1", "parallel_tool_calls": False, "response_format": {"type": "text"}}
    req = ChatCompletionRequest.model_validate(body)
    assert (req.temperature, req.top_p, req.unsupported()) == (None, None, [])
    req = ChatCompletionRequest.model_validate(
        {**body, "presence_penalty": 0.5, "response_format": {"type": "json_object"}})
    assert req.unsupported() == ["presence_penalty", "response_format"]
    with pytest.raises(ValidationError, match="frequency_penalty"):
        ChatCompletionRequest.model_validate({**body, "frequency_penalty": 3})


def test_tool_choice_none_passes_markup_through_as_content():
    from engine.text.parsers import NO_CALLS

    text = 'ok <｜DSML｜function_calls>\n<｜DSML｜invoke name="x"></｜DSML｜invoke>'
    r = NO_CALLS.parse(text, None)
    assert (r.content, r.calls, r.leaked) == (text, (), True)
    s = NO_CALLS.streamer(None)
    assert [e.text for c in text for e in s.feed(c)] == list(text) and s.result() == r


NAMELESS = ('<｜DSML｜function_calls>\n<｜DSML｜invoke name=" ">\n<｜DSML｜parameter name="city" '
            'string="true">Oslo</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>')


@pytest.mark.parametrize("mode", ["sglang", "sglang-leaky"])
def test_sglang_modes_stream_a_nameless_call_with_neither_name_nor_id(mode):
    """SGLang's detectors stream ``name=" "`` as a call named ``""``; its serving_chat (0.5.15 and
    0.5.23) sends an id and a name only ``if call_item.name``."""
    parser = get_parser(mode)
    stream = parser.streamer([ToolSpec("get_weather", (("city", Schema.of("str")),))])
    deltas = [delta_of(e, parser.serving) for e in stream.feed(NAMELESS) + stream.finish()]
    calls = [c for d in deltas for c in d.tool_calls or []]
    assert calls and all(c.id is None and c.type is None for c in calls)
    assert all(c.function.name is None for c in calls)
    assert "".join(c.function.arguments for c in calls) == '{"city": "Oslo"}'
    chunk = ChatCompletionChunk(id="c", created=1, model="m", choices=[ChunkChoice(
        delta=deltas[-1])])
    assert SDKChunk.model_validate(chunk.model_dump()).choices[0].delta.tool_calls[0].id is None


def test_other_modes_keep_sending_an_empty_name_with_its_id():
    head = ToolCallDelta(0, "call_0_x", "", "")
    for mode in ("strict", "vllm"):
        call = delta_of(head, get_parser(mode).serving).tool_calls[0]
        assert (call.id, call.type, call.function.name) == ("call_0_x", "function", "")
    assert (get_parser("sglang").serving.empty_content, get_parser("vllm").serving.empty_content,
            get_parser("strict").serving.empty_content) == ("", None, None)
