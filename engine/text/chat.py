"""Chat template: OpenAI-style messages and tools rendered into the model's prompt text.

The same renderer produces training transcripts and serving prompts, so the model sees identical
framing in both. Tool calls are rendered as DSML blocks (DeepSeek V3.2 format).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from engine.text import tokenizer as T
from engine.text.tool_schema import Schema


@dataclass(frozen=True)
class ToolSpec:
    """A callable tool: its name and ordered ``(parameter, Schema)`` pairs (nested types kept,
    see ``engine.text.tool_schema``). Parameter names are unique (a JSON object's keys)."""

    name: str
    params: tuple[tuple[str, Schema], ...]

    @classmethod
    def from_openai(cls, tool: dict) -> ToolSpec:
        fn = tool["function"]
        props = (fn.get("parameters") or {}).get("properties") or {}
        return cls(name=fn["name"], params=tuple((k, Schema.from_json(v))
                                                 for k, v in props.items()))

    def to_openai(self) -> dict:
        props = {p: s.to_json() for p, s in self.params}
        return {"type": "function", "function": {
            "name": self.name, "parameters": {"type": "object", "properties": props,
                                              "required": [p for p, _ in self.params]}}}

    def signature(self) -> str:
        return f"{self.name}(" + ", ".join(f"{p}:{s.short}" for p, s in self.params) + ")"


@dataclass(frozen=True)
class ToolCall:
    """One parsed or rendered tool invocation; ``arguments`` values are JSON-typed."""

    name: str
    arguments: dict = field(default_factory=dict)


def render_value(value) -> tuple[str, bool]:
    """Returns (text, is_string) for a parameter value."""
    if isinstance(value, str):
        return value, True
    return json.dumps(value), False


def render_tool_calls(calls: list[ToolCall]) -> str:
    parts = [T.FC_OPEN, "\n"]
    for call in calls:
        parts += [T.INVOKE_OPEN, call.name, T.TAG_END, "\n"]
        for key, value in call.arguments.items():
            text, is_str = render_value(value)
            parts += [T.PARAM_OPEN, key, T.STRING_TRUE if is_str else T.STRING_FALSE,
                      text, T.PARAM_CLOSE, "\n"]
        parts += [T.INVOKE_CLOSE, "\n"]
    parts.append(T.FC_CLOSE)
    return "".join(parts)


def render_tools_line(tools: list[ToolSpec]) -> str:
    return "Tools: " + "; ".join(t.signature() for t in tools) + "\n"


def render_message(msg: dict) -> str:
    role = msg["role"]
    content = msg.get("content") or ""
    if role == "system":
        return content + "\n"
    if role == "user":
        return T.USER + content
    if role == "tool":
        return T.TOOL + content
    if role == "assistant":
        calls = [ToolCall(c["function"]["name"], _args(c["function"]["arguments"]))
                 for c in msg.get("tool_calls") or []]
        body = content + (render_tool_calls(calls) if calls else "")
        return T.ASSISTANT + body + T.EOS
    raise ValueError(f"unknown role {role!r}; valid: system, user, assistant, tool")


def _args(arguments) -> dict:
    return json.loads(arguments) if isinstance(arguments, str) else dict(arguments)


def render_prompt(messages: list[dict], tools: list[ToolSpec], add_generation_prompt=True) -> str:
    """BOS, tools line, each message; ends with the Assistant tag when generating."""
    text = T.BOS + render_tools_line(tools) + "".join(render_message(m) for m in messages)
    return text + (T.ASSISTANT if add_generation_prompt else "")
