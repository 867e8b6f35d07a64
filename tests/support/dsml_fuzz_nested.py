"""The DSML fuzz over tools with nested and pydantic-style schemas (``NESTED_TOOLS``): objects with
``properties``, arrays with ``items``, ``Optional`` fields (``anyOf`` with ``null``, ``type``
lists), ``enum``, ``$defs``/``$ref``, ``oneOf``/``allOf``, ``additionalProperties``.

``nested_cases(seed, n)`` draws calls whose argument values are shaped by each parameter's
schema (``$ref`` targets included) but typed at random -- numbers as strings, ``"null"``,
booleans as ``"1"``, unknown keys, non-finite numbers -- so a parser's schema coercion is
exercised at every depth, in one-shot and streamed parses (``support.dsml_fuzz.chunkings``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from engine.text import ToolSpec
from support.dsml_fuzz import DSML, PROSE, FuzzCase, block, cases_from, invoke, param

_STOP = {"type": "object", "title": "Stop", "additionalProperties": False,
         "required": ["city", "nights"],
         "properties": {"city": {"type": "string", "title": "City"},
                        "nights": {"type": "integer", "title": "Nights"},
                        "budget": {"anyOf": [{"type": "number"}, {"type": "null"}],
                                   "default": None}}}
_DEFS = {"Stop": _STOP, "Mode": {"enum": ["car", "train"], "title": "Mode", "type": "string"},
         "Unit": {"enum": ["celsius", "fahrenheit"], "type": "string"}}
_TRAVELER = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "vip": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "home": {"anyOf": [{"$ref": "#/$defs/Stop"}, {"type": "null"}]}}}
_TRIP = {
    "traveler": _TRAVELER,
    "stops": {"type": "array", "items": {"$ref": "#/$defs/Stop"}},
    "legs": {"type": "array", "items": _STOP},
    "mode": {"$ref": "#/$defs/Mode"},
    "first": {"$ref": "#/$defs/Stop"},
    "alt": {"anyOf": [{"$ref": "#/$defs/Stop"}, {"type": "null"}], "default": None},
    "days": {"type": ["integer", "null"]},
    "note": {"type": ["string", "null"]},
    "unit": {"enum": ["c", "f"], "type": "string"},
    "level": {"enum": [1, 2, 3]},
    "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "meta": {"type": "object", "additionalProperties": {"type": "integer"}},
    "flag": {"oneOf": [{"type": "boolean"}, {"type": "string"}]},
    "score": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "opts": {"allOf": [{"type": "object", "properties": {"fast": {"type": "boolean"}}}]},
    "anything": {"title": "Anything"},
}
NESTED_TOOLS = [
    {"type": "function", "function": {"name": "plan_trip", "strict": True, "parameters": {
        "type": "object", "title": "PlanTrip", "$defs": _DEFS, "properties": _TRIP,
        "required": ["traveler", "stops"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"},
            "days": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
            "unit": {"$ref": "#/$defs/Unit"}},
        "$defs": {"Unit": _DEFS["Unit"]}}}},
]
NESTED_SPECS = [ToolSpec.from_openai(t) for t in NESTED_TOOLS]
LEAVES = [3, -5, 0, 2.5, 1e3, True, False, None, "3", "-2", "2.5", "1e3", "true", "false", "1",
          "0", "null", "NULL", " 7 ", "Paris", "", "[1, 2]", '{"a": 1}', "NaN", "1e999", "inf",
          "x y", [], {}]
_KEYS = ["city", "nights", "budget", "name", "age", "vip", "tags", "home", "fast", "extra"]


def _resolve(node: dict) -> dict:
    ref = node.get("$ref", "")
    return _DEFS[ref.rsplit("/", 1)[-1]] if ref else node


def _value(rng: random.Random, node: dict, depth: int = 0) -> object:
    """A value shaped by ``node`` (refs and unions followed) about two times in three, typed at
    random at the leaves."""
    node = _resolve(node)
    members = node.get("anyOf") or node.get("oneOf") or node.get("allOf")
    if members:
        node = _resolve(rng.choice(members))
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(LEAVES)
    if "properties" in node or node.get("type") == "object":
        props = node.get("properties") or {k: {} for k in rng.sample(_KEYS, 3)}
        keys = rng.sample(sorted(props), rng.randint(0, len(props)))
        out = {k: _value(rng, props[k], depth + 1) for k in keys}
        return out | ({"extra": rng.choice(LEAVES)} if rng.random() < 0.2 else {})
    if "items" in node or node.get("type") == "array":
        return [_value(rng, node.get("items") or {}, depth + 1) for _ in range(rng.randint(0, 3))]
    if "enum" in node and rng.random() < 0.6:
        return rng.choice(node["enum"])
    return rng.choice(LEAVES)


def _param(rng: random.Random, name: str, node: dict) -> str:
    value = _value(rng, node)
    if isinstance(value, str) and rng.random() < 0.7:
        return param(name, value)
    text = json.dumps(value, ensure_ascii=False)
    if rng.random() < 0.5:  # the model quotes JSON as a string, or sends it raw
        return param(name, text)
    return param(name, text, "false")


def _params(rng: random.Random, props: dict, k: int) -> str:
    keys = rng.sample(sorted(props), min(k, len(props)))
    return "\n" + "\n".join(_param(rng, key, props[key]) for key in keys) + "\n"


def _call(rng: random.Random, props: dict, k: int, name: str = "plan_trip") -> str:
    return invoke(name, _params(rng, props, k))


def _wrap(rng: random.Random, core: str) -> str:
    before = rng.choice(PROSE)
    return (before + "\n" if before else "") + core + rng.choice(["", "\n", "\ndone"])


def _subset(*names: str) -> dict:
    return {n: _TRIP[n] for n in names}


def _objects(rng):
    return _wrap(rng, block(_call(rng, _subset("traveler", "first", "alt", "opts", "meta"), 3)))


def _arrays(rng):
    return _wrap(rng, block(_call(rng, _subset("stops", "legs", "matrix", "traveler"), 2)))


def _optional(rng):
    return _wrap(rng, block(_call(rng, _subset("days", "note", "alt", "score", "flag"), 3)))


def _enums_refs(rng):
    return _wrap(rng, block(_call(rng, _subset("mode", "unit", "level", "first", "anything"), 3)))


def _mixed(rng):
    calls = [_call(rng, _TRIP, rng.randint(1, 6)) for _ in range(rng.randint(1, 2))]
    return _wrap(rng, block(*calls))


def _weather(rng):
    props = NESTED_TOOLS[1]["function"]["parameters"]["properties"]
    return _wrap(rng, block(_call(rng, props, rng.randint(1, 3), "get_weather")))


def _truncated(rng):
    text = _mixed(rng)
    return text[:rng.randint(len(text) // 3, len(text))]


def _wrapper(rng):
    inner = json.dumps(_value(rng, {"properties": _subset("days", "traveler", "note")}))
    body = param(rng.choice(["arguments", "input"]), inner, rng.choice(["true", "false"]))
    return _wrap(rng, block(invoke(rng.choice(["plan_trip", "get_weather"]), body)))


def _unclosed(rng):
    text = _wrap(rng, block(_call(rng, _subset("note", "mode", "first", "days"), 2)))
    return text.replace(f"</{DSML}parameter>", "", 1)


def _duplicates(rng):
    """A parameter given twice: the streamed prefix of the first value can disagree with the
    final arguments, so the streamed result depends on the schema's string-only keys."""
    props = _subset("note", "mode", "days", "traveler", "unit")
    key = rng.choice(sorted(props))
    body = _param(rng, key, props[key]) + _params(rng, props, 2) + _param(rng, key, props[key])
    return _wrap(rng, block(invoke("plan_trip", body)))


NESTED_CATEGORIES: dict[str, Callable[[random.Random], str]] = {
    "nested_objects": _objects, "nested_arrays": _arrays, "optional_anyof": _optional,
    "enums_and_refs": _enums_refs, "nested_mixed": _mixed, "flat_optional": _weather,
    "nested_truncated": _truncated, "nested_wrapper": _wrapper, "nested_unclosed": _unclosed,
    "nested_duplicates": _duplicates,
}


def nested_cases(seed: int = 0, n: int = 1800) -> list[FuzzCase]:
    """``n`` outputs, the nested categories taking turns, each drawn from ``(seed, index)``."""
    return cases_from(NESTED_CATEGORIES, f"n{seed}", n)
