"""Differential runs of a tool-call parser variant against a real parser (one-shot and streamed)."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.dsml_fuzz import TOOLS, FuzzCase, chunkings

Outcome = tuple[str, tuple]  # (content, ((name, arguments), ...))


def _calls(items) -> tuple:
    return tuple((c.name, json.loads(c.parameters)) for c in items)


def sglang_reference(detector_cls, make_tool) -> tuple[Callable, Callable]:
    """``(one_shot(text), streamed(chunks))`` through the real detector, wrapped the way SGLang's
    ``FunctionCallParser`` wraps it (no tools: no parsing; no calls and no markup: whole text)."""
    tools = [make_tool(t.name) for t in TOOLS]
    logging.getLogger("sglang").setLevel(logging.CRITICAL)

    def one_shot(text: str) -> Outcome:
        d = detector_cls()
        has = d.has_tool_call(text)
        r = d.detect_and_parse(text, tools)
        return (r.normal_text, _calls(r.calls)) if r.calls or has else (text, ())

    def streamed(chunks: list[str]) -> Outcome:
        d, content, calls = detector_cls(), [], []
        for c in chunks:
            r = d.parse_streaming_increment(c, tools)
            content.append(r.normal_text)
            calls += r.calls
        r = d.finish(tools)
        content.append(r.normal_text)
        return "".join(content), _calls(calls)
    return one_shot, streamed


def variant_runner(parse, streamer) -> tuple[Callable, Callable]:
    def one_shot(text: str) -> Outcome:
        r = parse(text, TOOLS)
        return r.content, tuple((c.name, c.arguments) for c in r.calls)

    def streamed(chunks: list[str]) -> Outcome:
        s = streamer(TOOLS)
        for c in chunks:
            s.feed(c)
        s.finish()
        r = s.result()
        return r.content, tuple((c.name, c.arguments) for c in r.calls)
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
