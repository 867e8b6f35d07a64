"""Argument values the way vLLM's DeepSeek-V3.2 parser derives them from ``parameter`` tags:
JSON when it parses (NaN and infinities allowed), raw text otherwise, then coerced to the tool's
schema types; the call's name and arguments out of its body (see ``engine.text.vllm_dsml``)."""

from __future__ import annotations

import json
import math
import re

from engine.text import tokenizer as T
from engine.text.tool_schema import Schema
from engine.text.vllm_dsml_lexer import PARAM_START

_HEAD = rf'{re.escape(PARAM_START)}\s+name="([^"]+)"(?:\s+string="([^"]*)")?\s*>'
_PARAM = re.compile(rf"{_HEAD}(.*?)(?:{re.escape(T.PARAM_CLOSE)}|(?={re.escape(PARAM_START)}"
                    r"\s+name=))", re.DOTALL)
_OPEN_PARAM = re.compile(rf"{_HEAD}(.*)$", re.DOTALL)
NAME_KEY = re.compile(r'"name"\s*:\s*"([^"]*)"')
Delta = tuple[int, str | None, str | None]  # (index, name when the call starts, args fragment)


def loads_value(text: str, finite: bool = False) -> tuple[object, bool]:
    """``json.loads`` (NaN and infinities allowed unless ``finite``) and whether it worked."""
    try:
        value = json.loads(text)
        if finite:
            json.dumps(value, allow_nan=False)
    except ValueError:
        return None, False
    return value, True


def dsml_arguments(body: str, partial: bool) -> str:
    """The JSON arguments vLLM reads from a call's text (``partial``: a trailing open tag too)."""
    params: dict = {}
    end = 0
    for m in _PARAM.finditer(body):
        value, ok = (m.group(3), True) if m.group(2) == "true" else loads_value(m.group(3))
        params[m.group(1)] = value if ok else m.group(3)
        end = m.end()
    if partial and (m := _OPEN_PARAM.search(body, end)):
        value, ok = (m.group(3), True) if m.group(2) == "true" else loads_value(m.group(3))
        if ok:
            params[m.group(1)] = value
    return json.dumps(params, ensure_ascii=False)


def _from_text(text: str, types: tuple[str, ...]) -> object:
    """A raw value read as the first of ``types`` (in ``JSON_TYPES`` priority) it parses as,
    else the text when ``string`` is one of them, else finite JSON, else the text itself."""
    for kind in types:
        if kind == "string":
            return text
        value, ok = _read(text, kind)
        if ok:
            return value
    value, ok = loads_value(text, finite=True)
    return value if ok else text


def _read(text: str, kind: str) -> tuple[object, bool]:
    try:
        if kind == "integer":
            return int(text), True
        if kind == "number" and math.isfinite(val := float(text)):
            return (val if val != int(val) else int(val)), True
    except ValueError:
        return None, False
    if kind == "boolean" and (low := text.lower().strip()) in ("true", "1", "false", "0"):
        return low in ("true", "1"), True
    if kind in ("object", "array"):
        return loads_value(text, finite=True)
    return None, kind == "null" and text.lower() == "null"


def coerce(value: object, schema: Schema) -> tuple[object, bool]:
    """(value coerced to the schema, whether vLLM counts it as changed). Objects and arrays
    are coerced in place, through the node's own ``properties`` / ``items`` only."""
    if isinstance(value, str):
        new = _from_text(value, schema.types)
        return new, new is not value
    if isinstance(value, dict):
        return value, schema.properties is not None and coerce_object(value, schema.properties)
    if isinstance(value, list):
        return value, schema.items is not None and _coerce_items(value, schema.items)
    new = _from_text(json.dumps(value, ensure_ascii=False), schema.types)
    return new, type(new) is not type(value) or new != value


def coerce_object(args: dict, properties: tuple[tuple[str, Schema], ...]) -> bool:
    """Coerces the values of ``args`` whose key has a schema in ``properties``; whether any
    changed."""
    schemas = dict(properties)
    changed = False
    for key in [k for k in args if k in schemas]:
        args[key], moved = coerce(args[key], schemas[key])
        changed |= moved
    return changed


def _coerce_items(values: list, item: Schema) -> bool:
    changed = False
    for i, value in enumerate(values):
        values[i], moved = coerce(value, item)
        changed |= moved
    return changed


def name_and_args(body: str) -> tuple[str, str]:
    """A nameless call's name and arguments from a JSON body (``{"name": ..., ...}``)."""
    obj, ok = loads_value(body.strip())
    if not ok or not isinstance(obj, dict):
        return "", body.strip()
    key = next((k for k in ("arguments", "parameters") if k in obj), None)
    val = obj[key] if key else {k: v for k, v in obj.items() if k != "name"}
    return str(obj.get("name", "")), val if isinstance(val, str) else json.dumps(
        val, ensure_ascii=False)
