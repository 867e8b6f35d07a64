"""An oracle per request feature, from what the API returned and the greedy reference alone (no
engine internals), so they judge vLLM and attached deployments too.

- ``stop``: the content holds no stop string and is the reference's text up to the first
  occurrence of one (greedy requests; a sampled one has no reference text);
- ``length``: ``finish_reason`` is ``length`` exactly when the reference ran to ``max_tokens``
  without EOS (or EOS was ignored), and then exactly ``max_tokens`` tokens came back;
- ``text``: an answer's content is the reference's text (its start, where EOS was ignored);
- ``usage``: ``completion_tokens`` equals the tokens returned, ``prompt_tokens`` the prompt's;
- ``top1``: with ``top_logprobs``, each chosen greedy token is top-1 of its alternatives;
- ``seed``: a seeded sampled request gives the same tokens alone as in the burst
  (``workbench.drive.solo_seeded`` sets it after the burst).

Each is None where it does not apply; ``FeatureVerdict.failed`` names those that fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from engine.text import Tokenizer

ORACLES = ("stop", "length", "text", "usage", "top1", "seed")
"""The feature oracles, each a ``v_<name>_ok`` column of a load's requests table."""


@dataclass(frozen=True)
class FeatureVerdict:
    stop_ok: bool | None = None
    length_ok: bool | None = None
    text_ok: bool | None = None
    usage_ok: bool | None = None
    top1_ok: bool | None = None
    seed_ok: bool | None = None

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(f.name.removesuffix("_ok") for f in fields(self)
                     if getattr(self, f.name) is False)


def reference_text(tokens: Sequence[int], tokenizer: Tokenizer) -> list[str]:
    """Each reference token's text as the server renders content (EOS and control tokens
    empty)."""
    skip = set(tokenizer.control_ids) | {tokenizer.eos_id}
    return ["" if t in skip else tokenizer.token_text(t) for t in tokens]


def stop_cut(pieces: Sequence[str], stops: Sequence[str]) -> tuple[int, str] | None:
    """(tokens up to and including the one that completes the first stop match, the text
    before that match); None when the text never holds a stop string."""
    text = ""
    for i, piece in enumerate(pieces):
        text += piece
        hits = [j for s in stops if (j := text.find(s)) >= 0]
        if hits:
            return i + 1, text[:min(hits)]
    return None


def expected_tokens(ref: Sequence[int], pieces: Sequence[str], stops: Sequence[str],
                    ignore_eos: bool, eos_id: int) -> list[int]:
    """The reference's tokens as far as a server honouring ``stop`` and ``ignore_eos`` must
    agree with them: cut after the stop match; without the EOS (the server goes on past it)."""
    cut = stop_cut(pieces, stops) if stops else None
    out = list(ref[:cut[0]]) if cut else list(ref)
    return [t for t in out if t != eos_id] if ignore_eos else out


def stop_ok(content: str, pieces: Sequence[str], stops: Sequence[str],
            finish_reason: str | None) -> bool | None:
    if not stops:
        return None
    if any(s in content for s in stops):
        return False
    cut = stop_cut(pieces, stops)
    return None if cut is None else (content == cut[1] and finish_reason == "stop")


def length_ok(tokens: Sequence[int] | None, ref: Sequence[int], max_tokens: int,
              finish_reason: str | None, ignore_eos: bool, eos_id: int, stopped: bool) -> bool:
    """``stopped``: a stop string matched within the reference (the answer must end there)."""
    ended = finish_reason in ("stop", "tool_calls")
    if stopped:
        return ended
    if ignore_eos or (len(ref) >= max_tokens and eos_id not in ref[:max_tokens]):
        return finish_reason == "length" and tokens is not None and len(tokens) == max_tokens
    return ended


def text_ok(content: str, pieces: Sequence[str], ignore_eos: bool) -> bool:
    """An answer's content against the text of the reference tokens it must agree with."""
    want = "".join(pieces)
    return content.startswith(want) if ignore_eos else content == want


def usage_ok(usage: dict | None, tokens: Sequence[int] | None,
             prompt: Sequence[int] | None) -> bool | None:
    if not usage or tokens is None:
        return None
    prompt_agrees = prompt is None or usage.get("prompt_tokens") == len(prompt)
    return usage.get("completion_tokens") == len(tokens) and prompt_agrees


def top1_ok(chosen: Sequence[str], top: Sequence[Sequence[tuple[str, float]]]) -> bool | None:
    """Each chosen token is among its top alternatives with their highest logprob (a token
    sent without alternatives is not judged: our engine sends none for the prefill's token)."""
    if not top:
        return None
    for token, alts in zip(chosen, top, strict=False):
        if alts and (token, max(lp for _, lp in alts)) not in alts:
            return False
    return True
