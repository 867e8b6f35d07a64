"""Response oracle: judges every response of an agentic session.

Verdicts: ``leaked`` (DSML markup in content), ``dropped`` (a call was expected and neither a call
nor any markup came back: a fail-closed parser swallowed corrupted markup), ``well_formed`` (exactly
one structured call where one was expected), ``tool_ok`` / ``args_ok`` (against the transcript), and
``ref_match``: the completion's token ids equal a single-request greedy reference computed in-
process with the same storage dtypes (valid when the server runs batch-invariant greedy with the
torch kernels).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.core.engine import Engine
from engine.core.sequence import SamplingParams, Sequence
from engine.serving.generation import plan_prompt
from engine.text.chat import ToolCall, ToolSpec
from engine.text.dsml import LEAK_MARKERS


@dataclass(frozen=True)
class Verdict:
    leaked: bool
    well_formed: bool | None
    tool_ok: bool | None
    args_ok: bool | None
    ref_match: bool | None
    first_diff: int | None
    dropped: bool = False

    @property
    def flagged(self) -> bool:
        return (self.leaked or self.dropped or self.ref_match is False
                or self.well_formed is False)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class ReferenceOracle:
    """Greedy single-request references from an in-process engine; cached by prompt ids."""

    def __init__(self, cfg: EngineConfig) -> None:
        base = cfg.replace(patches=frozenset(), hicache=False, faults={}, debug_capture=0,
                           kernels="torch", batch_invariant=True, prefix_cache=False)
        self.engine = Engine(base)
        self._cache: dict[tuple[tuple[int, ...], int], list[int]] = {}
        self._lock = threading.Lock()

    def prompt_ids(self, messages: list[dict], tools: list[dict], tool_choice=None) -> list[int]:
        specs = [ToolSpec.from_openai(t) for t in tools]
        return plan_prompt(self.engine, messages, specs, tool_choice).ids

    def expected(self, prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        with self._lock:
            if key not in self._cache:
                seq = Sequence(f"ref-{len(self._cache)}", list(prompt),
                               SamplingParams(max_tokens=max_tokens))
                self.engine.submit(seq)
                self.engine.run_until_idle()
                self._cache[key] = list(seq.output)
            return self._cache[key]


def judge(content: str | None, calls: list[dict], leaked_flag: bool | None,
          expected: ToolCall | None, token_ids: list[int] | None,
          reference: list[int] | None) -> Verdict:
    text = content or ""
    leaked = bool(leaked_flag) or any(m in text for m in LEAK_MARKERS)
    well = tool_ok = args_ok = None
    dropped = expected is not None and not calls and not leaked
    if expected is not None:
        well = len(calls) == 1 and not leaked
        tool_ok = well and calls[0]["name"] == expected.name
        args_ok = tool_ok and _args(calls[0]["arguments"]) == expected.arguments
    ref_match = diff = None
    if token_ids is not None and reference is not None:
        diff = first_difference(token_ids, reference)
        ref_match = diff is None
    return Verdict(leaked, well, tool_ok, args_ok, ref_match, diff, dropped)


def _args(raw: str) -> dict | None:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return None
