"""A seeded fuzzer of DSML model outputs and chunkings, for differential tests of tool-call parsers.

``fuzz_cases(seed, n)`` draws outputs over the categories in ``CATEGORIES`` (well-formed calls,
JSON values of every type, prose around blocks, truncation at any point, missing and wrong
closers, unknown tools, duplicate parameters, invalid JSON, the V4 opener, whitespace variants,
ASCII bars, empty and self-closing invokes, JSON bodies, bare invokes, stray markers);
``chunkings(text, seed)`` splits one output the ways a stream can deliver it (whole, one
character at a time, cuts inside the fullwidth markers, seeded random splits).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from engine.text import ToolSpec
from engine.text import tokenizer as T

TOOLS = [ToolSpec.from_openai({"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}),
    ToolSpec.from_openai({"type": "function", "function": {
        "name": "search", "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "filters": {"type": "object"}}}}}),
    ToolSpec.from_openai({"type": "function", "function": {"name": "noop"}})]
DSML = "｜DSML｜"
PROSE = ["Sure.", "Let me check.", "ok", "Here you go:", "weather < 5 and > 2", "a </ b",
         "Checking now.\n", "done", "", "  ", "x" * 40, "多语言 text", "tabs\tand\nlines"]
STRINGS = ["Paris", " padded ", "", "New York", 'quote " inside', "back\\slash", "line\nbreak",
           "<not a tag>", "多语言"]
VALUES = [3, -5, 0, 2.5, 1e3, True, False, None, [1, 2], {"a": 1}, ["x", {"y": None}], "s",
          [], {}]


@dataclass(frozen=True)
class FuzzCase:
    category: str
    text: str


def param(name: str, raw: str, string: str = "true", ws: str = " ") -> str:
    return f'<{DSML}parameter{ws}name="{name}"{ws}string="{string}">{raw}</{DSML}parameter>'


def invoke(name: str, body: str, ws: str = " ") -> str:
    return f'<{DSML}invoke{ws}name="{name}">{body}</{DSML}invoke>'


def block(*invokes: str, sep: str = "\n") -> str:
    return T.FC_OPEN + sep + sep.join(invokes) + sep + T.FC_CLOSE


def _args(rng: random.Random) -> str:
    out = [param("city", rng.choice(STRINGS))]
    if rng.random() < 0.6:
        out.append(param("days", json.dumps(rng.choice(VALUES)), "false"))
    return "\n" + "\n".join(out) + "\n"


def _good_invoke(rng: random.Random) -> str:
    name = rng.choice(["get_weather", "search", "noop"])
    if name == "noop":
        return invoke(name, rng.choice(["", "\n"]))
    if name == "search":
        body = "\n" + param("query", rng.choice(STRINGS)) + "\n"
        if rng.random() < 0.5:
            body += param("filters", json.dumps(rng.choice(VALUES)), "false") + "\n"
        return invoke(name, body)
    return invoke(name, _args(rng))


def _wrap(rng: random.Random, core: str) -> str:
    before = rng.choice(PROSE)
    sep = rng.choice(["\n\n", "\n", "", " "])
    after = rng.choice(["", "", "\n", "\nbye", " trailing text"])
    return (before + sep if before else "") + core + after


def _well_formed(rng):
    return _wrap(rng, block(_good_invoke(rng)))


def _multi(rng):
    return _wrap(rng, block(*[_good_invoke(rng) for _ in range(rng.randint(2, 4))]))


def _json_types(rng):
    raw = rng.choice([json.dumps(rng.choice(VALUES)), "  42 ", "\n3\n", "-0", "1e-3", "NaN",
                      "Infinity", "[1, 2,]", "{'a': 1}", "tru", "nul", '"unterminated'])
    return _wrap(rng, block(invoke("get_weather", param("days", raw, "false"))))


def _around(rng):
    n = rng.randint(1, 3)
    parts = [rng.choice(PROSE) + "\n" + block(_good_invoke(rng)) for _ in range(n)]
    return "\n".join(parts) + rng.choice(["", "\nafter", "\n" + rng.choice(PROSE)])


def _truncated(rng):
    text = _multi(rng) if rng.random() < 0.5 else _well_formed(rng)
    return text[:rng.randint(0, len(text))]


def _bad_closers(rng):
    good = _well_formed(rng)
    swaps = [(T.FC_CLOSE, ""), (f"</{DSML}invoke>", ""), (f"</{DSML}parameter>", ""),
             (f"</{DSML}invoke>", f"</{DSML}parameter>"), (T.FC_CLOSE, f"</{DSML}invoke>"),
             (f"</{DSML}parameter>", f"</{DSML}invoke>"), (T.FC_CLOSE, "</function_calls>")]
    old, new = rng.choice(swaps)
    return good.replace(old, new, 1) if old in good else good + new


def _unknown_tool(rng):
    name = rng.choice(["get_wether", "rm_rf", "Search", "x"])
    calls = [invoke(name, _args(rng))] + ([_good_invoke(rng)] if rng.random() < 0.5 else [])
    rng.shuffle(calls)
    return _wrap(rng, block(*calls))


def _duplicates(rng):
    body = param("city", "A") + param("city", rng.choice(STRINGS)) + param("days", "1", "false")
    return _wrap(rng, block(invoke("get_weather", body)))


def _invalid_json(rng):
    raw = rng.choice(["{", "[1,", "Paris", "hello world", "1 2", "{'x': 1}", "- 1", "0x10"])
    return _wrap(rng, block(invoke("search", param("filters", raw, "false"))))


def _v4_opener(rng):
    text = _well_formed(rng)
    return text.replace("function_calls>", "tool_calls>")


def _whitespace(rng):
    ws = rng.choice(["  ", "\n", "\t", " \n "])
    body = "\n" + param("city", rng.choice(STRINGS), ws=ws) + "\n"
    sep = rng.choice(["\n", "", "\n\n", " "])
    inner = invoke("get_weather", body, ws=rng.choice([" ", ws]))
    if rng.random() < 0.5:
        inner = inner.replace('">', '" >', 1)
    return _wrap(rng, block(inner, sep=sep))


def _ascii_bars(rng):
    return _well_formed(rng).replace("｜", "|")


def _empty(rng):
    core = rng.choice([T.FC_OPEN + T.FC_CLOSE, T.FC_OPEN + "\n" + T.FC_CLOSE,
                       block(invoke("noop", "")), block(f'<{DSML}invoke name="noop"/>'),
                       block(f'<{DSML}invoke name="noop" />', _good_invoke(rng)),
                       block(invoke("get_weather", "   ")),
                       block(invoke("get_weather", param("city", "")))])
    return _wrap(rng, core)


def _json_body(rng):
    body = rng.choice(['{"city": "Paris"}', '\n{"city": "Lyon", "days": 2}\n', '{"city": Paris}',
                       '[1, 2]', '{"a": NaN}', '{"a": 1} extra', '{}', '{"q": {"n": [1]}}'])
    return _wrap(rng, block(invoke(rng.choice(["get_weather", "search"]), body)))


def _bare(rng):
    calls = [_good_invoke(rng) for _ in range(rng.randint(1, 2))]
    text = rng.choice(PROSE) + rng.choice(["\n\n", "\n", ""]) + "\n".join(calls)
    if rng.random() < 0.4:
        text += "\n" + block(_good_invoke(rng))
    return text + rng.choice(["", "\npost"])


def _stray(rng):
    marker = rng.choice([T.FC_CLOSE, f"</{DSML}invoke>", f"</{DSML}parameter>",
                         f'<{DSML}parameter name="x" string="true">v', DSML, f"<{DSML}",
                         f"</{DSML}", "<｜", "</｜"])
    a, b = rng.choice(PROSE), rng.choice(PROSE)
    return a + marker + b


CATEGORIES: dict[str, Callable[[random.Random], str]] = {
    "well_formed": _well_formed, "multiple_invokes": _multi, "json_value_types": _json_types,
    "text_around_blocks": _around, "truncated": _truncated, "missing_wrong_closers": _bad_closers,
    "unknown_tool": _unknown_tool, "duplicate_params": _duplicates, "invalid_json": _invalid_json,
    "v4_opener": _v4_opener, "whitespace": _whitespace, "ascii_bars": _ascii_bars,
    "empty_invokes": _empty, "json_body": _json_body, "bare_invoke": _bare,
    "stray_markers": _stray,
}


def fuzz_cases(seed: int = 0, n: int = 2400) -> list[FuzzCase]:
    """``n`` outputs, the categories taking turns, each drawn from ``(seed, index)``."""
    return cases_from(CATEGORIES, f"{seed}", n)


def cases_from(categories: dict, prefix: str, n: int) -> list[FuzzCase]:
    """``n`` outputs, the categories (sorted by name) taking turns, output ``i`` drawn from
    ``random.Random(f"{prefix}:{i}")``."""
    names = sorted(categories)
    return [FuzzCase(names[i % len(names)],
                     categories[names[i % len(names)]](random.Random(f"{prefix}:{i}")))
            for i in range(n)]


def chunkings(text: str, seed: int = 0, random_splits: int = 3) -> dict[str, list[str]]:
    """Named splits of ``text``: ``whole``, ``chars``, ``marker_cuts`` (a cut inside every
    fullwidth bar) and ``random{k}`` (seeded cut points)."""
    out = {"whole": [text], "chars": list(text)}
    cuts = sorted({i + 1 for i, ch in enumerate(text) if ch == "｜"} | {0, len(text)})
    out["marker_cuts"] = [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    rng = random.Random(f"{seed}:{len(text)}:{text[:16]}")
    for k in range(random_splits if len(text) > 1 else 0):
        points = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        edges = [0, *points, len(text)]
        out[f"random{k}"] = [text[a:b] for a, b in zip(edges, edges[1:], strict=False)]
    return out
