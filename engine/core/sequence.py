"""Request state: sampling parameters, tokens, page table, lifecycle."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"  # the client went away (or asked to stop)
    ERROR = "error"  # an internal failure ended it; ``Sequence.failure`` says which


class FailureKind(enum.Enum):
    ENGINE = "engine"  # the engine step raised
    PEER = "peer"  # a PD peer failed, reported failure or could not be reached
    TIMEOUT = "timeout"  # the KV transfer did not complete in time


@dataclass(frozen=True)
class Failure:
    """Why a request ended with ``FinishReason.ERROR`` (servers map ``kind`` to a status)."""

    kind: FailureKind
    message: str


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax, ties to the lowest id); otherwise seeded sampling."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # benchmarks: always generate max_tokens
    logprobs: int | None = None  # None: none; n >= 0: the sampled token's and the top n's

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        if not 0.0 <= self.temperature <= 2.0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError("temperature must be in [0, 2] and top_p in (0, 1]")
        if not -(2**63) <= self.seed < 2**64:
            raise ValueError("seed must be in [-2**63, 2**64)")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError("logprobs must be None or in 0..20")


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of a sampled token under the model's (untempered) distribution, and the
    ``top`` most likely tokens as ``(token, logprob)``, most likely first (ties: lower id)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    """One generated token (or the terminal event) delivered to a request's sink."""

    rid: str
    token: int | None
    finish_reason: FinishReason | None = None
    num_cached_tokens: int = 0
    logprob: TokenLogprob | None = None
    failure: Failure | None = None  # set on a terminal ``FinishReason.ERROR`` event


@dataclass(eq=False)
class Sequence:
    rid: str
    prompt: list[int]
    params: SamplingParams
    sink: Callable[[TokenEvent], None] = lambda ev: None
    output: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    arrival: float = field(default_factory=time.monotonic)
    generator: torch.Generator | None = None
    load_jobs: tuple = ()  # HiCache LoadJobs filling some of ``pages``
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when params.logprobs is set
    failure: Failure | None = None  # why it ended with ``FinishReason.ERROR``

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt)

    @property
    def max_total_tokens(self) -> int:
        return len(self.prompt) + self.params.max_tokens

    def rng(self, device: torch.device) -> torch.Generator:
        if self.generator is None:
            self.generator = torch.Generator(device=device).manual_seed(self.params.seed)
        return self.generator


def sample(logits: torch.Tensor, seq: Sequence, generator: torch.Generator | None = None) -> int:
    """logits [V] fp32 -> token id, deterministic for a given seed and call order; a sampled
    one draws from ``generator`` (None: the request's own, seeded by its ``seed``)."""
    p = seq.params
    if p.temperature == 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / p.temperature, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True, stable=True)
        keep = sorted_p.cumsum(-1) - sorted_p < p.top_p
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator or seq.rng(logits.device)).item())


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """logits [V] -> the sampled ``token``'s log-probability and the ``top`` best tokens."""
    lp = torch.log_softmax(logits.float(), dim=-1)  # [V]
    best: tuple[tuple[int, float], ...] = ()
    if top:
        vals, order = lp.sort(descending=True, stable=True)
        best = tuple((int(i), float(v)) for i, v in zip(order[:top], vals[:top], strict=True))
    return TokenLogprob(token, float(lp[token]), best)
