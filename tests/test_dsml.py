"""Tests for engine.dsml: batch parsing, leak flagging, and streaming/batch equivalence."""

from __future__ import annotations

import json
import random

import pytest

from engine.text import tokenizer as T
from engine.text.chat import ToolCall, ToolSpec, render_tool_calls
from engine.text.dsml import (
    ContentDelta,
    ParseResult,
    StreamingDSMLDetector,
    ToolCallDelta,
    parse_tool_calls,
    tool_call_id,
)
from engine.text.tool_schema import Schema

WEATHER = ToolCall("get_weather", {"city": "Paris", "n": 3})
SEARCH = ToolCall("search", {"q": 'say "hi"\nnow', "opts": {"k": [1, 2.5, None]}, "ok": True})
TOOLS = [ToolSpec("get_weather", (("city", Schema.of("str")), ("n", Schema.of("int")))),
         ToolSpec("search", (("q", Schema.of("str")), ("opts", Schema.of("str")),
                             ("ok", Schema.of("bool"))))]


def block(*calls: ToolCall) -> str:
    return render_tool_calls(list(calls))


def param(key: str, value: str, is_str: bool = True) -> str:
    kind = T.STRING_TRUE if is_str else T.STRING_FALSE
    return T.PARAM_OPEN + key + kind + value + T.PARAM_CLOSE


def invoke(name: str, *params: str) -> str:
    return T.INVOKE_OPEN + name + T.TAG_END + "\n" + "\n".join(params) + "\n" + T.INVOKE_CLOSE


def fc(*invokes: str) -> str:
    return T.FC_OPEN + "\n" + "\n".join(invokes) + "\n" + T.FC_CLOSE


def stream(text: str, cuts: list[int], tools=None) -> tuple[ParseResult, tuple[str, ...]]:
    """Feeds ``text`` split at ``cuts``; rebuilds (content, calls, leaked) and ids from events."""
    det = StreamingDSMLDetector(tools)
    bounds = [0, *sorted(cuts), len(text)]
    events = [e for a, b in zip(bounds[:-1], bounds[1:], strict=True) for e in det.feed(text[a:b])]
    events += det.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls: dict[int, list[ToolCallDelta]] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            calls.setdefault(e.index, []).append(e)
    assert list(calls) == list(range(len(calls)))
    rebuilt, ids = [], []
    for deltas in calls.values():
        head, rest = deltas[0], deltas[1:]
        assert head.id and head.name and head.arguments == ""
        assert all(d.id is None and d.name is None for d in rest)
        args = "".join(d.arguments for d in rest)
        rebuilt.append(ToolCall(head.name, json.loads(args)))
        assert args == json.dumps(rebuilt[-1].arguments)
        ids.append(head.id)
    result = ParseResult(content, tuple(rebuilt), det.leaked)
    assert result == det.result()
    return result, tuple(ids)


def assert_stream_matches(text: str, rng: random.Random, tools=None, trials: int = 8) -> None:
    expected = parse_tool_calls(text, tools)
    splits = [[], list(range(1, len(text)))]
    splits += [rng.sample(range(1, len(text)), rng.randint(0, min(len(text) - 1, 12)))
               for _ in range(trials)] if len(text) > 1 else []
    for cuts in splits:
        got, ids = stream(text, cuts, tools)
        assert got == expected, (text, cuts)
        assert ids == expected.call_ids()


def test_single_call_with_content_before():
    r = parse_tool_calls("Let me check. " + block(WEATHER))
    assert r == ParseResult("Let me check. ", (WEATHER,), leaked=False)


def test_multiple_calls_and_blocks_with_content_between():
    text = block(WEATHER, SEARCH) + " then " + block(ToolCall("noop", {})) + " done"
    r = parse_tool_calls(text)
    assert r.calls == (WEATHER, SEARCH, ToolCall("noop", {}))
    assert r.content == " then  done" and not r.leaked


def test_json_and_raw_string_values():
    text = fc(invoke("f", param("s", ' a "b" \n'), param("i", "-7", False),
                     param("x", " 1.5e3 ", False), param("b", "false", False),
                     param("z", "null", False), param("o", '{"a": [1, "x"]}', False),
                     param("js", '"quoted"', False)))
    (call,) = parse_tool_calls(text).calls
    assert call.arguments == {"s": ' a "b" \n', "i": -7, "x": 1500.0, "b": False, "z": None,
                              "o": {"a": [1, "x"]}, "js": "quoted"}


def test_plain_text_without_markup():
    assert parse_tool_calls("just <b>text</b> with \"> and <｜") == ParseResult(
        'just <b>text</b> with "> and <｜', (), False)


