"""Which token a position was computed from, read back from its layer-0 K.

Layer 0's K at a position is a function of that position's token, its predecessor and the
position alone (the two embeddings, the first norm and projection, the rotary rows), and it is
computed batch-invariantly, so the captured K names the input token the forward consumed: the one
candidate of the vocabulary whose layer-0 K at that position equals the captured row. When that
token is not the one the request holds at the position, the engine loop fed the forward another
request's token (the request's own tokens, and so its response, may still be right there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.dump import DumpKey
from engine.model import layers

RTOL = 1e-5  # the buffer diff's tolerance (workbench.observe.buffers.diff_against_reference)


@dataclass(frozen=True)
class InputMixup:
    """Position ``position`` of ``room`` was computed from token ``consumed``; the request holds
    ``held`` there."""

    room: int
    position: int
    held: int
    consumed: int

    def describe(self) -> str:
        return (f"room {self.room}: position {self.position} was computed from token "
                f"{self.consumed} (read back from its layer-0 K), the request holds {self.held} "
                "there: the forward was fed another token than the request's")


@torch.no_grad()
def consumed_token(model, k_row: torch.Tensor, prev: int, position: int) -> int | None:
    """The token whose layer-0 K at ``position`` after ``prev`` equals ``k_row`` (None: no
    candidate does, e.g. the corruption is not in the input)."""
    vocab = model.tok_emb.weight.shape[0]
    cand = torch.arange(vocab)
    x = layers.embed(model, cand, torch.full_like(cand, prev))
    a = layers.attn_inputs(model, model.layers[0], x, torch.full_like(cand, position), True)
    want = k_row.float().flatten()
    err = (a.k.float().flatten(1) - want).abs().amax(1) / want.abs().amax().clamp_min(1e-6)
    best = int(err.argmin())
    return best if float(err[best]) <= RTOL else None


def input_mixups(model, room: int, tokens: list[int], tensors: dict[str, torch.Tensor],
                 positions: list[int]) -> list[InputMixup]:
    """The ``positions`` (ones whose layer-0 K differs from the reference) that were computed
    from a token other than ``tokens[position]``."""
    k0 = tensors.get(str(DumpKey(0, "k")))
    out = []
    for p in positions:
        if k0 is None or not 0 < p < min(len(tokens), k0.shape[0]):
            continue
        got = consumed_token(model, k0[p], tokens[p - 1], p)
        if got is not None and got != tokens[p]:
            out.append(InputMixup(room, p, tokens[p], got))
    return out
