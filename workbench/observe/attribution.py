"""Evidence past the buffers: whose request a room's dumps belong to, and whether the tokens a
request produced follow from its own (correct) buffers.

Two rules, both pure functions of what the dumps hold:

- ``room_conflict``: a room's prefill and decode dumps must carry one request (the identity each
  server writes into a dump's metadata, ``engine.core.dump.RequestIdentity``). When either side
  saw two requests name the room, or the two sides' dumps hold different prompts (or a prompt
  other than the one the client sent), the room carried two requests: comparing the dumps as one
  request would localize the difference of two prompts, so the room is attributed to the router
  / control plane (room assignment) instead.
- ``stream_departure``: the tokens a client received must be the ones its request's dump holds
  (the decode's output); a stream that carried other tokens was fed another request's (the engine
  loop's token bookkeeping, which hands each token to its request's stream).
- ``off_greedy``: with every buffer equal to the reference (the KV is right), each generated
  token must be the reference's greedy token after the request's own tokens so far (the load is
  greedy). The first one that is not is an ``OffGreedy``. ``attribute_tokens`` then tells the two
  components that choose tokens apart: when the token one room got is the one another flagged room
  was due at its own departure point, tokens went to the wrong request (the engine loop's
  bookkeeping); otherwise the sampler chose a token that is not the argmax of right logits. The
  dumps hold no logits, so a sampler bug that picks the argmax of wrong logits computed from
  right KV (e.g. a wrong lm-head row) also lands in SAMPLING; a handoff whose partner was not
  captured is reported as SAMPLING too (the partner's departure is the evidence it needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.dump import RequestIdentity


def room_conflict(room: int, prefill: RequestIdentity | None, decode: RequestIdentity | None,
                  sent: str | None = None) -> str:
    """'' when ``room``'s dumps carry one request; else the evidence, a sentence starting
    "room R carried two requests". ``sent``: the prompt hash the client sent (None: unknown)."""
    parts = []
    for side, ident in (("prefill", prefill), ("decode", decode)):
        if ident is not None and len(ident.room_requests) > 1:
            named = ", ".join(f"{rid} (prompt {h})" for rid, h in ident.room_requests)
            parts.append(f"the {side} saw {len(ident.room_requests)} requests name it: {named}")
    if prefill is not None and decode is not None and (
            prefill.prompt_hash != decode.prompt_hash or prefill.rid != decode.rid):
        parts.append(f"its prefill dump holds {prefill.rid} (prompt {prefill.prompt_hash}) and "
                     f"its decode dump {decode.rid} (prompt {decode.prompt_hash})")
    if sent is not None:
        other = [f"{side} {i.prompt_hash}" for side, i in (("prefill", prefill),
                                                           ("decode", decode))
                 if i is not None and i.prompt_hash != sent]
        if other:
            parts.append(f"the client sent prompt {sent}, the dumps hold {', '.join(other)}")
    return f"room {room} carried two requests: " + "; ".join(parts) if parts else ""


def shared_rooms(requests) -> list[str]:
    """The client's side of ``room_conflict``: rooms that more than one request of a load frame
    (``LoadResult.requests``: ``room``, ``started_at``, optionally ``prompt_hash``) was given,
    one sentence each. Rooms are 63 random bits, so a repeat is never chance."""
    if not len(requests) or "room" not in requests.columns:
        return []
    out = []
    rows = [r for r in requests.iter_rows(named=True) if r.get("room") is not None]
    by_room: dict[int, list[dict]] = {}
    for r in rows:
        by_room.setdefault(r["room"], []).append(r)
    for room, group in sorted(by_room.items(), key=lambda kv: -len(kv[1])):
        if len(group) < 2:
            continue
        starts = [r["started_at"] for r in group if r.get("started_at") is not None]
        span = f" within {max(starts) - min(starts):.2f} s" if len(starts) > 1 else ""
        prompts = sorted({r.get("prompt_hash") or "?" for r in group})
        out.append(f"room {room} carried two requests: {len(group)} client requests were given "
                   f"it{span} (prompts {', '.join(prompts)})")
    return out


def stream_departure(room: int, received: Sequence[int] | None, output: Sequence[int]) -> str:
    """'' when the tokens the client received agree with the decode's request's output over
    their common length (a stream cut short, or a stop token not streamed, is no departure);
    else the evidence: the stream carried tokens the request did not produce."""
    if received is None or not output:
        return ""
    for i, (got, held) in enumerate(zip(received, output, strict=False)):
        if got != held:
            return (f"room {room}: the client received token {got} at step {i}, the decode's "
                    f"request holds {held} there: the stream carried a token its request did "
                    "not produce")
    return ""


@dataclass(frozen=True, order=True)
class OffGreedy:
    """The first generated token of ``room`` that is not the reference's greedy choice after the
    request's own tokens: output index ``step`` (position ``position``), ``got`` vs ``want``."""

    room: int
    step: int
    position: int
    got: int
    want: int

    def describe(self) -> str:
        return (f"room {self.room}: generated token {self.step} (position {self.position}) is "
                f"{self.got}, the reference's greedy token after its own tokens is {self.want}")


def off_greedy(room: int, prompt: Sequence[int], output: Sequence[int],
               greedy) -> OffGreedy | None:
    """The first of ``output`` that departs from ``greedy(tokens)`` (the reference's argmax after
    each prefix of ``tokens``, e.g. ``ReferenceBuffers.greedy``) over prompt + output."""
    if not output or not prompt:
        return None
    tokens = [*prompt, *output[:-1]]
    want = greedy(tokens)
    base = len(prompt) - 1
    for j, got in enumerate(output):
        if want[base + j] != got:
            return OffGreedy(room, j, base + j, int(got), int(want[base + j]))
    return None


@dataclass(frozen=True)
class TokenAttribution:
    """``component``: ``"engine_loop"`` or ``"sampling"``; ``detail``: the evidence."""

    component: str
    detail: str


def attribute_tokens(found: Sequence[OffGreedy]) -> TokenAttribution | None:
    """Which component chose the off-greedy tokens of flagged rooms with right buffers (None:
    there are none). A handoff: two departing rooms each got the token the other was due (one
    direction alone is too weak: common tokens coincide)."""
    found = sorted(found)
    if not found:
        return None
    swaps = [(a, b) for i, a in enumerate(found) for b in found[i + 1:]
             if a.room != b.room and a.got == b.want and b.got == a.want]
    if swaps:
        a, b = swaps[0]
        return TokenAttribution("engine_loop", (
            f"tokens went to the wrong request: room {a.room} got token {a.got} at step "
            f"{a.step}, the token room {b.room} was due at its step {b.step}, and room {b.room} "
            f"got the {b.got} room {a.room} was due ({len(swaps)} such pair(s) in "
            f"{len(found)} rooms); every buffer of both equals the reference for their own "
            "tokens"))
    a = found[0]
    return TokenAttribution("sampling", (
        f"{a.describe()}; every buffer equals the reference, so the logits were right and the "
        f"chosen token is not their argmax ({len(found)} room(s) alike, no two holding each "
        "other's token)"))
