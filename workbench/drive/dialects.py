"""Request dialects: how real clients call the OpenAI chat API, as seeded distributions.

A ``Dialect`` draws one ``RequestParams`` per request from the session's own dialect RNG (so a
load's kills and sessions are the same whichever dialect it speaks, and every draw replays from
the load's seed). ``greedy`` is what the workbench always sent: greedy, streamed, to EOS.
``agentic`` samples with seeds and ``top_p``, sends ``stop`` sequences taken from the turn's
likely answer (so they fire), sets ``max_tokens`` that sometimes cuts the answer, mixes streamed
and unstreamed calls and ``tool_choice`` modes. ``clients`` samples hot (temperature 1.5 or 2.0,
``top_p`` 0.99 or none) and adds ``top_logprobs``, ``stream_options.include_usage``,
``parallel_tool_calls``, ``response_format`` and ``ignore_eos``. ``Feature`` names what a
request exercises; the coverage table counts them.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from engine.registry import Registry


class Feature(str, Enum):
    """An API feature a request exercises beyond greedy streamed decoding to EOS."""

    SAMPLED = "sampled"  # temperature > 0 with a seed
    TOP_P = "top_p"
    STOP = "stop"
    UNSTREAMED = "unstreamed"
    TRUNCATED = "truncated"  # max_tokens below the answer's length
    TOOL_REQUIRED = "tool_choice_required"
    TOOL_NAMED = "tool_choice_named"
    TOP_LOGPROBS = "top_logprobs"
    USAGE = "include_usage"
    PARALLEL_TOOLS = "parallel_tool_calls"
    RESPONSE_FORMAT = "response_format"
    IGNORE_EOS = "ignore_eos"


@dataclass(frozen=True)
class RequestParams:
    """The API features of one request beyond its messages and tools. ``max_tokens`` None: the
    load's. Invariant: ``stop`` holds 0-4 non-empty strings; ``seed`` is set when sampled."""

    temperature: float = 0.0
    top_p: float | None = None
    seed: int | None = None
    stream: bool = True
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    tool_choice: str | None = None  # "required", or a tool's name (a named function)
    top_logprobs: int | None = None
    include_usage: bool = False
    parallel_tool_calls: bool | None = None
    response_format: bool = False  # {"type": "text"}
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if len(self.stop) > 4 or not all(self.stop):
            raise ValueError(f"stop wants 0-4 non-empty strings, not {self.stop!r}")
        if self.temperature > 0 and self.seed is None:
            raise ValueError("a sampled request needs a seed (it must replay)")

    @property
    def sampled(self) -> bool:
        return self.temperature > 0.0

    def features(self) -> tuple[Feature, ...]:
        """The features this request exercises (``TRUNCATED``: its own ``max_tokens``, which
        dialects draw below the answer's length)."""
        on = {Feature.SAMPLED: self.sampled, Feature.TOP_P: self.top_p not in (None, 1.0),
              Feature.STOP: bool(self.stop), Feature.UNSTREAMED: not self.stream,
              Feature.TRUNCATED: self.max_tokens is not None,
              Feature.TOOL_REQUIRED: self.tool_choice == "required",
              Feature.TOOL_NAMED: self.tool_choice not in (None, "required"),
              Feature.TOP_LOGPROBS: bool(self.top_logprobs), Feature.USAGE: self.include_usage,
              Feature.PARALLEL_TOOLS: self.parallel_tool_calls is not None,
              Feature.RESPONSE_FORMAT: self.response_format, Feature.IGNORE_EOS: self.ignore_eos}
        return tuple(f for f, yes in on.items() if yes)

    def body(self) -> dict:
        """The request-body fields these params set (``max_tokens`` and ``seed`` excepted,
        which the load always sends)."""
        out: dict = {"temperature": self.temperature, "stream": self.stream}
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.stop:
            out["stop"] = list(self.stop)
        if self.tool_choice == "required":
            out["tool_choice"] = "required"
        elif self.tool_choice is not None:
            out["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice}}
        if self.top_logprobs:
            out["top_logprobs"] = self.top_logprobs
        if self.include_usage and self.stream:
            out["stream_options"] = {"include_usage": True}
        if self.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = self.parallel_tool_calls
        if self.response_format:
            out["response_format"] = {"type": "text"}
        if self.ignore_eos:
            out["ignore_eos"] = True
        return out


@dataclass(frozen=True)
class Turn:
    """What a dialect may draw from: the turn's kind (``call`` or ``answer``), the tool the
    transcript expects (a call turn), the answer it expects (an answer turn) and the load's
    ``max_tokens``."""

    kind: str
    tool: str | None
    answer: str
    max_tokens: int


@dataclass(frozen=True)
class Dialect:
    name: str
    description: str
    draw: Callable[[random.Random, Turn], RequestParams]


DIALECTS: Registry[Dialect] = Registry("dialect")
AGENTIC_TEMPERATURES = (0.6, 0.8, 1.0)  # what coding agents send
HOT_TEMPERATURES = (1.5, 2.0)  # clients sampling hot: where a confident model's seeded
# draws differ from greedy at all (ours: at 1.0 a session's tokens are one-hot to ~1e-6)


def _greedy(rng: random.Random, turn: Turn) -> RequestParams:
    return RequestParams()


def stop_from(answer: str, rng: random.Random) -> tuple[str, ...]:
    """A stop string the answer is likely to contain: one of its words past the first, with
    the space before it (so the answer up to it is non-empty). Empty when it has none."""
    words = answer.split(" ")
    if len(words) < 3:
        return ()
    return (" " + rng.choice([w for w in words[1:] if w.strip()] or words[1:]),)


def _agentic(rng: random.Random, turn: Turn) -> RequestParams:
    sampled = rng.random() < 0.5
    call = turn.kind == "call"
    stop = stop_from(turn.answer, rng) if not call and rng.random() < 0.4 else ()
    cut = not call and not stop and rng.random() < 0.4
    choice = None
    if call and turn.tool and rng.random() < 0.3:
        choice = rng.choice(["required", turn.tool])
    return RequestParams(
        temperature=rng.choice(AGENTIC_TEMPERATURES) if sampled else 0.0,
        top_p=rng.choice([None, 0.95]) if sampled else None,
        seed=rng.randrange(2**31) if sampled else None, stream=rng.random() < 0.6, stop=stop,
        max_tokens=rng.randrange(4, 17) if cut else None, tool_choice=choice)


def _clients(rng: random.Random, turn: Turn) -> RequestParams:
    base = _agentic(rng, turn)
    usage = rng.random() < 0.5
    hot = rng.choice(HOT_TEMPERATURES) if base.sampled else 0.0
    return RequestParams(
        **{**base.__dict__, "temperature": hot, "top_p": rng.choice([None, 0.99]) if hot else None,
           "top_logprobs": rng.choice([None, 1, 3]),
           "include_usage": usage and base.stream,
           "parallel_tool_calls": rng.choice([None, False]) if turn.kind == "call" else None,
           "response_format": rng.random() < 0.2,
           "ignore_eos": base.max_tokens is not None and rng.random() < 0.5})


DIALECTS.register("greedy", Dialect("greedy", "greedy, streamed, to EOS (what the workbench "
                                              "always sent)", _greedy))
DIALECTS.register("agentic", Dialect(
    "agentic", "sampled with seeds and top_p, stop sequences that fire, max_tokens that cuts, "
               "streamed and unstreamed, tool_choice modes", _agentic))
DIALECTS.register("clients", Dialect(
    "clients", "agentic sampling hot (temperature 1.5-2.0) plus top_logprobs, include_usage, "
               "parallel_tool_calls, response_format and ignore_eos", _clients))
