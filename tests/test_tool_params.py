"""Tool parameter schemas real clients send are accepted (``engine.serving.tool_params``), and
become the same ``ToolSpec`` as the raw schema a server without validation (vLLM) reads.
Refusals of malformed schemas are in ``tests/test_protocol.py`` (``BAD_REQUESTS``)."""

from __future__ import annotations

import enum
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field, ValidationError

from engine.http.errors import validation_error_message
from engine.serving.protocol import ChatCompletionRequest, tool_specs
from engine.text import Schema, ToolSpec

MESSAGES = [{"role": "user", "content": "hi"}]


def tool(properties: dict, **keywords) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": properties, **keywords}}}


ACCEPTED = {
    "type_list": tool({"x": {"type": ["string", "null"]}}),
    "null_type": tool({"x": {"type": "null"}}),
    "anyof_without_type": tool({"x": {"anyOf": [{"type": "integer"}, {"type": "null"}],
                                      "default": None, "title": "X"}}),
    "oneof_allof": tool({"x": {"oneOf": [{"type": "boolean"}, {"type": "string"}]},
                         "y": {"allOf": [{"type": "object", "properties": {}}]}}),
    "enum_without_type": tool({"x": {"enum": [1, "a", None]}}),
    "untyped_any": tool({"x": {}, "y": {"description": "anything"}}),
    "nested": tool({"x": {"type": "array", "items": {"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer"}}}, "required": ["a"]}}}),
    "tuple_items": tool({"x": {"type": "array", "items": [{"type": "integer"}, {}]}}),
    "additional_properties": tool({"x": {"type": "object", "additionalProperties": {
        "type": "integer"}}, "y": {"type": "object", "additionalProperties": True}},
        additionalProperties=False),
    "defs_and_refs": tool({"x": {"$ref": "#/$defs/A"}, "y": {"items": {"$ref": "#/$defs/A"}}},
                          **{"$defs": {"A": {"type": "object", "properties": {
                              "next": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}}}}),
    "definitions_and_root_ref": tool({"x": {"$ref": "#/definitions/B"}, "y": {"$ref": "#"}},
                                     definitions={"B": {"enum": ["p", "q"]}}),
    "escaped_ref": tool({"x": {"$ref": "#/$defs/a~1b~0c"}}, **{"$defs": {"a/b~c": {}}}),
    "extra_keywords": tool({"x": {"type": "string", "format": "date", "maxLength": 9,
                                  "examples": ["2024-01-01"]}}, title="F", description="d"),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_schemas_clients_send_are_accepted_and_read_as_vllm_reads_them(name):
    raw = ACCEPTED[name]
    req = ChatCompletionRequest.model_validate({"messages": MESSAGES, "tools": [raw]})
    assert tool_specs(req) == [ToolSpec.from_openai(raw)]


class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Address(BaseModel):
    city: str
    zip: int | None = None


class Weather(BaseModel):
    """Weather for a city."""

    city: str
    days: int | None = None
    unit: Unit = Unit.celsius
    mode: Literal["fast", "slow"] = "fast"
    home: Address
    alt: Address | None = None
    stops: list[Address] = Field(default_factory=list, description="legs")
    tags: list[str] = []
    meta: dict[str, int] = {}
    anything: Any = None


@pytest.mark.parametrize("strict", [True, False])
def test_openai_sdk_pydantic_tools_are_accepted(strict):
    raw = openai.pydantic_function_tool(Weather, name="get_weather")
    if not strict:  # what plain pydantic emits, as agent frameworks send it
        raw = {"type": "function", "function": {"name": "get_weather",
                                                "parameters": Weather.model_json_schema()}}
    req = ChatCompletionRequest.model_validate({"messages": MESSAGES, "tools": [raw]})
    (spec,) = tool_specs(req)
    assert spec == ToolSpec.from_openai(raw)
    params = dict(spec.params)
    assert params["days"] == Schema(("null", "integer"))
    assert params["tags"] == Schema(("array",), items=Schema(("string",)))
    assert params["mode"] == Schema(("string",)) and params["meta"].types == ("object",)
    assert spec.signature().startswith("get_weather(city:str, days:int, unit:str, mode:str")


def test_an_unresolved_ref_is_refused_naming_where_it_is():
    raw = tool({"x": {"type": "array", "items": {"$ref": "#/$defs/Adress"}}},
               **{"$defs": {"Address": {"type": "object"}}})
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"messages": MESSAGES, "tools": [raw]})
    assert validation_error_message(info.value) == (
        "tools[0].function.parameters: properties.x.items.$ref: '#/$defs/Adress' does not "
        "resolve here (local references #/$defs/<name> or #/definitions/<name> only)")
