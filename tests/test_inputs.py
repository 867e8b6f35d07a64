"""Reading back the token a position was computed from, out of its layer-0 K."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.core.dump import DumpKey
from workbench.observe.buffers import ReferenceBuffers
from workbench.observe.inputs import consumed_token, input_mixups


def test_layer0_k_names_the_token_each_position_was_computed_from():
    refb = ReferenceBuffers(EngineConfig())
    model = refb.ref.model
    tokens = [1, 40, 41, 42, 43, 44, 45, 46]
    k0 = refb.buffers(tokens)[str(DumpKey(0, "k"))]
    assert [consumed_token(model, k0[p], tokens[p - 1], p) for p in range(1, 8)] == tokens[1:]
    fed = tokens[:5] + [77] + tokens[6:]  # the forward consumed 77 at position 5
    k_fed = refb.buffers(fed)[str(DumpKey(0, "k"))]
    tensors = {str(DumpKey(0, "k")): torch.cat([k0[:5], k_fed[5:6], k0[6:]])}
    mix = input_mixups(model, 9, tokens, tensors, [5])
    assert [(m.position, m.held, m.consumed) for m in mix] == [(5, 44, 77)]
    assert "computed from token 77" in mix[0].describe()
    noisy = {str(DumpKey(0, "k")): k0 * 1.01}  # corrupted values, not another input
    assert input_mixups(model, 9, tokens, noisy, [3, 5]) == []
