"""Async bridge between HTTP handlers and the engine thread: one ``Generation`` per request.

A ``Generation`` renders the chat prompt (forcing a DSML prefix for ``tool_choice`` required or
named), submits the sequence, and exposes its tokens as an async iterator. Leaving the iterator
early (client gone) aborts the sequence in the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engine.core import Engine
from engine.core.sequence import (
    Failure,
    FinishReason,
    SamplingParams,
    Sequence,
    TokenEvent,
    TokenLogprob,
)
from engine.serving.variants import ServingHooks
from engine.text import ToolSpec, render_prompt
from engine.text import tokenizer as T

_ids = itertools.count()


@dataclass(frozen=True)
class Bootstrap:
    """Where a PD request's KV comes from: the prefill's bootstrap address and the room."""

    host: str | None = None
    port: int | None = None
    room: int | None = None


@dataclass(frozen=True)
class OutputOptions:
    """How generated tokens become text (SGLang's ``skip_special_tokens``/``no_stop_trim``)."""

    skip_special_tokens: bool = True  # control tokens (BOS, EOS, roles, PAD) are not rendered
    no_stop_trim: bool = False  # keep the matched stop (EOS) in the text
    stop: tuple[str, ...] = ()  # OpenAI ``stop``: output ends before the first match


@dataclass(frozen=True)
class PromptPlan:
    """Prompt ids plus the forced assistant prefix (already in the prompt, part of the output)."""

    ids: list[int]
    forced_prefix: str
    tools: list[ToolSpec]
    parse_calls: bool = True  # False for tool_choice "none": the output is content, verbatim


def plan_prompt(tokenizer: T.Tokenizer, messages: list[dict], tools: list[ToolSpec],
                tool_choice) -> PromptPlan:
    visible = [] if tool_choice == "none" else tools
    prefix = ""
    if tool_choice == "required":
        prefix = T.FC_OPEN + "\n"
    elif isinstance(tool_choice, dict):
        prefix = T.FC_OPEN + "\n" + T.INVOKE_OPEN + tool_choice["function"]["name"] + T.TAG_END
    text = render_prompt(messages, visible) + prefix
    return PromptPlan(tokenizer.encode(text), prefix, visible, tool_choice != "none")


def token_text(tk: T.Tokenizer, token: int, output: OutputOptions = OutputOptions()) -> str:
    """A generated token's text as a client sees it (EOS and control tokens dropped unless
    ``output`` keeps them)."""
    if token == tk.eos_id and not output.no_stop_trim:
        return ""
    if token in tk.control_ids and output.skip_special_tokens:
        return ""
    return tk.token_text(token)


class Generation:
    def __init__(self, engine: Engine, plan: PromptPlan, params: SamplingParams,
                 rid: str | None = None, output: OutputOptions = OutputOptions(),
                 hooks: ServingHooks | None = None) -> None:
        self.engine = engine
        self.hooks = hooks or ServingHooks()
        self.plan = plan
        self.rid = rid or f"{int(time.time())}-{next(_ids)}"
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.tokens: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.failure: Failure | None = None  # set when it ended with FinishReason.ERROR
        self.num_cached = 0
        self.created = time.time()
        self.first_token_at: float | None = None
        self.want_token_ids = False
        self.output = output
        self.logprobs: list[TokenLogprob] = []
        self.seq = Sequence(self.rid, plan.ids, params, sink=self._sink)
        self._text = ""  # the generated text (forced prefix excluded)
        self._released = 0  # how much of it ``take_text`` gave out
        self.stop_cut: int | None = None  # where a stop string starts, once one matched

    def _sink(self, ev: TokenEvent) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)

    def start(self) -> Generation:
        self.engine.submit(self.seq)
        return self

    async def events(self) -> AsyncIterator[TokenEvent]:
        """Yields token events until the terminal one; aborts the request if not exhausted."""
        try:
            while self.finish_reason is None:
                ev = await self.queue.get()
                self.num_cached = ev.num_cached_tokens
                if ev.token is not None:
                    self.first_token_at = self.first_token_at or time.time()
                    self.tokens.append(ev.token)
                    if ev.logprob is not None:
                        self.logprobs.append(ev.logprob)
                    if self._append_text(ev.token):
                        self.engine.abort(self.rid)
                        self.finish_reason = FinishReason.STOP
                    yield ev
                if ev.finish_reason is not None:
                    self.finish_reason, self.failure = ev.finish_reason, ev.failure
        finally:
            if self.finish_reason is None:
                self.engine.abort(self.rid)
                self.finish_reason = FinishReason.ABORT

    def text_of(self, token: int) -> str:
        return token_text(self.engine.tokenizer, token, self.output)

    def _append_text(self, token: int) -> bool:
        """Adds ``token``'s text; True when that completed the first stop-string match."""
        piece = self.text_of(token)
        self._text += piece
        stops = self.output.stop
        if not stops or self.stop_cut is not None:
            return False
        start = max(0, len(self._text) - len(piece) - max(map(len, stops)) + 1)
        hits = [i for s in stops if (i := self._text.find(s, start)) >= 0]
        if hits:
            self.stop_cut = min(hits)
        return bool(hits)

    def take_text(self, final: bool = False) -> str:
        """Generated text not given out yet, minus a tail that may still become a stop string
        (all of it when ``final``); never anything from a matched stop string on."""
        end = len(self._text) if self.stop_cut is None else self.stop_cut
        if self.stop_cut is None and not final and self.output.stop:
            end -= self.hooks.held_back(self._text, self.output.stop)
        out = self._text[self._released:end]
        self._released = max(self._released, end)
        return out

    def text(self) -> str:
        """The completion so far as text (the forced prefix included, a stop string not)."""
        return self.plan.forced_prefix + self._text[:self.stop_cut]

    def unstreamed_text(self) -> str:
        """``text()`` as an unstreamed answer is built from it (``ServingHooks``)."""
        last = self.text_of(self.tokens[-1]) if self.tokens else ""
        return self.hooks.unstreamed_text(self.text(), last)

    @property
    def prompt_tokens(self) -> int:
        return len(self.plan.ids)