MALFORMED = {
    "unclosed_at_end": fc(invoke("f", param("a", "1")))[:-5],
    "unclosed_invoke": T.FC_OPEN + T.INVOKE_OPEN + 'f">' + T.FC_CLOSE,
    "param_outside_invoke": T.FC_OPEN + param("a", "1") + T.FC_CLOSE,
    "value_swallows_close_tags": T.FC_OPEN + T.INVOKE_OPEN + 'f">' + T.PARAM_OPEN + 'a'
    + T.STRING_TRUE + "x" + T.INVOKE_CLOSE + T.FC_CLOSE,
    "nested_block": T.FC_OPEN + fc(invoke("f")),
    "invalid_json": fc(invoke("f", param("n", "{bad", False))),
    "nan_is_not_json": fc(invoke("f", param("n", "NaN", False))),
    "duplicate_key": fc(invoke("f", param("a", "1"), param("a", "2"))),
    "bad_tool_name": fc(invoke("9lives")),
    "bad_param_name": fc(invoke("f", param("a b", "1"))),
    "text_inside_block": T.FC_OPEN + "oops" + invoke("f") + T.FC_CLOSE,
    "empty_block": T.FC_OPEN + "\n" + T.FC_CLOSE,
    "missing_string_attr": T.FC_OPEN + invoke("f") .replace(T.TAG_END, '" x>') + T.FC_CLOSE,
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_block_leaks_verbatim(name):
    bad = MALFORMED[name]
    text = "Sure. " + bad + " tail"
    r = parse_tool_calls(text)
    assert r.leaked and r.calls == ()
    assert r.content == text


@pytest.mark.parametrize("stray", [T.FC_CLOSE, T.INVOKE_CLOSE, T.PARAM_OPEN + 'a',
                                   T.STRING_TRUE, "<｜DSML｜tool_calls>"])
def test_stray_markup_in_content_leaks(stray):
    r = parse_tool_calls("hello " + stray + " world")
    assert r == ParseResult("hello " + stray + " world", (), True)


def test_recovers_after_malformed_block():
    text = MALFORMED["invalid_json"] + "mid" + block(WEATHER)
    r = parse_tool_calls(text)
    assert r.calls == (WEATHER,) and r.leaked
    assert r.content == MALFORMED["invalid_json"] + "mid"


def test_unknown_tool_name_only_checked_when_tools_given():
    text = block(WEATHER, ToolCall("launch", {"x": 1}))
    assert parse_tool_calls(text).calls == (WEATHER, ToolCall("launch", {"x": 1}))
    r = parse_tool_calls(text, TOOLS)
    assert r.leaked and r.calls == () and r.content == text
    assert parse_tool_calls(block(WEATHER), TOOLS).calls == (WEATHER,)
    assert parse_tool_calls(block(WEATHER), []).leaked


def test_ids_are_deterministic_and_distinct():
    r = parse_tool_calls(block(WEATHER, WEATHER, SEARCH))
    ids = r.call_ids()
    assert ids == parse_tool_calls(block(WEATHER, WEATHER, SEARCH)).call_ids()
    assert len(set(ids)) == 3 and ids[0] == tool_call_id(0, WEATHER)
    assert ids[0].startswith("call_0_") and len(ids[0].split("_")[-1]) == 8


def test_stream_holds_possible_tag_prefix():
    det = StreamingDSMLDetector()
    assert det.feed("Hello <｜DS") == [ContentDelta("Hello ")]
    assert det.feed("x") == [ContentDelta("<｜DSx")]
    assert not det.leaked


def test_stream_emits_calls_at_block_close():
    det = StreamingDSMLDetector()
    text = block(WEATHER)
    assert det.feed(text[:-1]) == []
    events = det.feed(text[-1])
    assert events[0] == ToolCallDelta(0, tool_call_id(0, WEATHER), "get_weather", "")
    assert "".join(e.arguments for e in events) == json.dumps(WEATHER.arguments)
    assert det.finish() == [] and det.calls == (WEATHER,) and not det.leaked


def test_stream_passes_malformed_block_through_before_close():
    det = StreamingDSMLDetector()
    events = det.feed(T.FC_OPEN + "\noops, not a call")
    assert events == [ContentDelta(T.FC_OPEN + "\noops, not a call")] and det.leaked
    assert det.feed(" more </｜DSML｜func") == [ContentDelta(" more ")]
    assert det.feed("tion_calls>after") == [ContentDelta("</｜DSML｜function_calls>"),
                                              ContentDelta("after")]


def test_stream_unclosed_block_flushed_on_finish():
    det = StreamingDSMLDetector()
    text = "a" + block(WEATHER)[:-3]
    assert det.feed(text) == [ContentDelta("a")]
    assert det.finish() == [ContentDelta(text[1:])] and det.leaked
    with pytest.raises(RuntimeError):
        det.feed("x")


CORPUS = [
    "",
    "plain answer",
    "Let me check. " + block(WEATHER),
    block(WEATHER, SEARCH) + " then " + block(ToolCall("noop", {})) + " done",
    MALFORMED["invalid_json"] + "mid" + block(WEATHER),
    block(WEATHER, ToolCall("launch", {"x": 1})),
    "x" + T.FC_CLOSE + "y" + T.PARAM_CLOSE + block(SEARCH) + "｜DS" + "ML｜",
    *("pre " + bad + " post" for bad in MALFORMED.values()),
    *MALFORMED.values(),
]


@pytest.mark.parametrize("idx", range(len(CORPUS)))
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_stream_split_invariance(idx, tools):
    assert_stream_matches(CORPUS[idx], random.Random(idx), tools)


PIECES = [T.FC_OPEN, T.FC_CLOSE, T.INVOKE_OPEN, T.INVOKE_CLOSE, T.PARAM_OPEN, T.PARAM_CLOSE,
          T.STRING_TRUE, T.STRING_FALSE, T.TAG_END, "\n", " ", "get_weather", "city", "n",
          "3", "Paris", '"', "{", "}", "<", "｜", "x", "true", "[1]", "｜DSML｜"]


def test_stream_split_invariance_fuzz():
    """Random mixtures of DSML pieces, including well-formed blocks, under random splits."""
    rng = random.Random(1234)
    for _ in range(300):
        parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 14))]
        if rng.random() < 0.4:
            parts.insert(rng.randint(0, len(parts)), block(rng.choice([WEATHER, SEARCH])))
        assert_stream_matches("".join(parts), rng, rng.choice([None, TOOLS]), trials=4)
