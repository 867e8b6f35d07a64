"""Shrink a failing trace to a minimal witness on a real deployment.

``shrink(traffic, target)`` plays candidate traces on ``target`` (a warm ``PDPair`` or a URL):
first ddmin over the requests (``workbench.search.ddmin``: a candidate fails if any of up to
``repeats`` plays flags a response; one that passes them all passes only with the confidence
the assumed failure rate gives, stated on the result), then each surviving request's optional
features are dropped one at a time (``stop``, ``tool_choice``, ``top_logprobs``, usage,
``response_format``, ``ignore_eos``) and kept out where the trace still fails, then the
arrival offsets are collapsed to zero if it still fails. ``witness_rate(witness, target, n)``
plays the witness ``n`` times (on a fresh deployment, to confirm it) and gives the failure rate
with its 95% Wilson interval. The witness is a ``Traffic``: ``Traffic.write`` saves it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import polars as pl

from workbench.drive import Traffic, TrafficRequest, play, wilson
from workbench.search.ddmin import ddmin

log = logging.getLogger(__name__)
OPTIONAL = ("stop", "tool_choice", "top_logprobs", "stream_options", "response_format",
            "ignore_eos", "parallel_tool_calls")
"""Body fields a witness may lose (each is a feature; the request stays valid without it)."""


@dataclass(frozen=True)
class ShrinkResult:
    """``witness`` fails on the deployment it was shrunk on (observed); ``minimal_confidence``
    is ddmin's probability that no single request of it can go, under ``assumed_fail_rate``
    with ``repeats`` plays per candidate; ``plays`` counts every trace played."""

    original: Traffic
    witness: Traffic
    plays: int
    repeats: int
    assumed_fail_rate: float
    minimal_confidence: float
    complete: bool
    dropped: tuple[str, ...]  # "request i: field" simplifications kept
    history: pl.DataFrame = dataclasses.field(compare=False, repr=False)

    def describe(self) -> str:
        return (f"witness of {len(self.witness)} request(s) from {len(self.original)}, "
                f"1-minimal with confidence {self.minimal_confidence:.3f} (each candidate "
                f"played up to {self.repeats} times, assumed failure rate "
                f"{self.assumed_fail_rate:g}); {self.plays} plays; features dropped: "
                f"{', '.join(self.dropped) or 'none'}")


@dataclass(frozen=True)
class WitnessRate:
    failed: int
    runs: int

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.failed, self.runs)

    def describe(self) -> str:
        lo, hi = self.interval
        return f"failed {self.failed} of {self.runs} plays (95% CI {lo:.2f}-{hi:.2f})"


def fails(target, traffic: Traffic) -> bool:
    """One play of ``traffic`` on ``target`` flags a response or loses one to an error."""
    df = play(target, traffic).requests
    return bool(len(df)) and bool(df["flagged"].any() or ((df["error"] != "") & ~df["killed"])
                                  .any())


def _still_fails(target, traffic: Traffic, repeats: int) -> tuple[bool, int]:
    for i in range(repeats):
        if fails(target, traffic):
            return True, i + 1
    return False, repeats


def _without(req: TrafficRequest, name: str) -> TrafficRequest | None:
    if name not in req.body:
        return None
    return dataclasses.replace(req, body={k: v for k, v in req.body.items() if k != name})


def _simplify(target, witness: Traffic, repeats: int) -> tuple[Traffic, list[str], int]:
    kept, dropped, plays = list(witness.requests), [], 0
    for i in range(len(kept)):
        for name in OPTIONAL:
            lighter = _without(kept[i], name)
            if lighter is None:
                continue
            trial = Traffic(tuple(kept[:i] + [lighter] + kept[i + 1:]))
            failed, n = _still_fails(target, trial, repeats)
            plays += n
            if failed:
                kept[i] = lighter
                dropped.append(f"request {i}: {name}")
    at_once = Traffic(tuple(dataclasses.replace(r, at_s=0.0) for r in kept))
    if any(r.at_s for r in kept):
        failed, n = _still_fails(target, at_once, repeats)
        plays += n
        if failed:
            return at_once, [*dropped, "timing"], plays
    return Traffic(tuple(kept)), dropped, plays


def shrink(traffic: Traffic, target, *, repeats: int = 3, assumed_fail_rate: float = 0.5,
           budget: int = 200, seed: int = 0, simplify: bool = True) -> ShrinkResult:
    """A minimal witness of ``traffic``'s failure on ``target``. Raises ValueError when the
    whole trace does not fail within ``repeats`` plays (nothing to shrink)."""
    items = [str(i) for i in range(len(traffic))]
    res = ddmin(items, lambda subset, _seed: fails(target, traffic.subset(
        {int(x) for x in subset})), repeats=repeats, assumed_fail_rate=assumed_fail_rate,
        budget=budget, seed=seed)
    witness = traffic.subset({int(x) for x in res.minimal})
    dropped, extra = [], 0
    if simplify:
        witness, dropped, extra = _simplify(target, witness, repeats)
    log.info("shrink: %d -> %d requests in %d plays", len(traffic), len(witness),
             res.trials_spent + extra)
    return ShrinkResult(traffic, witness, res.trials_spent + extra, repeats, assumed_fail_rate,
                        res.confidence, res.complete, tuple(dropped), res.history)


def witness_rate(witness: Traffic, target, runs: int = 5) -> WitnessRate:
    """How often ``witness`` fails in ``runs`` plays on ``target``."""
    return WitnessRate(sum(fails(target, witness) for _ in range(runs)), runs)
