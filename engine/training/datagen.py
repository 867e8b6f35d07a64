"""Seeded synthetic multi-turn agentic transcripts (tools line, asks, DSML calls, results).

Every transcript is a pure function of its seed and of the shipped tool pool
(``data/tools/agentic_tools.json``): ``make_transcript(seed)`` is replayable.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from engine.config import data_dir
from engine.text import Schema, ToolCall, ToolSpec, render_prompt

EVAL_SEED_BASE = 10_000_000  # transcripts at or above it are held out of training

TOOLS_FILE = data_dir() / "tools" / "agentic_tools.json"
INT_KIND = "n"  # integer 1..999; every other kind draws from the pool's ``values``


@dataclass(frozen=True)
class ToolTemplate:
    """One tool of the pool: typed params (``(name, kind)``) and ask templates over them."""

    name: str
    params: tuple[tuple[str, str], ...]
    asks: tuple[str, ...]

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, tuple((p, Schema.of("int" if k == INT_KIND else "str"))
                                         for p, k in self.params))


@dataclass(frozen=True)
class ToolPool:
    """The synthetic sessions' tools, value vocabularies, results and system prompt.

    Invariants: tool names are unique; every param kind is ``INT_KIND`` or a key of ``values``;
    every ask template names only its tool's params.
    """

    system_prompt: str
    results: tuple[str, ...]
    values: dict[str, tuple[str, ...]]
    tools: dict[str, ToolTemplate]

    def __post_init__(self) -> None:
        for t in self.tools.values():
            kinds = {k for _, k in t.params} - {INT_KIND} - set(self.values)
            if kinds:
                raise ValueError(f"tool {t.name!r}: unknown param kinds {sorted(kinds)}")
            names = {p: "" for p, _ in t.params}
            for ask in t.asks:
                try:
                    ask.format(**names)
                except (KeyError, IndexError) as exc:
                    raise ValueError(f"tool {t.name!r}: ask {ask!r} names {exc}") from None

    @classmethod
    def load(cls, path: str | Path = TOOLS_FILE) -> ToolPool:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        tools = [ToolTemplate(t["name"], tuple((p["name"], p["kind"]) for p in t["params"]),
                              tuple(t["asks"])) for t in raw["tools"]]
        if len({t.name for t in tools}) != len(tools):
            raise ValueError(f"{path}: duplicate tool names")
        return cls(raw["system_prompt"], tuple(raw["results"]),
                   {k: tuple(v) for k, v in raw["values"].items()}, {t.name: t for t in tools})


POOL = ToolPool.load()
SYSTEM_PROMPT = POOL.system_prompt


def tool_spec(name: str) -> ToolSpec:
    return POOL.tools[name].spec()


def sample_value(rng: random.Random, kind: str):
    return rng.randint(1, 999) if kind == INT_KIND else rng.choice(POOL.values[kind])


@dataclass(frozen=True)
class Round:
    """One agentic round: the user's ask, the expected call, the tool's result, the answer."""

    ask: str
    call: ToolCall
    result: str
    answer: str


@dataclass(frozen=True)
class Transcript:
    seed: int
    tools: tuple[ToolSpec, ...]
    rounds: tuple[Round, ...]

    def messages(self, upto_round: int | None = None, with_final_call: bool = True) -> list[dict]:
        """OpenAI messages; with ``upto_round`` set, stops right after that round's user ask."""
        msgs: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
        for i, r in enumerate(self.rounds):
            msgs.append({"role": "user", "content": r.ask})
            if upto_round is not None and i == upto_round:
                return msgs
            msgs.append({"role": "assistant", "content": "",
                         "tool_calls": [_openai_call(r.call, f"call_{len(msgs)}")]})
            msgs.append({"role": "tool", "content": r.result})
            msgs.append({"role": "assistant", "content": r.answer})
        return msgs

    def text(self) -> str:
        return render_prompt(self.messages(), list(self.tools), add_generation_prompt=False)


def _openai_call(call: ToolCall, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": call.name,
                                             "arguments": json.dumps(call.arguments)}}


def make_round(rng: random.Random, name: str) -> Round:
    tool = POOL.tools[name]
    args = {p: sample_value(rng, kind) for p, kind in tool.params}
    ask = rng.choice(tool.asks).format(**args)
    result = json.dumps({"result": rng.choice(POOL.results)})
    answer = f"{name} says: {result}"
    return Round(ask, ToolCall(name, args), result, answer)


def make_transcript(seed: int, min_tools: int = 3, max_tools: int = 6) -> Transcript:
    rng = random.Random(seed)
    names = rng.sample(sorted(POOL.tools), rng.randint(min_tools, max_tools))
    rounds = tuple(make_round(rng, rng.choice(names)) for _ in range(rng.randint(1, 3)))
    return Transcript(seed, tuple(tool_spec(n) for n in names), rounds)
