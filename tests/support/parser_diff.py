"""Differential runs of a tool-call parser variant against a real parser (one-shot and streamed)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.text.dsml import ToolCallDelta
from support.dsml_fuzz import TOOLS, FuzzCase, chunkings

Outcome = tuple[str, tuple]  # (content, ((name, canonical arguments), ...))


def canonical(arguments: str) -> str:
    """A call's arguments string as compared: sorted-key JSON when it parses, else marked raw."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
    except ValueError:
        return "RAW:" + arguments


class StreamTally:
    """What a client assembles from a stream: content deltas joined, and per tool-call index the
    first name and the joined argument fragments."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.names: dict[int, str | None] = {}
        self.args: dict[int, str] = {}

    def call(self, index: int, name: str | None, arguments: str | None) -> None:
        if self.names.get(index) is None:
            self.names[index] = name
        self.args[index] = self.args.get(index, "") + (arguments or "")

    def outcome(self) -> Outcome:
        return "".join(self.content), tuple((self.names[i], canonical(self.args[i]))
                                            for i in sorted(self.names))


def sglang_reference(detector_cls, make_tool, serving: str = "0.5.23") -> tuple[Callable,
                                                                                Callable]:
    """``(one_shot(text), streamed(chunks))`` through the real detector, wrapped the way that
    SGLang version's ``FunctionCallParser`` and chat serving wrap it: no tools, no parsing; no
    calls, the whole text (one-shot); at the end of a stream ``finish()`` where it exists, then
    the serving layer's ``_check_for_unstreamed_tool_args`` of that version (``serving``)."""
    tools = [make_tool(t.name) for t in TOOLS]
    logging.getLogger("sglang").setLevel(logging.CRITICAL)
    leaky = serving == "0.5.15"

    def one_shot(text: str) -> Outcome:
        d = detector_cls()
        r = d.detect_and_parse(text, tools)
        if not r.calls and (leaky or not d.has_tool_call(text)):
            return text, ()
        return r.normal_text, tuple((c.name, canonical(c.parameters)) for c in r.calls)

    def streamed(chunks: list[str]) -> Outcome:
        d, tally = detector_cls(), StreamTally()
        for c in chunks:
            _add(tally, d.parse_streaming_increment(c, tools))
        if hasattr(d, "finish"):
            _add(tally, d.finish(tools))
        if (rest := _unstreamed(d, leaky)) is not None:
            tally.call(*rest)
        return tally.outcome()
    return one_shot, streamed


def _add(tally: StreamTally, r) -> None:
    tally.content.append(r.normal_text)
    for c in r.calls:
        tally.call(c.tool_index, c.name, c.parameters)


def _unstreamed(d, leaky: bool) -> tuple[int, None, str] | None:
    """SGLang chat serving's end-of-stream remainder of the last call's arguments."""
    prev, sent = getattr(d, "prev_tool_call_arr", None), getattr(d, "streamed_args_for_tool", None)
    if not prev or not sent or len(prev) - 1 >= len(sent):
        return None
    i = len(prev) - 1
    expected = prev[i].get("arguments", {})
    if leaky:  # 0.5.15 dumps the argument string again and removes the first occurrence
        want = json.dumps(expected, ensure_ascii=False)
        rest = want.replace(sent[i], "", 1) if sent[i] in want else ""
    else:
        want = expected if isinstance(expected, str) else json.dumps(expected,
                                                                     ensure_ascii=False)
        rest = want[len(sent[i]):] if want.startswith(sent[i]) else ""
    return (i, None, rest) if rest else None


def variant_runner(parse, streamer, tools: list | None = None) -> tuple[Callable, Callable]:
    """``(one_shot, streamed)`` through one of our variants with ``tools`` (``ToolSpec``s, default
    ``TOOLS``); streamed outcomes are assembled from the events a client receives."""
    tools = TOOLS if tools is None else tools

    def one_shot(text: str) -> Outcome:
        r = parse(text, tools)
        return r.content, tuple((c.name, canonical(json.dumps(c.arguments, ensure_ascii=False)))
                                for c in r.calls)

    def streamed(chunks: list[str]) -> Outcome:
        s, tally = streamer(tools), StreamTally()
        for ev in [e for c in chunks for e in s.feed(c)] + s.finish():
            if isinstance(ev, ToolCallDelta):
                tally.call(ev.index, ev.name, ev.arguments)
            else:
                tally.content.append(ev.text)
        return tally.outcome()
    return one_shot, streamed


def _safe(fn, arg) -> Outcome:
    try:
        return fn(arg)
    except Exception as exc:  # noqa: BLE001 - a crash is an outcome to compare
        return (f"<crash {type(exc).__name__}>", ())


@dataclass
class Agreement:
    """Per category: runs and identical runs, one-shot and streamed."""

    one_shot: Counter = field(default_factory=Counter)
    one_shot_same: Counter = field(default_factory=Counter)
    streamed: Counter = field(default_factory=Counter)
    streamed_same: Counter = field(default_factory=Counter)
    chunk_dependent: int = 0
    misses: list = field(default_factory=list)

    def rate(self, kind: str) -> float:
        total = sum(getattr(self, kind).values())
        return sum(getattr(self, kind + "_same").values()) / total if total else 1.0

    def table(self, name: str) -> str:
        rows = [f"{name}: one-shot {self.rate('one_shot'):.2%}, streamed "
                f"{self.rate('streamed'):.2%}; inputs whose real result depends on chunking: "
                f"{self.chunk_dependent}",
                f"  {'category':<22} {'one-shot':>14} {'streamed':>16}"]
        for cat in sorted(self.one_shot):
            rows.append(f"  {cat:<22} {self.one_shot_same[cat]:>6}/{self.one_shot[cat]:<7}"
                        f" {self.streamed_same[cat]:>7}/{self.streamed[cat]:<8}")
        return "\n".join(rows)


def compare(cases: list[FuzzCase], real: tuple, ours: tuple, seed: int = 0) -> Agreement:
    """Runs every case one-shot and under every chunking through both parsers."""
    a = Agreement()
    for case in cases:
        want, got = _safe(real[0], case.text), _safe(ours[0], case.text)
        a.one_shot[case.category] += 1
        a.one_shot_same[case.category] += want == got
        if want != got and len(a.misses) < 50:
            a.misses.append(("one_shot", case, want, got))
        seen = set()
        for label, chunks in chunkings(case.text, seed).items():
            want, got = _safe(real[1], chunks), _safe(ours[1], chunks)
            seen.add(repr(want))
            a.streamed[case.category] += 1
            a.streamed_same[case.category] += want == got
            if want != got and len(a.misses) < 50:
                a.misses.append((label, case, want, got))
        a.chunk_dependent += len(seen) > 1
    return a
