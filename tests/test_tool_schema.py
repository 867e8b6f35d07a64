"""``ToolSpec`` keeps nested parameter types (``engine.text.tool_schema.Schema``), read the way
vLLM 0.32 reads a tool's schema, and the ``vllm`` parser variant coerces through them."""

from __future__ import annotations

import enum
import json

import openai
from pydantic import BaseModel, Field

from engine.text import Schema, ToolSpec, render_prompt
from engine.text.parsers import get_parser

S, I, N = Schema(("string",)), Schema(("integer",)), Schema(("null",))


class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Stop(BaseModel):
    city: str
    nights: int | None = None


class PlanTrip(BaseModel):
    """Plan a trip."""

    city: str
    days: int | None = None
    unit: Unit
    first: Stop
    alt: Stop | None = None
    stops: list[Stop] = Field(description="the legs")
    tags: list[str]


def spec() -> ToolSpec:
    return ToolSpec.from_openai(openai.pydantic_function_tool(PlanTrip, name="plan_trip"))


def test_pydantic_schemas_become_typed_nested_params():
    params = dict(spec().params)
    assert params["city"] == S and params["tags"] == Schema(("array",), items=S)
    assert params["days"] == Schema(("null", "integer"))  # anyOf [integer, null]
    # a bare $ref says nothing to vLLM: a string, its target's properties unseen
    assert params["unit"] == S and params["first"] == S
    assert params["alt"] == Schema(("null", "string"))
    assert params["stops"] == Schema(("array",), items=S)


def test_type_lists_enums_combinators_and_nesting():
    node = {"type": "object", "properties": {
        "a": {"type": ["integer", "null"]}, "b": {"enum": [1, "x", None, True, 2.5]},
        "c": {"oneOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "number"}}]},
        "d": {"type": "array", "items": [{"type": "integer"}]}, "e": {"title": "anything"},
        "f": {"allOf": [{"type": "object", "properties": {"x": {"type": "integer"}}}]}}}
    got = Schema.from_json(node)
    assert got.types == ("object",) and got.items is None
    assert dict(got.properties) == {
        "a": Schema(("null", "integer")), "b": Schema(("null", "integer", "number", "boolean",
                                                       "string")),
        "c": Schema(("boolean", "array")),  # a member's items are not the node's
        "d": Schema(("array",)),  # tuple validation: no single items schema
        "e": S, "f": Schema(("object",))}


def test_signature_and_openai_form_keep_flat_tools_unchanged():
    flat = ToolSpec("get_weather", (("city", Schema.of("str")), ("days", Schema.of("int"))))
    assert flat.to_openai()["function"]["parameters"]["properties"] == {
        "city": {"type": "string"}, "days": {"type": "integer"}}
    assert ToolSpec.from_openai(flat.to_openai()) == flat
    assert "plan_trip(city:str, days:int, unit:str, first:str, alt:str, stops:arr, tags:arr)" \
        in render_prompt([{"role": "user", "content": "hi"}], [spec()])
    nested = Schema(("object",), properties=(("n", Schema(("null", "integer"))),))
    assert Schema.from_json(nested.to_json()) == nested


def dsml(name: str, **values) -> str:
    """A call whose string values are sent raw (``string="true"``), others as JSON."""
    params = "".join(f'<｜DSML｜parameter name="{k}" string="{str(isinstance(v, str)).lower()}">'
                     f"{v if isinstance(v, str) else json.dumps(v)}</｜DSML｜parameter>"
                     for k, v in values.items())
    return (f'<｜DSML｜function_calls><｜DSML｜invoke name="{name}">{params}</｜DSML｜invoke>'
            "</｜DSML｜function_calls>")


TRIP = ToolSpec.from_openai({"type": "function", "function": {"name": "trip", "parameters": {
    "type": "object", "properties": {
        "who": {"type": "object", "properties": {"age": {"type": "integer"},
                                                 "vip": {"type": "boolean"},
                                                 "tags": {"type": "array",
                                                          "items": {"type": "string"}}}},
        "legs": {"type": "array", "items": {"type": "object", "properties": {
            "nights": {"type": ["integer", "null"]}}}},
        "days": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "ref": {"$ref": "#/$defs/X"}}, "$defs": {"X": {"type": "integer"}}}}})


def test_vllm_variant_coerces_nested_values_through_the_schema():
    """Values sent as JSON are coerced at every depth; a JSON-looking raw string for an object
    parameter is parsed but not coerced inside (vLLM's rule too)."""
    text = dsml("trip", who={"age": "42", "vip": "1", "tags": [7, "x"], "z": "3"},
                legs=[{"nights": "2"}, {"nights": "null"}, {"nights": "x"}], days="null",
                ref="5")
    ours = get_parser("vllm")
    for result in (ours.parse(text, [TRIP]).calls[0].arguments, _streamed(ours, text)):
        assert result == {"who": {"age": 42, "vip": True, "tags": ["7", "x"], "z": "3"},
                          "legs": [{"nights": 2}, {"nights": None}, {"nights": "x"}],
                          "days": None, "ref": "5"}
    raw = dsml("trip", who='{"age": "42"}')
    assert ours.parse(raw, [TRIP]).calls[0].arguments == {"who": {"age": "42"}}


def _streamed(parser, text: str) -> dict:
    stream = parser.streamer([TRIP])
    for ch in text:
        stream.feed(ch)
    stream.finish()
    return stream.calls[0].arguments


def test_vllm_variant_with_flat_schemas_is_unchanged():
    flat = ToolSpec("f", (("n", Schema.of("int")), ("s", Schema.of("str"))))
    got = get_parser("vllm").parse(dsml("f", n="3", s="4"), [flat]).calls[0].arguments
    assert got == {"n": 3, "s": "4"}
